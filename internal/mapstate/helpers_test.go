package mapstate

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/labels/labelstest"
	"github.com/rampartnet/rampart/internal/policy"
)

// fullLabels builds an endpoint's full label set as the agent does (docs/architecture.md).
var fullLabels = labelstest.Full

// matchLabels builds a selector requiring each key=value.
var matchLabels = labelstest.Match

type world struct {
	alloc *identity.Allocator
	in    Input
}

func newWorld() *world {
	return &world{alloc: identity.NewAllocator()}
}

// endpoint adds an endpoint with the identity of its full labels.
func (w *world) endpoint(id uint32, ns, name, ip string, kv ...string) *Endpoint {
	l := fullLabels(ns, kv...)
	w.in.Endpoints = append(w.in.Endpoints, Endpoint{
		ID: id, Namespace: ns, Name: name, Labels: l,
		Identity: w.alloc.ForLabels(l), IP: netip.MustParseAddr(ip),
	})
	return &w.in.Endpoints[len(w.in.Endpoints)-1]
}

func (w *world) ep(ns, name string) *Endpoint {
	for i := range w.in.Endpoints {
		if w.in.Endpoints[i].Namespace == ns && w.in.Endpoints[i].Name == name {
			return &w.in.Endpoints[i]
		}
	}
	panic("no endpoint " + ns + "/" + name)
}

// rules sets the rules, numbering them from 1 in order unless they carry an ID, and
// allocates CIDR identities for their prefixes.
func (w *world) rules(rs ...policy.Rule) {
	for i := range rs {
		if rs[i].ID == 0 {
			rs[i].ID = uint32(i + 1)
		}
	}
	w.in.Rules = rs
	w.in.CIDRIdentities = map[netip.Prefix]identity.Identity{}
	for _, p := range Prefixes(rs) {
		w.in.CIDRIdentities[p] = w.alloc.ForCIDR(p)
	}
}

func (w *world) cidrID(t testing.TB, p string) identity.Identity {
	t.Helper()
	id, ok := w.in.CIDRIdentities[netip.MustParsePrefix(p)]
	if !ok {
		t.Fatalf("no CIDR identity for %s", p)
	}
	return id
}

func (w *world) compute(t testing.TB) State {
	t.Helper()
	if err := w.in.Check(); err != nil {
		t.Fatalf("input check: %v", err)
	}
	return Compute(w.in)
}

func cidrPeer(p string, except ...string) policy.Peer {
	pe := policy.Peer{Kind: policy.PeerCIDR, CIDR: netip.MustParsePrefix(p)}
	for _, e := range except {
		pe.Except = append(pe.Except, netip.MustParsePrefix(e))
	}
	return pe
}

func entityPeer(e string) policy.Peer { return policy.Peer{Kind: policy.PeerEntity, Entity: e} }

func endpointsPeer(s labels.Selector) policy.Peer {
	return policy.Peer{Kind: policy.PeerEndpoints, Selector: s}
}

func tcp(port uint16) policy.PortRule { return policy.PortRule{Protocol: policy.ProtoTCP, Port: port} }

// keysOf returns the identities present in an endpoint's entries for one direction.
func identitiesOf(pol EndpointPolicy, dir policy.Direction) map[identity.Identity]bool {
	out := map[identity.Identity]bool{}
	for k := range pol.Entries {
		if k.Direction == dir {
			out[k.Identity] = true
		}
	}
	return out
}

func sameIDs(got map[identity.Identity]bool, want ...identity.Identity) bool {
	if len(got) != len(want) {
		return false
	}
	for _, id := range want {
		if !got[id] {
			return false
		}
	}
	return true
}
