package cluster

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// compute parses a generated manifest and computes the server's policy as the agent does
// (the same pure packages), with a client and a server labelled app=clientApp and
// app=serverApp as endpoints.
func compute(t *testing.T, manifest []byte, clientApp, serverApp string) (mapstate.State, []policy.Rule, mapstate.Endpoint, mapstate.Endpoint) {
	t.Helper()
	pols, err := policy.ParseDocuments("generated", manifest)
	if err != nil {
		t.Fatalf("generated manifest does not parse: %v", err)
	}
	var rules []policy.Rule
	for _, p := range pols {
		for _, r := range p.Rules {
			r.ID = uint32(len(rules) + 1)
			rules = append(rules, r)
		}
	}
	alloc := identity.NewAllocator()
	mk := func(id uint32, name, app, ip string) mapstate.Endpoint {
		l := labels.Labels{
			"app":               app,
			labels.KeyNamespace: benchNamespace,
			labels.KeyNamespaceLabelPrefix + labels.KeyNamespaceName: benchNamespace,
			labels.KeyCluster: "default",
		}
		return mapstate.Endpoint{ID: id, Namespace: benchNamespace, Name: name, Labels: l,
			Identity: alloc.ForLabels(l), IP: netip.MustParseAddr(ip)}
	}
	client, server := mk(1, "client-00", clientApp, "198.18.7.10"), mk(2, "server-00", serverApp, "198.18.8.10")
	st := mapstate.Compute(mapstate.Input{
		Endpoints: []mapstate.Endpoint{client, server}, Rules: rules,
		HostIPs: []netip.Addr{netip.MustParseAddr("198.18.8.1")}, CIDRIdentities: map[netip.Prefix]identity.Identity{},
	})
	return st, rules, client, server
}

// The policies of the policy scalability experiment differ by port only, and only the
// last admits the measured traffic; each yields entries of its own.
func TestPoliciesManifestLastMatches(t *testing.T) {
	for _, n := range []int{1, 2, 10, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			m, err := policiesManifest(n)
			if err != nil {
				t.Fatal(err)
			}
			st, rules, client, server := compute(t, m, policyClientApp, policyServerApp)
			if len(rules) != n {
				t.Fatalf("%d rules, want %d", len(rules), n)
			}
			in := func(port int) mapstate.Decision {
				return mapstate.Lookup(st, server.ID, policy.Ingress, client.IP, policy.ProtoTCP, uint16(port))
			}
			for _, p := range []int{iperfPort, rrPort} {
				if d := in(p); d.Verdict != mapstate.Allowed || d.RuleID != rules[n-1].ID {
					t.Errorf("client -> server:%d: %s by rule %d, want allowed by the last rule %d", p, d.Verdict, d.RuleID, rules[n-1].ID)
				}
			}
			if d := in(closedPort); d.Verdict != mapstate.Denied {
				t.Errorf("client -> closed port: %s, want denied", d.Verdict)
			}
			if n > 1 {
				if d := in(fillerPortBase + 2*(n-2)); d.Verdict != mapstate.Allowed || d.RuleID != rules[n-2].ID {
					t.Errorf("client -> last filler port: %s by rule %d, want allowed by rule %d", d.Verdict, d.RuleID, rules[n-2].ID)
				}
			}
			if got := len(st.Endpoints[server.ID].Entries); got < n+1 {
				t.Errorf("server has %d policy entries, want at least %d", got, n+1)
			}
		})
	}
	if _, err := policiesManifest(MaxPolicies + 1); err == nil {
		t.Error("more than MaxPolicies accepted")
	}
}

// The pairs' policy admits TCP and UDP to the iperf3 port and nothing else.
func TestPairsPolicy(t *testing.T) {
	st, _, client, server := compute(t, pairsPolicy(), clientApp, serverApp)
	// The pairs and the policy experiment's pair share a cluster: neither's policies
	// select the other's server.
	if st, _, _, s := compute(t, pairsPolicy(), policyClientApp, policyServerApp); len(st.Endpoints[s.ID].Entries) != 0 {
		t.Errorf("the pairs' policy gives the policy server %d entries", len(st.Endpoints[s.ID].Entries))
	}
	m, err := policiesManifest(10)
	if err != nil {
		t.Fatal(err)
	}
	if st, _, _, s := compute(t, m, clientApp, serverApp); len(st.Endpoints[s.ID].Entries) != 0 {
		t.Errorf("the policy experiment's policies give a pair's server %d entries", len(st.Endpoints[s.ID].Entries))
	}
	for _, c := range []struct {
		proto policy.Protocol
		port  int
		want  mapstate.Verdict
	}{
		{policy.ProtoTCP, iperfPort, mapstate.Allowed},
		{policy.ProtoUDP, iperfPort, mapstate.Allowed},
		{policy.ProtoTCP, closedPort, mapstate.Denied},
	} {
		if d := mapstate.Lookup(st, server.ID, policy.Ingress, client.IP, c.proto, uint16(c.port)); d.Verdict != c.want {
			t.Errorf("proto %d port %d: %s, want %s", c.proto, c.port, d.Verdict, c.want)
		}
	}
}

func TestParseTraffic(t *testing.T) {
	for _, c := range []struct {
		in   string
		ok   bool
		frag bool // at MTU 1450
	}{{"tcp", true, false}, {"udp-1400", true, false}, {"udp-1422", true, false}, {"udp-1423", true, true}, {"udp-8000", true, true}, {"udp-x", false, false}, {"icmp", false, false}, {"udp-70000", false, false}} {
		tr, err := ParseTraffic(c.in)
		if (err == nil) != c.ok {
			t.Errorf("%s: error %v, want ok %v", c.in, err, c.ok)
			continue
		}
		if err == nil && tr.Fragments(1450) != c.frag {
			t.Errorf("%s: fragments at 1450 %v, want %v", c.in, tr.Fragments(1450), c.frag)
		}
	}
}
