package watcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/rampartnet/rampart/internal/agent"
)

// acceptedResource is the cluster's record of the last accepted version of each policy
// object (AcceptedPolicy, internal/k8s/crds).
var acceptedResource = schema.GroupVersionResource{Group: "rampart.io", Version: "v1alpha1", Resource: "acceptedpolicies"}

// acceptedName is the AcceptedPolicy name of the object of key: a hash, as a key holds
// characters a name may not.
func acceptedName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "ap-" + hex.EncodeToString(sum[:20])
}

// acceptedRecord reads an AcceptedPolicy: the object's key and its recorded version.
func acceptedRecord(u *unstructured.Unstructured) (string, agent.PolicyObject, error) {
	var o agent.PolicyObject
	var doc string
	for _, f := range []struct {
		field string
		to    *string
	}{{"kind", &o.Kind}, {"namespace", &o.Namespace}, {"name", &o.Name}, {"uid", &o.UID},
		{"resourceVersion", &o.ResourceVersion}, {"document", &doc}} {
		s, _, err := unstructured.NestedString(u.Object, "spec", f.field)
		if err != nil {
			return "", o, fmt.Errorf("AcceptedPolicy %s: spec.%s: %w", u.GetName(), f.field, err)
		}
		*f.to = s
	}
	o.Document = []byte(doc)
	key := objectKey(o.Kind, o.Namespace, o.Name)
	if o.Kind == "" || o.Name == "" || acceptedName(key) != u.GetName() {
		return "", o, fmt.Errorf("AcceptedPolicy %s: spec names %s, whose record is %s", u.GetName(), key, acceptedName(key))
	}
	return key, o, nil
}

// listAccepted fills v.Accepted from the cache.
func listAccepted(c *caches, v *agent.ClusterView) error {
	objs, err := c.accepted.List(k8slabels.Everything())
	if err != nil {
		return fmt.Errorf("listing accepted policies: %w", err)
	}
	v.Accepted = make(map[string]agent.PolicyObject, len(objs))
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		key, o, err := acceptedRecord(u)
		if err != nil {
			v.Problems = append(v.Problems, err.Error())
			continue
		}
		v.Accepted[key] = o
	}
	return nil
}

// recordAccepted writes the versions the agent keeps in force of refused objects
// (res.Record) as the cluster's records and deletes the records the agent no longer needs
// (res.Unrecord: the object is gone or its current version is accepted). Only refusals
// write, so a cluster whose policies all parse holds no records. A conflict means another
// node wrote first, and the next sync (the record's event asks for one) compares again.
// Best effort: a failed write is logged, the node's own state still holds the version.
func (w *Watcher) recordAccepted(ctx context.Context, res agent.SyncResult) {
	client := w.dyn.Resource(acceptedResource)
	for _, o := range res.Record {
		key := objectKey(o.Kind, o.Namespace, o.Name)
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": acceptedResource.GroupVersion().String(),
			"kind":       "AcceptedPolicy",
			"metadata":   map[string]any{"name": acceptedName(key)},
			"spec": map[string]any{"kind": o.Kind, "namespace": o.Namespace, "name": o.Name, "uid": o.UID,
				"resourceVersion": o.ResourceVersion, "document": string(o.Document)},
		}}
		var err error
		if cur, ok := w.acceptedRV(key); ok {
			u.SetResourceVersion(cur)
			_, err = client.Update(ctx, u, metav1.UpdateOptions{})
		} else {
			_, err = client.Create(ctx, u, metav1.CreateOptions{})
		}
		if err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			w.log.Warn("recording the accepted version of a policy object", "object", key, "error", err)
		}
	}
	for _, key := range res.Unrecord {
		err := client.Delete(ctx, acceptedName(key), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			w.log.Warn("deleting the record of a policy object's accepted version", "object", key, "error", err)
		}
	}
}

// acceptedRV is the resourceVersion of the record of key in the cache.
func (w *Watcher) acceptedRV(key string) (string, bool) {
	obj, err := w.cur.Load().accepted.Get(acceptedName(key))
	if err != nil {
		return "", false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", false
	}
	return u.GetResourceVersion(), true
}
