package datapath

import (
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
)

// tierEntry is an entry of a ClusterNetworkPolicy tier: admin (the Admin round) or not
// (Baseline, with the NetworkPolicy tier's entries), with its precedence.
func tierEntry(admin bool, id identity.Identity, port uint16, plen uint8, prec uint16, action string, rule uint32) entry {
	k, v := allow(id, in, tcp, port, plen, rule)
	k.Admin = admin
	v.Prec = prec
	v.Deny, v.Pass = action == "deny", action == "pass"
	return e(k, v)
}

// TestTierPrecedence: the dataplane combines ClusterNetworkPolicy entries as mapstate
// says: the Admin round decides on an Accept or a Deny, by precedence across the peer's,
// Any's and the flagged CIDR identity's lookups and across port prefixes; a Pass (or no
// Admin match) goes on to the other entries, where NetworkPolicy-tier entries (precedence
// 0) beat Baseline ones and a Pass is no decision.
func TestTierPrecedence(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(false, false,
		// idA: Admin accept on 80 at 5 and Admin deny of all TCP at 7: the longest match
		// (mapstate gives a longer entry the value of a better one covering it).
		tierEntry(true, idA, 80, 16, 5, "accept", 1),
		tierEntry(true, idA, 0, 0, 7, "deny", 2),
		// idPod: Admin deny at 7 for the pod, Admin accept at 3 for its network (flagged).
		tierEntry(true, idPod, 0, 0, 7, "deny", 3),
		tierEntry(true, flagged, 0, 0, 3, "accept", 4),
		// idB: Admin pass at 1, Admin deny at 4 for Any on 85; then a NetworkPolicy deny
		// on 81 and a Baseline accept (beaten by nothing else) on 82.
		tierEntry(true, idB, 0, 0, 1, "pass", 5),
		tierEntry(true, identity.Any, 85, 16, 4, "deny", 6),
		tierEntry(false, idB, 81, 16, 0, "deny", 7),
		tierEntry(false, idB, 82, 16, 9, "accept", 8),
		// world (cidr 198.18.1.6 has cidrID): Baseline pass at 1 before a Baseline deny of
		// Any at 2 on 90: no decision, and the endpoint does not enforce: allowed.
		tierEntry(false, cidrID, 90, 16, 1, "pass", 9),
		tierEntry(false, identity.Any, 90, 16, 2, "deny", 10),
	)
	f.expectPass("A:80 admin accept", f.toEp(f.synIn(ipA, 80)))
	f.expectDrop("A:81 admin deny", f.toEp(f.synIn(ipA, 81)), flow.ReasonPolicyDeny)
	f.expectPass("pod: its network's accept at 3 before its own deny at 7", f.toEp(f.synIn(ipPod, 80)))
	f.expectDrop("B:81 pass, then the NetworkPolicy deny", f.toEp(f.synIn(ipB, 81)), flow.ReasonPolicyDeny)
	f.expectPass("B:82 pass, then the baseline accept", f.toEp(f.synIn(ipB, 82)))
	f.expectPass("B:83 pass, no other entry: not enforced", f.toEp(f.synIn(ipB, 83)))
	f.expectPass("B:85 pass at 1 before the deny of Any at 4", f.toEp(f.synIn(ipB, 85)))
	f.expectDrop("world:85 Admin deny of Any", f.toEp(f.synIn(ipOut, 85)), flow.ReasonPolicyDeny)
	f.expectPass("cidr:90 baseline pass before the baseline deny", f.toEp(f.synIn(ipCIDR, 90)))
	f.expectDrop("world:90 baseline deny of Any", f.toEp(f.synIn(ipOut, 90)), flow.ReasonPolicyDeny)

	// The same state through mapstate.Lookup gives the same verdicts.
	st := mapstate.State{IPCache: fixtureIPCache(), Endpoints: map[uint32]mapstate.EndpointPolicy{epID: {Entries: entries(
		tierEntry(true, idA, 80, 16, 5, "accept", 1), tierEntry(true, idA, 0, 0, 7, "deny", 2),
		tierEntry(true, idPod, 0, 0, 7, "deny", 3), tierEntry(true, flagged, 0, 0, 3, "accept", 4),
		tierEntry(true, idB, 0, 0, 1, "pass", 5), tierEntry(true, identity.Any, 85, 16, 4, "deny", 6),
		tierEntry(false, idB, 81, 16, 0, "deny", 7), tierEntry(false, idB, 82, 16, 9, "accept", 8),
		tierEntry(false, cidrID, 90, 16, 1, "pass", 9), tierEntry(false, identity.Any, 90, 16, 2, "deny", 10),
	)}}}
	for _, c := range []struct {
		from string
		port uint16
		want mapstate.Verdict
	}{{"198.18.0.20", 80, mapstate.Allowed}, {"198.18.0.20", 81, mapstate.Denied}, {"198.18.1.5", 80, mapstate.Allowed}, {"198.18.0.30", 81, mapstate.Denied},
		{"198.18.0.30", 82, mapstate.Allowed}, {"198.18.0.30", 83, mapstate.Allowed}, {"198.18.0.30", 85, mapstate.Allowed},
		{"203.0.113.9", 85, mapstate.Denied}, {"198.18.1.6", 90, mapstate.Allowed},
		{"203.0.113.9", 90, mapstate.Denied}} {
		if d := mapstate.Lookup(st, epID, in, addr(c.from), tcp, c.port); d.Verdict != c.want {
			t.Errorf("mapstate.Lookup from %s to %d: %s, want %s as the dataplane", c.from, c.port, d.Verdict, c.want)
		}
	}
}
