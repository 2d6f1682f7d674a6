package mapstate

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// handState is a state built by hand, so Lookup is tested apart from Compute.
func handState() State {
	const peer, cidr = 300, identity.FirstCIDR + 1
	return State{
		IPCache: map[netip.Prefix]IPCacheEntry{
			netip.MustParsePrefix("0.0.0.0/0"):      {Identity: identity.World},
			netip.MustParsePrefix("10.0.0.0/8"):     {Identity: cidr},
			netip.MustParsePrefix("10.0.0.5/32"):    {Identity: peer, Secondary: cidr | identity.EndpointCIDRFlag},
			netip.MustParsePrefix("10.0.0.6/32"):    {Identity: peer},
			netip.MustParsePrefix("192.168.0.1/32"): {Identity: identity.Host},
		},
		Endpoints: map[uint32]EndpointPolicy{
			1: {EnforceIngress: true, Entries: map[Key]Value{
				{Identity: peer, Direction: policy.Ingress, Protocol: policy.ProtoTCP}:                                      {RuleID: 1},
				{Identity: peer, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 80, PortPrefixLen: 16}:         {Deny: true, RuleID: 2},
				{Identity: peer, Direction: policy.Ingress, Protocol: policy.ProtoUDP, Port: 64, PortPrefixLen: 10}:         {RuleID: 3},
				{Identity: identity.Any, Direction: policy.Ingress, Protocol: policy.ProtoUDP, Port: 99, PortPrefixLen: 16}: {Deny: true, RuleID: 4},
				{Identity: identity.Any, Direction: policy.Ingress, Protocol: policy.ProtoICMP, Port: 8, PortPrefixLen: 16}: {RuleID: 5},
				{Identity: cidr | identity.EndpointCIDRFlag, Direction: policy.Ingress, Protocol: policy.ProtoSCTP}:         {RuleID: 6},
				{Identity: cidr | identity.EndpointCIDRFlag, Direction: policy.Ingress, Protocol: policy.ProtoUDP}:          {Deny: true, RuleID: 7},
				{Identity: identity.Host, Direction: policy.Ingress}:                                                        {RuleID: 8},
				{Identity: cidr, Direction: policy.Ingress, Protocol: policy.ProtoTCP, Port: 22, PortPrefixLen: 16}:         {RuleID: 9},
				{Identity: identity.World, Direction: policy.Egress}:                                                        {Deny: true, RuleID: 10},
			}},
			2: {Entries: map[Key]Value{}},
		},
	}
}

func TestLookup(t *testing.T) {
	st := handState()
	a := netip.MustParseAddr
	cases := []struct {
		name    string
		ep      uint32
		dir     policy.Direction
		peer    string
		proto   policy.Protocol
		port    uint16
		verdict Verdict
		reason  Reason
		rule    uint32
	}{
		{"unknown endpoint fails closed", 9, policy.Ingress, "10.0.0.6", policy.ProtoTCP, 81, Denied, ReasonUnknownEndpoint, 0},
		{"peer allow, any port", 1, policy.Ingress, "10.0.0.6", policy.ProtoTCP, 81, Allowed, ReasonAllowedByRule, 1},
		{"longer deny wins the LPM", 1, policy.Ingress, "10.0.0.6", policy.ProtoTCP, 80, Denied, ReasonDeniedByRule, 2},
		{"port prefix lower bound", 1, policy.Ingress, "10.0.0.6", policy.ProtoUDP, 64, Allowed, ReasonAllowedByRule, 3},
		{"port prefix upper bound", 1, policy.Ingress, "10.0.0.6", policy.ProtoUDP, 127, Allowed, ReasonAllowedByRule, 3},
		{"outside port prefix", 1, policy.Ingress, "10.0.0.6", policy.ProtoUDP, 128, Denied, ReasonDefaultDeny, 0},
		{"deny for any identity beats peer allow", 1, policy.Ingress, "10.0.0.6", policy.ProtoUDP, 99, Denied, ReasonDeniedByRule, 4},
		{"icmp type via any", 1, policy.Ingress, "8.8.8.8", policy.ProtoICMP, 8, Allowed, ReasonAllowedByRule, 5},
		{"other icmp type", 1, policy.Ingress, "8.8.8.8", policy.ProtoICMP, 0, Denied, ReasonDefaultDeny, 0},
		{"secondary allow", 1, policy.Ingress, "10.0.0.5", policy.ProtoSCTP, 1, Allowed, ReasonAllowedByRule, 6},
		{"no secondary without it in ipcache", 1, policy.Ingress, "10.0.0.6", policy.ProtoSCTP, 1, Denied, ReasonDefaultDeny, 0},
		{"secondary deny beats peer allow", 1, policy.Ingress, "10.0.0.5", policy.ProtoUDP, 70, Denied, ReasonDeniedByRule, 7},
		{"host any protocol", 1, policy.Ingress, "192.168.0.1", 47, 0, Allowed, ReasonAllowedByRule, 8},
		{"plain CIDR identity for remote address", 1, policy.Ingress, "10.9.9.9", policy.ProtoTCP, 22, Allowed, ReasonAllowedByRule, 9},
		{"plain CIDR entry not used for endpoint address", 1, policy.Ingress, "10.0.0.5", policy.ProtoTCP, 22, Allowed, ReasonAllowedByRule, 1},
		{"egress not enforced", 1, policy.Egress, "10.0.0.6", policy.ProtoTCP, 80, Allowed, ReasonNoEnforcement, 0},
		{"deny applies without enforcement", 1, policy.Egress, "8.8.8.8", policy.ProtoTCP, 80, Denied, ReasonDeniedByRule, 10},
		{"no entries no enforcement", 2, policy.Ingress, "8.8.8.8", policy.ProtoTCP, 80, Allowed, ReasonNoEnforcement, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Lookup(st, c.ep, c.dir, a(c.peer), c.proto, c.port)
			if d.Verdict != c.verdict || d.Reason != c.reason || d.RuleID != c.rule {
				t.Fatalf("got %s/%s rule %d, want %s/%s rule %d", d.Verdict, d.Reason, d.RuleID, c.verdict, c.reason, c.rule)
			}
			if (d.Entry != nil) != (c.rule != 0) {
				t.Fatalf("entry %v with rule %d", d.Entry, d.RuleID)
			}
			if d.Entry != nil && st.Endpoints[c.ep].Entries[*d.Entry].RuleID != d.RuleID {
				t.Fatalf("deciding entry %+v does not hold rule %d", *d.Entry, d.RuleID)
			}
		})
	}
}

func TestLookupAllowOrderPrefersPeerIdentity(t *testing.T) {
	st := State{
		IPCache: map[netip.Prefix]IPCacheEntry{
			netip.MustParsePrefix("10.0.0.5/32"): {Identity: 300, Secondary: identity.FirstCIDR | identity.EndpointCIDRFlag},
		},
		Endpoints: map[uint32]EndpointPolicy{1: {Entries: map[Key]Value{
			{Identity: identity.FirstCIDR | identity.EndpointCIDRFlag, Direction: policy.Egress}: {RuleID: 1},
			{Identity: identity.Any, Direction: policy.Egress}:                                   {RuleID: 2},
			{Identity: 300, Direction: policy.Egress}:                                            {RuleID: 3},
		}}},
	}
	if d := Lookup(st, 1, policy.Egress, netip.MustParseAddr("10.0.0.5"), policy.ProtoTCP, 1); d.RuleID != 3 || d.Identity != 300 {
		t.Fatalf("got rule %d identity %d, want the peer identity's rule 3", d.RuleID, d.Identity)
	}
	delete(st.Endpoints[1].Entries, Key{Identity: 300, Direction: policy.Egress})
	if d := Lookup(st, 1, policy.Egress, netip.MustParseAddr("10.0.0.5"), policy.ProtoTCP, 1); d.RuleID != 2 {
		t.Fatalf("got rule %d, want the any-identity rule 2", d.RuleID)
	}
}

func TestLookupIPCache(t *testing.T) {
	st := handState()
	cases := map[string]struct {
		id     identity.Identity
		prefix string
	}{
		"10.0.0.5":        {300, "10.0.0.5/32"},
		"10.200.0.1":      {identity.FirstCIDR + 1, "10.0.0.0/8"},
		"11.0.0.1":        {identity.World, "0.0.0.0/0"},
		"::ffff:10.0.0.5": {300, "10.0.0.5/32"}, // IPv4-mapped is the IPv4 address
	}
	for addr, want := range cases {
		e, p := LookupIPCache(st.IPCache, netip.MustParseAddr(addr))
		if e.Identity != want.id || p != netip.MustParsePrefix(want.prefix) {
			t.Errorf("%s: identity %d prefix %v, want %d %s", addr, e.Identity, p, want.id, want.prefix)
		}
	}
	// No entry at all (an IPv6 address with no ::/0 here) resolves to World.
	if e, _ := LookupIPCache(st.IPCache, netip.MustParseAddr("2001:db8::1")); e.Identity != identity.World {
		t.Errorf("unmatched address got %d, want World", e.Identity)
	}
}
