package benchkit

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// PolicyWorld is the dataplane state the agent computes for a benchmark's manifests and
// its endpoints, built from the same pure packages the agent uses: the benchmarks' unit
// tests check with it that generated policies admit what their probes assume.
type PolicyWorld struct {
	State mapstate.State
	Rules []policy.Rule // of every policy, in order, with IDs from 1
	// Endpoints are the endpoints by app label, with IDs from 1 and addresses from .10 of
	// the pod range, in the order given.
	Endpoints map[string]mapstate.Endpoint
}

// ComputePolicyWorld parses manifest (read as from source) and computes the state for one
// endpoint per app, each labelled app=<app> in namespace, with addresses in pods (whose
// first address is the host's).
func ComputePolicyWorld(t testing.TB, source string, manifest []byte, namespace string, pods netip.Prefix, apps ...string) PolicyWorld {
	t.Helper()
	pols, err := policy.ParseDocuments(source, manifest)
	if err != nil {
		t.Fatalf("generated manifest does not parse: %v", err)
	}
	w := PolicyWorld{Endpoints: map[string]mapstate.Endpoint{}}
	for _, p := range pols {
		for _, r := range p.Rules {
			r.ID = uint32(len(w.Rules) + 1)
			w.Rules = append(w.Rules, r)
		}
	}
	alloc := identity.NewAllocator()
	in := mapstate.Input{
		Rules:          w.Rules,
		HostIPs:        []netip.Addr{HostAddr(pods, 1)},
		CIDRIdentities: map[netip.Prefix]identity.Identity{},
	}
	for i, app := range apps {
		l := labels.Labels{
			"app":               app,
			labels.KeyNamespace: namespace,
			labels.KeyNamespaceLabelPrefix + labels.KeyNamespaceName: namespace,
			labels.KeyCluster: "default",
		}
		ep := mapstate.Endpoint{ID: uint32(i + 1), Namespace: namespace, Name: app, Labels: l,
			Identity: alloc.ForLabels(l), IP: HostAddr(pods, uint32(10+i))}
		w.Endpoints[app] = ep
		in.Endpoints = append(in.Endpoints, ep)
	}
	for _, p := range mapstate.Prefixes(w.Rules) {
		in.CIDRIdentities[p] = alloc.ForCIDR(p)
	}
	w.State = mapstate.Compute(in)
	return w
}
