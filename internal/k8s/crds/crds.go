// Package crds holds the CustomResourceDefinitions of the Cilium policy kinds Rampart
// serves in Kubernetes mode (CiliumNetworkPolicy, CiliumClusterwideNetworkPolicy,
// CiliumCIDRGroup), of its cluster-wide identities (SecurityIdentity,
// SecurityIdentityClaim), of the flow tap kinds (TapContract, Antrea's TrafficControl) and
// of the cluster's record of accepted policy versions (AcceptedPolicy), and installs them.
// The definitions are deploy/crds/*.yaml (package deploy embeds them; they have no other
// copy); `kubectl apply -f deploy/crds/` installs the same.
package crds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/rampartnet/rampart/deploy"
)

// fieldManager owns the fields Install sets (server-side apply).
const fieldManager = "rampart"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Objects returns the CustomResourceDefinitions, sorted by name.
func Objects() ([]*unstructured.Unstructured, error) {
	files, err := fs.Sub(deploy.CRDs, "crds")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, name := range names {
		data, err := fs.ReadFile(files, name)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("decoding deploy/crds/%s: %w", name, err)
			}
			if obj == nil {
				continue
			}
			u := &unstructured.Unstructured{Object: obj}
			if u.GetKind() != "CustomResourceDefinition" || u.GetName() == "" {
				return nil, fmt.Errorf("deploy/crds/%s: want named CustomResourceDefinitions, found kind %q name %q", name, u.GetKind(), u.GetName())
			}
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// Install creates or updates every definition (server-side apply, so running it again, or
// after a change of the YAML, is safe) and waits until the API server reports each one
// Established, polling until ctx ends.
func Install(ctx context.Context, cfg *rest.Config) error {
	objs, err := Objects()
	if err != nil {
		return err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("installing CRDs: %w", err)
	}
	res := client.Resource(crdResource)
	for _, o := range objs {
		if _, err := res.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			return fmt.Errorf("installing CRD %s: %w", o.GetName(), err)
		}
	}
	for _, o := range objs {
		if err := waitEstablished(ctx, res, o.GetName()); err != nil {
			return err
		}
	}
	return nil
}

// waitEstablished polls the definition's conditions until Established is True (the API
// server then serves the kind). NamesAccepted False (a name taken by another definition)
// ends the wait with the server's message.
func waitEstablished(ctx context.Context, res dynamic.ResourceInterface, name string) error {
	var last string
	for {
		got, err := res.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				typ, _ := m["type"].(string)
				status, _ := m["status"].(string)
				msg, _ := m["message"].(string)
				switch {
				case typ == "Established" && status == "True":
					return nil
				case typ == "NamesAccepted" && status == "False":
					return fmt.Errorf("CRD %s: names not accepted: %s", name, msg)
				}
			}
			last = "not Established yet"
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for CRD %s to be Established (%s): %w", name, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
