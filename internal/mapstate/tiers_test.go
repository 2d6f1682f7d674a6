package mapstate

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/policy"
)

// tierRule is a ClusterNetworkPolicy rule of x/a's ingress for the tier tests.
func tierRule(t *testing.T, tier policy.Tier, prio int32, index int, action string, peers []policy.Peer, ports ...policy.PortRule) policy.Rule {
	t.Helper()
	return policy.Rule{
		Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, Tier: tier, Priority: prio, Index: index,
		Deny: action == "deny", Pass: action == "pass", Peers: peers, Ports: ports,
	}
}

// TestTiers: ClusterNetworkPolicy's evaluation order at x/a's ingress, from x/b
// (198.18.0.11) and x/c (198.18.0.12): the Admin tier by priority and rule order, across
// the dataplane's identity lookups (a pod and the network holding its address) and port
// prefixes; Pass on to the NetworkPolicy tier; the Baseline tier only where that tier does
// not isolate x/a.
func TestTiers(t *testing.T) {
	b := func(t *testing.T) []policy.Peer { return []policy.Peer{endpointsPeer(matchLabels(t, "pod", "b"))} }
	c := func(t *testing.T) []policy.Peer { return []policy.Peer{endpointsPeer(matchLabels(t, "pod", "c"))} }
	all := func(t *testing.T) []policy.Peer { return []policy.Peer{endpointsPeer(matchLabels(t))} }
	nets := []policy.Peer{cidrPeer("0.0.0.0/0")}
	npAllowB := func(t *testing.T) policy.Rule {
		return policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, EnableDefaultDeny: true, Peers: b(t)}
	}
	npIsolate := func(t *testing.T) policy.Rule {
		return policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, EnableDefaultDeny: true}
	}
	npDenyB := func(t *testing.T) policy.Rule {
		return policy.Rule{Subject: matchLabels(t, "pod", "a"), Direction: policy.Ingress, Deny: true, Peers: b(t)}
	}
	type probe struct {
		from string // b or c
		port uint16
		want Verdict
		tier string
	}
	cases := []struct {
		name   string
		rules  func(t *testing.T) []policy.Rule
		probes []probe
	}{
		{"admin deny beats a NetworkPolicy allow", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 10, 0, "deny", b(t)), npAllowB(t)}
		}, []probe{{"b", 80, Denied, "Admin"}, {"c", 80, Denied, ""}}},
		{"admin accept beats NetworkPolicy isolation and a Cilium deny", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 10, 0, "accept", b(t)), npIsolate(t), npDenyB(t)}
		}, []probe{{"b", 80, Allowed, "Admin"}, {"c", 80, Denied, ""}}},
		{"pass skips the admin rules after it", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 5, 0, "pass", b(t)), tierRule(t, policy.TierAdmin, 10, 0, "deny", all(t)), npAllowB(t)}
		}, []probe{{"b", 80, Allowed, ""}, {"c", 80, Denied, "Admin"}}},
		{"pass then NetworkPolicy isolation without an allow", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 5, 0, "pass", b(t)), npIsolate(t)}
		}, []probe{{"b", 80, Denied, ""}}},
		{"an earlier network rule beats a later pod rule across lookups", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 5, 0, "accept", nets), tierRule(t, policy.TierAdmin, 10, 0, "deny", b(t))}
		}, []probe{{"b", 80, Allowed, "Admin"}}},
		{"an earlier pod rule beats a later network rule", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 5, 0, "accept", b(t)), tierRule(t, policy.TierAdmin, 10, 0, "deny", nets)}
		}, []probe{{"b", 80, Allowed, "Admin"}, {"c", 80, Denied, "Admin"}}},
		{"rule order within one policy", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 5, 1, "accept", b(t)), tierRule(t, policy.TierAdmin, 5, 0, "deny", b(t), tcp(80))}
		}, []probe{{"b", 80, Denied, "Admin"}, {"b", 81, Allowed, "Admin"}}},
		{"an earlier rule on every port beats a later rule on one port", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 5, 0, "deny", b(t), policy.PortRule{Protocol: policy.ProtoTCP}), tierRule(t, policy.TierAdmin, 6, 0, "accept", b(t), tcp(80))}
		}, []probe{{"b", 80, Denied, "Admin"}, {"b", 81, Denied, "Admin"}}},
		{"baseline applies without NetworkPolicy isolation", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierBaseline, 5, 0, "accept", c(t)), tierRule(t, policy.TierBaseline, 10, 0, "deny", all(t))}
		}, []probe{{"b", 80, Denied, "Baseline"}, {"c", 80, Allowed, "Baseline"}}},
		{"NetworkPolicy isolation overrides baseline", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierBaseline, 5, 0, "deny", b(t)), tierRule(t, policy.TierBaseline, 6, 0, "accept", c(t)), npAllowB(t)}
		}, []probe{{"b", 80, Allowed, ""}, {"c", 80, Denied, ""}}},
		{"a baseline pass is no decision", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierBaseline, 1, 0, "pass", b(t)), tierRule(t, policy.TierBaseline, 2, 0, "deny", all(t))}
		}, []probe{{"b", 80, Allowed, ""}, {"c", 80, Denied, "Baseline"}}},
		{"admin pass then baseline", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierAdmin, 1, 0, "pass", all(t)), tierRule(t, policy.TierBaseline, 2, 0, "deny", b(t))}
		}, []probe{{"b", 80, Denied, "Baseline"}, {"c", 80, Allowed, ""}}},
		{"a Cilium deny beats a baseline accept", func(t *testing.T) []policy.Rule {
			return []policy.Rule{tierRule(t, policy.TierBaseline, 1, 0, "accept", b(t)), npDenyB(t)}
		}, []probe{{"b", 80, Denied, ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld()
			w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
			w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
			w.endpoint(3, "x", "c", "198.18.0.12", "pod", "c")
			w.rules(tc.rules(t)...)
			st := w.compute(t)
			for _, p := range tc.probes {
				peer := map[string]string{"b": "198.18.0.11", "c": "198.18.0.12"}[p.from]
				d := Lookup(st, 1, policy.Ingress, netip.MustParseAddr(peer), policy.ProtoTCP, p.port)
				if d.Verdict != p.want || d.Tier != p.tier {
					t.Errorf("from %s to port %d: %s (%s, tier %q), want %s (tier %q)\nentries: %v",
						p.from, p.port, d.Verdict, d.Reason, d.Tier, p.want, p.tier, fmt.Sprint(st.Endpoints[1].Entries))
				}
			}
		})
	}
}

// An endpoint that is the subject of a tier rule with a domainNames (FQDN) egress peer has
// its DNS observed, even before anything was learnt; others do not.
func TestDNSObserve(t *testing.T) {
	w := newWorld()
	w.endpoint(1, "x", "a", "198.18.0.10", "pod", "a")
	w.endpoint(2, "x", "b", "198.18.0.11", "pod", "b")
	sel, err := fqdn.NewSelector("", "**.example.com")
	if err != nil {
		t.Fatal(err)
	}
	r := tierRule(t, policy.TierAdmin, 1, 0, "accept", []policy.Peer{{Kind: policy.PeerFQDN, FQDN: sel}}, tcp(443))
	r.Direction = policy.Egress
	w.rules(r)
	st := w.compute(t)
	if !st.Endpoints[1].DNSObserve || st.Endpoints[2].DNSObserve {
		t.Errorf("DNSObserve: x/a %v, x/b %v; want true, false", st.Endpoints[1].DNSObserve, st.Endpoints[2].DNSObserve)
	}
}
