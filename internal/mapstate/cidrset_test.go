package mapstate

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

func groupPeer(name string) policy.Peer { return policy.Peer{Kind: policy.PeerCIDRGroup, Group: name} }

// setWorld: x/a may reach anything on egress except what CIDR set "threats" (index 5)
// lists; y/b admits TCP 80 only from set "partners" (index 0). "ghost" does not exist.
func setWorld(t *testing.T) (*world, State, map[string][]netip.Prefix) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "y", "b", "198.18.0.11", "pod", "b")
	w.in.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1")}
	w.rules(
		policy.Rule{ID: 1, Description: "spec.egress[0]", Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
			EnableDefaultDeny: true, Peers: []policy.Peer{entityPeer(policy.EntityAll)}},
		policy.Rule{ID: 2, Description: "spec.egressDeny[0]", Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress,
			Deny: true, EnableDefaultDeny: true, Peers: []policy.Peer{groupPeer("threats"), groupPeer("ghost")}},
		policy.Rule{ID: 3, Description: "spec.ingress[0]", Subject: matchLabels(t, "pod", "b"), Direction: policy.Ingress,
			EnableDefaultDeny: true, Peers: []policy.Peer{groupPeer("partners")}, Ports: []policy.PortRule{tcp(80)}},
	)
	w.in.RulePolicies = map[uint32]PolicyRef{2: {Kind: policy.KindCiliumNetworkPolicy, Namespace: "x", Name: "block"}}
	groups := map[string][]netip.Prefix{
		"threats":  {netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("198.51.100.7/32")},
		"partners": {netip.MustParsePrefix("198.18.0.0/28"), netip.MustParsePrefix("203.0.113.128/25")},
	}
	w.in.CIDRSets = map[string]uint8{"threats": 5, "partners": 0}
	w.in.CIDRSetMembership = membershipOf(groups, w.in.CIDRSets)
	return w, w.compute(t), groups
}

func TestCIDRSetPeers(t *testing.T) {
	w, st, _ := setWorld(t)
	a, b := w.ep("x", "a"), w.ep("y", "b")
	// The set identities appear in the policy keys, not in the ipcache.
	if !sameIDs(identitiesOf(st.Endpoints[a.ID], policy.Egress), identity.Any, identity.CIDRSet(5)) {
		t.Errorf("x/a egress identities = %v", identitiesOf(st.Endpoints[a.ID], policy.Egress))
	}
	if !sameIDs(identitiesOf(st.Endpoints[b.ID], policy.Ingress), identity.CIDRSet(0)) {
		t.Errorf("y/b ingress identities = %v", identitiesOf(st.Endpoints[b.ID], policy.Ingress))
	}
	for p, e := range st.IPCache {
		if _, ok := identity.IsCIDRSet(e.Identity); ok {
			t.Errorf("ipcache %v has set identity %d", p, e.Identity)
		}
	}
	member := w.in.CIDRSetMembership
	cases := []struct {
		ep   *Endpoint
		dir  policy.Direction
		peer string
		want Verdict
		rule uint32
	}{
		{a, policy.Egress, "203.0.113.9", Denied, 2},
		{a, policy.Egress, "198.51.100.7", Denied, 2},
		{a, policy.Egress, "198.51.100.8", Allowed, 1}, // the neighbour of a listed /32
		{a, policy.Egress, "8.8.8.8", Allowed, 1},
		{b, policy.Ingress, "198.18.0.10", Allowed, 3},   // an endpoint inside a set prefix
		{b, policy.Ingress, "203.0.113.200", Allowed, 3}, // in both sets: y/b has no deny
		{b, policy.Ingress, "203.0.113.9", Denied, 0},    // default deny
	}
	for _, c := range cases {
		peer := netip.MustParseAddr(c.peer)
		d := LookupSets(st, c.ep.ID, c.dir, peer, member(peer), policy.ProtoTCP, 80)
		if d.Verdict != c.want || d.RuleID != c.rule {
			t.Errorf("%s %s %s: got %s by rule %d, want %s by rule %d", c.ep.Name, c.dir, c.peer, d.Verdict, d.RuleID, c.want, c.rule)
		}
		// Without the membership the sets do not exist for Lookup.
		if plain := Lookup(st, c.ep.ID, c.dir, peer, policy.ProtoTCP, 80); c.rule == 2 && plain.Verdict != Allowed {
			t.Errorf("Lookup without sets denied %s", c.peer)
		}
	}
	if got := w.in.MissingCIDRGroups(); !slices.Equal(got, []string{"ghost"}) {
		t.Errorf("MissingCIDRGroups = %v", got)
	}
	if err := w.in.Check(); err != nil {
		t.Errorf("Check: %v (a missing group is not an error)", err)
	}
}

func TestCIDRSetCheck(t *testing.T) {
	w, _, _ := setWorld(t)
	w.in.CIDRSets = map[string]uint8{"threats": 5, "partners": 5, "big": 32}
	err := w.in.Check()
	if err == nil || !strings.Contains(err.Error(), `CIDR set "big" has index 32`) || !strings.Contains(err.Error(), `share index 5`) {
		t.Errorf("Check = %v", err)
	}
	// An index out of range selects nothing rather than panicking.
	st := Compute(w.in)
	for k := range st.Endpoints[w.ep("x", "a").ID].Entries {
		if k.Identity >= identity.FirstCIDRSet+MaxCIDRSets {
			t.Errorf("entry for identity %d", k.Identity)
		}
	}
}

func TestTraceCIDRSet(t *testing.T) {
	w, st, _ := setWorld(t)
	res, err := Trace(w.in, st, Query{From: TraceRef{Namespace: "x", Name: "a"}, To: TraceRef{Addr: netip.MustParseAddr("203.0.113.200")}, Protocol: policy.ProtoTCP, Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	eg := res.Egress
	if res.Verdict != Denied || eg == nil || eg.CIDRGroup != "threats" || eg.Rule == nil || eg.Rule.ID != 2 ||
		eg.Rule.Description != "spec.egressDeny[0]" || eg.Rule.Policy.Name != "block" ||
		eg.Decision.CIDRSets != 1<<5|1<<0 || eg.Decision.Entry.Identity != identity.CIDRSet(5) {
		t.Fatalf("egress check %+v", eg)
	}
	if !slices.Equal(res.To.CIDRGroups, []string{"partners", "threats"}) || len(res.From.CIDRGroups) != 1 || res.From.CIDRGroups[0] != "partners" {
		t.Errorf("groups of the ends: from %v to %v", res.From.CIDRGroups, res.To.CIDRGroups)
	}
	// Without a membership function nothing is in a set.
	w.in.CIDRSetMembership = nil
	res, err = Trace(w.in, st, Query{From: TraceRef{Namespace: "x", Name: "a"}, To: TraceRef{Addr: netip.MustParseAddr("203.0.113.200")}, Protocol: policy.ProtoTCP, Port: 443})
	if err != nil || res.Verdict != Allowed || res.Egress.CIDRGroup != "" || res.To.CIDRGroups != nil {
		t.Errorf("trace without membership: %+v, %v", res, err)
	}
}
