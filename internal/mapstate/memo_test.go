package mapstate

import (
	"math/rand"
	"reflect"
	"slices"
	"testing"
)

// sameMap reports whether two policies share one entries map (reused, not recomputed).
func sameMap(a, b EndpointPolicy) bool {
	return reflect.ValueOf(a.Entries).UnsafePointer() == reflect.ValueOf(b.Entries).UnsafePointer()
}

// ComputeWith must give exactly what Compute gives, whatever changed since the memo was
// made; and where only endpoints with existing label sets come and go, it must reuse the
// other endpoints' policies instead of computing them again.
func TestComputeWithMatchesCompute(t *testing.T) {
	g := &gen{rng: rand.New(rand.NewSource(*propSeed)), t: t}
	cases := *propCases
	if testing.Short() {
		cases /= 10
	}
	reusedCases := 0
	for c := 0; c < cases; c++ {
		_, in := g.world()
		st1, memo := ComputeWith(in, nil)
		next := in
		next.Endpoints = slices.Clone(in.Endpoints)
		replicaOnly := false
		switch g.pick(5) {
		case 0: // an endpoint goes
			i := g.pick(len(next.Endpoints))
			next.Endpoints = slices.Delete(next.Endpoints, i, i+1)
			replicaOnly = true
		case 1: // a replica of an endpoint comes (same labels, ports and identity)
			r := next.Endpoints[g.pick(len(next.Endpoints))]
			r.ID = 1000
			r.Name += "-replica"
			next.Endpoints = append(next.Endpoints, r)
			replicaOnly = true
		case 2: // an endpoint takes another's labels
			i, j := g.pick(len(next.Endpoints)), g.pick(len(next.Endpoints))
			next.Endpoints[i].Labels, next.Endpoints[i].Identity = next.Endpoints[j].Labels, next.Endpoints[j].Identity
		case 3: // a rule goes
			if len(next.Rules) > 0 {
				i := g.pick(len(next.Rules))
				next.Rules = slices.Delete(slices.Clone(next.Rules), i, i+1)
			}
		case 4: // an endpoint's named ports change
			i := g.pick(len(next.Endpoints))
			next.Endpoints[i].NamedPorts = map[string]NamedPort{"http": {Port: 8080, Protocol: 6}}
		}
		want := Compute(next)
		got, memo2 := ComputeWith(next, memo)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d (seed %d): ComputeWith differs from Compute\n%s", c, *propSeed, describe(&next, g.groups))
		}
		// With the environment as before (no identity, named port or rule came or went),
		// every remaining endpoint keeps its policy map.
		if replicaOnly && memo2.env.equal(&memo.env) {
			reusedCases++
			for _, ep := range next.Endpoints {
				if old, ok := st1.Endpoints[ep.ID]; ok && !sameMap(old, got.Endpoints[ep.ID]) {
					t.Fatalf("case %d: endpoint %d's policy computed again after a replica change", c, ep.ID)
				}
			}
		}
	}
	if reusedCases == 0 {
		t.Fatal("no case exercised reuse")
	}
}
