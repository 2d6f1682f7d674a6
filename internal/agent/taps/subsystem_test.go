package taps

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/labels"
)

// Compute reads the computed policy only for a tap policy that names exposed or talks,
// and compiles only when the facts changed: the same model with another policy state
// neither reads it nor compiles, and a relabel compiles.
func TestComputeCompilesOnTapInputs(t *testing.T) {
	s := New(Options{PodCIDR: netip.MustParsePrefix("10.0.0.0/24")})
	ep := func(app string) World {
		l := labels.Labels{"app": app}
		return World{Local: []Endpoint{
			{Key: "shop/db", Namespace: "shop", Name: "db", ID: 1, Labels: l, Full: l, IP: netip.MustParseAddr("10.0.0.2"),
				Ports: []Port{{Name: "pg", Port: 5432, Protocol: "TCP"}}},
			{Key: "sec/ids", Namespace: "sec", Name: "ids", ID: 2, Monitor: true, Labels: labels.Labels{"app": "ids"}, Full: labels.Labels{"app": "ids"}, IP: netip.MustParseAddr("10.0.0.3")},
		}}
	}
	reads := 0
	pol := func() Policy { reads++; return Policy{} }
	c := Config{Contracts: map[string]*Stored{}, Policy: &PolicyRecord{File: "t.mg",
		Source: `tap(S, "sec/ids", "ingress", "TCP", 5432, "mirror") :- label(S, "app", "db").`}}
	st, err := s.Compute(c, func() World { return ep("db") }, pol, nil)
	if err != nil || len(st.Compiled()) != 1 || len(st.res.Rules) != 1 {
		t.Fatalf("first computation: %v, %d contracts, %d rules", err, len(st.Compiled()), len(st.res.Rules))
	}
	n := s.Compilations()
	// Another policy state, the same model: what a policy change is to this tap policy.
	st2, err := s.Compute(c, func() World { return ep("db") }, pol, st)
	if err != nil || s.Compilations() != n || reads != 0 || st2.policy != st.policy {
		t.Errorf("a policy-only change: %v, %d compilations (want %d), policy read %d times", err, s.Compilations(), n, reads)
	}
	if _, err := s.Compute(c, func() World { return ep("web") }, pol, st2); err != nil || s.Compilations() != n+1 {
		t.Errorf("a relabel: %v, %d compilations, want %d", err, s.Compilations(), n+1)
	}
	// A policy that names exposed reads the policy state.
	c.Policy = &PolicyRecord{File: "t.mg", Source: `tap(S, "sec/ids", "ingress", "TCP", 5432, "mirror") :- label(S, "app", "db"), exposed(S).`}
	if _, err := s.Compute(c, func() World { return ep("db") }, pol, st2); err != nil || reads != 1 {
		t.Errorf("a policy reading exposed: %v, policy read %d times, want 1", err, reads)
	}
}
