package policy

import (
	"strings"
	"testing"
)

// The audit annotation puts every rule of a policy in audit mode; any other value, a
// non-policy object and a host policy are refused naming the annotation.
func TestAuditAnnotation(t *testing.T) {
	ps := parse(t, "audit.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: x, annotations: {policy.rampart.io/audit: "true", other: v}}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b, namespace: x, annotations: {policy.rampart.io/audit: "false"}}
spec: {endpointSelector: {}, ingress: [{}]}
`)
	if len(ps) != 2 || len(ps[0].Rules) != 2 || len(ps[1].Rules) == 0 {
		t.Fatalf("got %d policies", len(ps))
	}
	for _, r := range ps[0].Rules {
		if !r.Audit {
			t.Errorf("audited policy: rule %s not in audit mode", r.Description)
		}
	}
	for _, r := range ps[1].Rules {
		if r.Audit {
			t.Errorf(`audit "false": rule %s in audit mode`, r.Description)
		}
	}

	for _, c := range []struct{ name, src, want string }{
		{"value", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: x, annotations: {policy.rampart.io/audit: "yes"}}
spec: {podSelector: {}}
`, `metadata.annotations["policy.rampart.io/audit"] (line 3): must be "true" or "false", not "yes"`},
		{"group", `apiVersion: cilium.io/v2alpha1
kind: CiliumCIDRGroup
metadata: {name: g, annotations: {policy.rampart.io/audit: "true"}}
spec: {externalCIDRs: [198.18.0.0/24]}
`, `metadata.annotations["policy.rampart.io/audit"] (line 3): audit mode is for policies, not a CiliumCIDRGroup`},
		{"host", `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: h, annotations: {policy.rampart.io/audit: "true"}}
spec: {nodeSelector: {}, ingress: [{fromEntities: [world]}]}
`, `metadata.annotations["policy.rampart.io/audit"] (line 3): audit mode is not supported for host policy`},
	} {
		_, err := Parse(c.name+".yaml", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}
