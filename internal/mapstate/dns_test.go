package mapstate

import (
	"testing"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

func sel(t *testing.T, name, pattern string) fqdn.Selector {
	t.Helper()
	s, err := fqdn.NewSelector(name, pattern)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dnsWorld: x/a may ask x/dns on port 53 (ANY) for *.example.com; x/b may ask it anything
// through a plain allow of UDP 53 and also has a DNS rule for a.example.org on it; x/c may
// ask it for one name but a deny rule denies UDP 53 to it.
func dnsWorld(t *testing.T) (*world, State) {
	t.Helper()
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	w.endpoint(3, "x", "c", "198.18.0.12", "pod", "c")
	w.endpoint(4, "x", "dns", "198.18.0.53", "pod", "dns")
	dnsPeer := []policy.Peer{endpointsPeer(matchLabels(t, "pod", "dns"))}
	w.rules(
		policy.Rule{ID: 1, Subject: matchLabels(t, "pod", "a"), Direction: policy.Egress, EnableDefaultDeny: true, Peers: dnsPeer,
			Ports: []policy.PortRule{{Protocol: policy.ProtoAny, Port: 53, DNS: []fqdn.Selector{sel(t, "", "*.example.com")}}}},
		policy.Rule{ID: 2, Subject: matchLabels(t, "pod", "b"), Direction: policy.Egress, EnableDefaultDeny: true, Peers: dnsPeer,
			Ports: []policy.PortRule{{Protocol: policy.ProtoUDP, Port: 53, DNS: []fqdn.Selector{sel(t, "a.example.org", "")}}}},
		policy.Rule{ID: 3, Subject: matchLabels(t, "pod", "b"), Direction: policy.Egress, Peers: dnsPeer,
			Ports: []policy.PortRule{{Protocol: policy.ProtoUDP, Port: 53}}},
		policy.Rule{ID: 4, Subject: matchLabels(t, "pod", "c"), Direction: policy.Egress, EnableDefaultDeny: true, Peers: dnsPeer,
			Ports: []policy.PortRule{{Protocol: policy.ProtoUDP, Port: 53, DNS: []fqdn.Selector{sel(t, "a.example.org", "")}}}},
		policy.Rule{ID: 5, Subject: matchLabels(t, "pod", "c"), Direction: policy.Egress, Deny: true, Peers: dnsPeer,
			Ports: []policy.PortRule{{Protocol: policy.ProtoUDP, Port: 53}}},
	)
	return w, w.compute(t)
}

// DNS port rules yield DNS redirect entries for UDP and TCP (never SCTP), State.DNS lists
// what the proxy allows, a plain allow of the same port allows every name through the
// proxy, and a deny wins over the redirect.
func TestDNSRules(t *testing.T) {
	w, st := dnsWorld(t)
	dnsID := w.ep("x", "dns").Identity
	a := st.Endpoints[1].Entries
	for _, proto := range []policy.Protocol{policy.ProtoUDP, policy.ProtoTCP} {
		k := Key{Identity: dnsID, Direction: policy.Egress, Protocol: proto, Port: 53, PortPrefixLen: 16}
		if v := a[k]; !v.Redirect || !v.DNS || v.RuleID != 1 {
			t.Errorf("x/a %v: %+v, want a DNS redirect of rule 1", k, v)
		}
	}
	if v, ok := a[Key{Identity: dnsID, Direction: policy.Egress, Protocol: policy.ProtoSCTP, Port: 53, PortPrefixLen: 16}]; ok {
		t.Errorf("x/a has an SCTP entry %+v: DNS over ANY means UDP and TCP", v)
	}
	ids := []identity.Identity{dnsID, identity.Any}
	rs := DNSFor(st, 1, policy.ProtoUDP, 53, ids)
	if len(rs) != 1 || len(rs[0].Selectors) != 1 || rs[0].Selectors[0].String() != "matchPattern:*.example.com" {
		t.Fatalf("x/a UDP 53 rules: %+v", rs)
	}
	if !rs[0].Selectors[0].Matches("www.example.com") || rs[0].Selectors[0].Matches("www.example.org") {
		t.Error("x/a's selector matches the wrong names")
	}
	if rs := DNSFor(st, 1, policy.ProtoUDP, 53, []identity.Identity{identity.World}); len(rs) != 0 {
		t.Errorf("x/a may ask world: %+v", rs)
	}
	// x/b: rule 2 (DNS) and rule 3 (plain) on the same key: a DNS redirect, rule 3 allows
	// every name.
	kb := Key{Identity: dnsID, Direction: policy.Egress, Protocol: policy.ProtoUDP, Port: 53, PortPrefixLen: 16}
	if v := st.Endpoints[2].Entries[kb]; !v.Redirect || !v.DNS {
		t.Errorf("x/b: %+v, want a DNS redirect", v)
	}
	allowsAll := false
	for _, r := range DNSFor(st, 2, policy.ProtoUDP, 53, ids) {
		for _, s := range r.Selectors {
			allowsAll = allowsAll || s.MatchesAll() && r.RuleID == 3
		}
	}
	if !allowsAll {
		t.Errorf("x/b: the plain allow of rule 3 does not allow every name: %+v", DNSFor(st, 2, policy.ProtoUDP, 53, ids))
	}
	// x/c: denied, no redirect and nothing for the proxy.
	if v := st.Endpoints[3].Entries[kb]; !v.Deny || v.DNS || v.Redirect {
		t.Errorf("x/c: %+v, want the deny", v)
	}
	if rs := DNSFor(st, 3, policy.ProtoUDP, 53, ids); len(rs) != 0 {
		t.Errorf("x/c has DNS rules under a deny: %+v", rs)
	}
	// No HTTP L7 rules come from DNS redirects.
	if len(st.L7) != 0 {
		t.Errorf("L7 rules from DNS ports: %+v", st.L7)
	}
}
