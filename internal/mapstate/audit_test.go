package mapstate

import (
	"reflect"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
)

// A policy in audit mode changes no enforced entry or flag: the endpoints it selects get
// an Audit policy (the one they would have with it enforced) beside the unchanged one, and
// the trace reports what it would drop, naming its rule or, for a default deny, it.
func TestAuditPolicies(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "y", "b", "198.18.0.11", "pod", "b")
	w.endpoint(3, "y", "c", "198.18.0.12", "pod", "c")
	enforced := []policy.Rule{
		// y/b: default deny ingress, allow TCP 80 from namespace x.
		{ID: 11, Description: "ingress[0]", Subject: matchLabels(t, "pod", "b"),
			Direction: policy.Ingress, EnableDefaultDeny: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, labels.KeyNamespace, "x"))}, Ports: []policy.PortRule{tcp(80)}},
	}
	w.rules(enforced...)
	w.in.RulePolicies = map[uint32]PolicyRef{
		11: {Kind: policy.KindNetworkPolicy, Namespace: "y", Name: "allow-x"},
		21: {Kind: policy.KindNetworkPolicy, Namespace: "y", Name: "audit-isolate"},
		31: {Kind: policy.KindCiliumNetworkPolicy, Namespace: "y", Name: "audit-deny"},
		41: {Kind: policy.KindCiliumNetworkPolicy, Namespace: "y", Name: "audit-allow"},
	}
	before := w.compute(t)

	audited := []policy.Rule{
		// Would isolate every pod of y (ingress): y/c enforces nothing today.
		{ID: 21, Description: "ingress[0]", Subject: matchLabels(t, labels.KeyNamespace, "y"),
			Direction: policy.Ingress, EnableDefaultDeny: true, Audit: true},
		// Would deny TCP 80 from x to y/b, which allow-x allows.
		{ID: 31, Description: "specs[0].ingressDeny[0]", Subject: matchLabels(t, "pod", "b"),
			Direction: policy.Ingress, Deny: true, Audit: true,
			Peers: []policy.Peer{endpointsPeer(matchLabels(t, labels.KeyNamespace, "x"))}, Ports: []policy.PortRule{tcp(80)}},
		// Would allow TCP 81 into y/b, which no enforced rule allows: audit never
		// widens what is enforced.
		{ID: 41, Description: "specs[0].ingress[0]", Subject: matchLabels(t, "pod", "b"),
			Direction: policy.Ingress, Audit: true, AllPeers: true, Ports: []policy.PortRule{tcp(81)}},
	}
	w.rules(append(append([]policy.Rule{}, enforced...), audited...)...)
	st := w.compute(t)

	for id, pol := range st.Endpoints {
		was := before.Endpoints[id]
		got := pol
		got.Audit = nil
		if !reflect.DeepEqual(got, was) {
			t.Errorf("endpoint %d: the enforced policy changed with audited rules:\n%+v\nwant\n%+v", id, got, was)
		}
	}
	if st.Endpoints[1].Audit != nil {
		t.Errorf("x/a, selected by no audited rule, has an audit policy")
	}
	for _, id := range []uint32{2, 3} {
		if a := st.Endpoints[id].Audit; a == nil || !a.EnforceIngress {
			t.Fatalf("endpoint %d: audit policy %+v, want one enforcing ingress", id, a)
		}
	}

	trace := func(to string, port uint16) *TraceCheck {
		t.Helper()
		res, err := Trace(w.in, st, Query{From: TraceRef{Namespace: "x", Name: "a"}, To: TraceRef{Namespace: "y", Name: to}, Protocol: policy.ProtoTCP, Port: port})
		if err != nil {
			t.Fatal(err)
		}
		if res.Ingress == nil {
			t.Fatalf("no ingress check to y/%s", to)
		}
		return res.Ingress
	}
	// Allowed by allow-x, would be denied by audit-deny.
	c := trace("b", 80)
	if c.Decision.Verdict != Allowed || c.Audit == nil || c.Audit.Decision.Reason != ReasonDeniedByRule ||
		c.Audit.Rule == nil || c.Audit.Rule.Policy.Name != "audit-deny" {
		t.Errorf("x/a -> y/b:80: %+v audit %+v", c.Decision, c.Audit)
	}
	// Not enforced at y/c; would be default-denied by audit-isolate.
	c = trace("c", 80)
	if c.Decision.Verdict != Allowed || c.Audit == nil || c.Audit.Decision.Reason != ReasonDefaultDeny ||
		!reflect.DeepEqual(c.Audit.DefaultDenyBy, []PolicyRef{w.in.RulePolicies[21]}) {
		t.Errorf("x/a -> y/c:80: %+v audit %+v", c.Decision, c.Audit)
	}
	// Denied (default deny of allow-x): enforced drops are not audit reports.
	c = trace("b", 81)
	if c.Decision.Verdict != Denied || c.Audit != nil ||
		!reflect.DeepEqual(c.DefaultDenyBy, []PolicyRef{w.in.RulePolicies[11]}) {
		t.Errorf("x/a -> y/b:81: %+v audit %+v default deny by %v", c.Decision, c.Audit, c.DefaultDenyBy)
	}
}

// An endpoint in audit mode enforces none of the rules that apply to it, and its audit
// policy holds all of them.
func TestAuditEndpoint(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "y", "b", "198.18.0.11", "pod", "b").Audit = true
	w.rules(policy.Rule{ID: 11, Description: "ingress[0]", Subject: matchLabels(t, labels.KeyNamespace, "y"),
		Direction: policy.Ingress, EnableDefaultDeny: true,
		Peers: []policy.Peer{endpointsPeer(matchLabels(t, "pod", "a"))}, Ports: []policy.PortRule{tcp(80)}})
	w.in.RulePolicies = map[uint32]PolicyRef{11: {Kind: policy.KindNetworkPolicy, Namespace: "y", Name: "isolate"}}
	st := w.compute(t)
	pol := st.Endpoints[2]
	if pol.EnforceIngress || len(pol.Entries) != 0 || pol.Audit == nil || !pol.Audit.EnforceIngress || len(pol.Audit.Entries) == 0 {
		t.Fatalf("endpoint in audit mode: %+v audit %+v", pol, pol.Audit)
	}
	res, err := Trace(w.in, st, Query{From: TraceRef{Namespace: "x", Name: "a"}, To: TraceRef{Namespace: "y", Name: "b"}, Protocol: policy.ProtoTCP, Port: 81})
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Allowed || res.Ingress.Audit == nil || res.Ingress.Audit.Decision.Reason != ReasonDefaultDeny ||
		!reflect.DeepEqual(res.Ingress.Audit.DefaultDenyBy, []PolicyRef{w.in.RulePolicies[11]}) {
		t.Errorf("trace: %+v audit %+v", res, res.Ingress.Audit)
	}
}
