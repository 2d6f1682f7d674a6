package crds

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The embedded definitions are the three Cilium policy kinds, Rampart's two identity
// kinds and the two tap kinds (TapContract, Antrea's TrafficControl), with the scopes,
// versions and storage version Rampart serves; installing them against a real API server
// is tested in test/cluster.
func TestObjects(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		kind, scope, storage string
		served               []string
	}{
		"acceptedpolicies.rampart.io":                     {"AcceptedPolicy", "Cluster", "v1alpha1", []string{"v1alpha1"}},
		"clusternetworkpolicies.policy.networking.k8s.io": {"ClusterNetworkPolicy", "Cluster", "v1beta1", []string{"v1alpha2", "v1beta1"}},
		"ciliumcidrgroups.cilium.io":                      {"CiliumCIDRGroup", "Cluster", "v2", []string{"v2", "v2alpha1"}},
		"ciliumclusterwidenetworkpolicies.cilium.io":      {"CiliumClusterwideNetworkPolicy", "Cluster", "v2", []string{"v2"}},
		"ciliumnetworkpolicies.cilium.io":                 {"CiliumNetworkPolicy", "Namespaced", "v2", []string{"v2"}},
		"securityidentities.rampart.io":                   {"SecurityIdentity", "Cluster", "v1alpha1", []string{"v1alpha1"}},
		"securityidentityclaims.rampart.io":               {"SecurityIdentityClaim", "Cluster", "v1alpha1", []string{"v1alpha1"}},
		"tapcontracts.rampart.io":                         {"TapContract", "Cluster", "v1alpha1", []string{"v1alpha1"}},
		"trafficcontrols.crd.antrea.io":                   {"TrafficControl", "Cluster", "v1alpha2", []string{"v1alpha2"}},
	}
	if len(objs) != len(want) {
		t.Fatalf("%d definitions, want %d", len(objs), len(want))
	}
	for _, o := range objs {
		w, ok := want[o.GetName()]
		if !ok {
			t.Errorf("unexpected definition %s", o.GetName())
			continue
		}
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		scope, _, _ := unstructured.NestedString(o.Object, "spec", "scope")
		if kind != w.kind || scope != w.scope {
			t.Errorf("%s: kind %s scope %s, want %s %s", o.GetName(), kind, scope, w.kind, w.scope)
		}
		versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
		var served []string
		storage := ""
		for _, v := range versions {
			m := v.(map[string]any)
			if m["served"] == true {
				served = append(served, m["name"].(string))
			}
			if m["storage"] == true {
				storage = m["name"].(string)
			}
			if _, ok, _ := unstructured.NestedMap(m, "schema", "openAPIV3Schema"); !ok {
				t.Errorf("%s %s: no schema", o.GetName(), m["name"])
			}
		}
		if storage != w.storage || !slices.Equal(served, w.served) {
			t.Errorf("%s: served %v storage %s, want %v %s", o.GetName(), served, storage, w.served, w.storage)
		}
	}
}
