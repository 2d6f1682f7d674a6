package watcher

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// An AcceptedPolicy is read back as the version recorded, under its object's key; one
// whose name is not its object's (written by hand, or for another object) is refused with
// both names, not taken for the object its spec names.
func TestAcceptedRecord(t *testing.T) {
	rec := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": name},
			"spec": map[string]any{"kind": "CiliumNetworkPolicy", "namespace": "x", "name": "p", "uid": "u",
				"resourceVersion": "7", "document": "{}"},
		}}
	}
	key := objectKey("CiliumNetworkPolicy", "x", "p")
	got, o, err := acceptedRecord(rec(acceptedName(key)))
	if err != nil || got != key || o.UID != "u" || o.ResourceVersion != "7" || string(o.Document) != "{}" {
		t.Errorf("record: key %q, %+v, %v", got, o, err)
	}
	if acceptedName(key) == acceptedName(objectKey("CiliumNetworkPolicy", "x", "q")) || len(acceptedName(key)) > 63 {
		t.Errorf("name %q: want one per object, a valid name", acceptedName(key))
	}
	if _, _, err := acceptedRecord(rec("ap-other")); err == nil || !strings.Contains(err.Error(), "ap-other") || !strings.Contains(err.Error(), acceptedName(key)) {
		t.Errorf("misnamed record: %v, want refused naming both", err)
	}
}
