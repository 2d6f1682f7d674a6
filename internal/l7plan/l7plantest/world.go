// Package l7plantest builds the policy states the tests of the L7 plan and of what is made
// from it (Envoy resources, send-side tables) work on: a small world of endpoints from the
// Star Wars demo, and random rule sets over it.
package l7plantest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/labels/labelstest"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// Sel is the selector of the given key, value pairs.
func Sel(t testing.TB, kv ...string) labels.Selector {
	t.Helper()
	return labelstest.Match(t, kv...)
}

// EndpointsRule is a rule in direction dir of the endpoints subject selects, with default
// deny, that allows the endpoints peer selects on ports.
func EndpointsRule(dir policy.Direction, subject, peer labels.Selector, ports []policy.PortRule) policy.Rule {
	return policy.Rule{Subject: subject, Direction: dir, EnableDefaultDeny: true,
		Peers: []policy.Peer{{Kind: policy.PeerEndpoints, Selector: peer}}, Ports: ports}
}

// World is a set of endpoints and the identities given to them.
type World struct {
	Alloc *identity.Allocator
	In    mapstate.Input
}

// NewWorld makes the endpoints: two empire tiefighters (198.18.0.10, .11), the deathstar
// (.20), an alliance xwing (.30) and a storage server (.40), ids 1 to 5 in that order.
func NewWorld() *World {
	w := &World{Alloc: identity.NewAllocator()}
	w.In.HostIPs = []netip.Addr{netip.MustParseAddr("198.18.0.1")}
	for i, e := range []struct{ name, ip, org, class string }{
		{"tiefighter", "198.18.0.10", "empire", "tiefighter"},
		{"tiefighter2", "198.18.0.11", "empire", "tiefighter"},
		{"deathstar", "198.18.0.20", "empire", "deathstar"},
		{"xwing", "198.18.0.30", "alliance", "xwing"},
		{"storage", "198.18.0.40", "empire", "storage"},
	} {
		l := labelstest.Full("sw", "org", e.org, "class", e.class)
		w.In.Endpoints = append(w.In.Endpoints, mapstate.Endpoint{
			ID: uint32(i + 1), Namespace: "sw", Name: e.name, Labels: l,
			Identity: w.Alloc.ForLabels(l), IP: netip.MustParseAddr(e.ip),
		})
	}
	return w
}

// Compute is the desired state of the world under rules (numbered from 1 in order).
func (w *World) Compute(t testing.TB, rules ...policy.Rule) mapstate.State {
	t.Helper()
	for i := range rules {
		rules[i].ID = uint32(i + 1)
		rules[i].Description = fmt.Sprintf("rule %d", i+1)
	}
	w.In.Rules = rules
	w.In.CIDRIdentities = map[netip.Prefix]identity.Identity{}
	for _, p := range mapstate.Prefixes(rules) {
		w.In.CIDRIdentities[p] = w.Alloc.ForCIDR(p)
	}
	return mapstate.Compute(w.In)
}

// L7Port is TCP port with the HTTP rules.
func L7Port(port uint16, http ...policy.HTTPRule) []policy.PortRule {
	return []policy.PortRule{{Protocol: policy.ProtoTCP, Port: port, HTTP: http}}
}

// RandomRules returns one to six rules over the world's endpoints: ingress or egress, on
// ports 80 or 8080 or all ports, peers by label, CIDR or all, plain allows, denies and
// HTTP rules (methods, paths, hosts, headers).
func RandomRules(t testing.TB, rng *rand.Rand) []policy.Rule {
	t.Helper()
	classes := []string{"tiefighter", "deathstar", "xwing", "storage"}
	httpRules := [][]policy.HTTPRule{
		nil,
		{{}},
		{{Method: "GET", Path: "/v1"}},
		{{Method: "POST|PUT", Path: "/v1/.*"}, {Host: "storage"}},
		{{Headers: []policy.HeaderMatch{{Name: "x-token"}}}},
		{{Path: "/storage/log", Headers: []policy.HeaderMatch{{Name: "X-Token", Value: "luke"}}}},
	}
	cidrs := []string{"0.0.0.0/0", "198.18.0.0/24", "198.18.0.16/28", "192.0.2.0/24", "198.18.0.30/32"}
	var rules []policy.Rule
	for range 1 + rng.IntN(6) {
		r := policy.Rule{
			Subject:           Sel(t, "class", classes[rng.IntN(len(classes))]),
			Direction:         policy.Direction(1 + rng.IntN(2)),
			EnableDefaultDeny: rng.IntN(4) != 0,
		}
		switch rng.IntN(4) {
		case 0:
			r.AllPeers = true
		case 1:
			r.Peers = []policy.Peer{{Kind: policy.PeerCIDR, CIDR: netip.MustParsePrefix(cidrs[rng.IntN(len(cidrs))]).Masked()}}
		default:
			r.Peers = []policy.Peer{{Kind: policy.PeerEndpoints, Selector: Sel(t, "class", classes[rng.IntN(len(classes))])}}
		}
		port := []uint16{80, 8080}[rng.IntN(2)]
		switch rng.IntN(5) {
		case 0:
			r.Deny = true
			r.Ports = []policy.PortRule{{Protocol: policy.ProtoTCP, Port: port}}
		case 1:
			// all ports
		case 2:
			r.Ports = []policy.PortRule{{Protocol: policy.ProtoTCP, Port: port}}
		default:
			h := httpRules[rng.IntN(len(httpRules))]
			if h == nil {
				h = []policy.HTTPRule{{}}
			}
			r.Ports = L7Port(port, h...)
		}
		rules = append(rules, r)
	}
	return rules
}
