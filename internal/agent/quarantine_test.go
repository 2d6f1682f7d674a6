package agent

import (
	"net/netip"
	"testing"
)

// A quarantined address gets its Since from the first view without a pod holding it, and
// is released only when every other Node's acknowledgement reaches Since: a Node without
// one, or with a malformed one, holds it; a deleted Node no longer counts.
func TestSyncQuarantine(t *testing.T) {
	ip := netip.MustParseAddr("10.1.0.5")
	m := newModel()
	m.quarantine[ip] = &QuarantineRecord{IP: ip, Pod: "x/a"}
	step := func(what string, v ClusterView, wantSince, wantWant string, wantKept bool) {
		t.Helper()
		want := syncQuarantine(m, v)
		r, kept := m.quarantine[ip]
		if kept != wantKept || want != wantWant || kept && r.Since != wantSince {
			t.Fatalf("%s: kept %v (%+v), want %q; want kept %v since %q, want %q", what, kept, r, want, wantKept, wantSince, wantWant)
		}
	}
	step("pod still in the API", ClusterView{PodsRVListed: "90", LocalAddresses: map[netip.Addr]string{ip: "x/a"}, Acks: map[string]string{"n2": "100"}}, "", "", true)
	step("pod gone", ClusterView{PodsRVListed: "100", Acks: map[string]string{"n2": "99", "n3": "100"}}, "100", "100", true)
	step("n2 without acknowledgement", ClusterView{PodsRVListed: "120", Acks: map[string]string{"n2": "", "n3": "120"}}, "100", "100", true)
	step("n2 malformed", ClusterView{PodsRVListed: "120", Acks: map[string]string{"n2": "0100", "n3": "120"}}, "100", "100", true)
	step("n2 behind (shorter)", ClusterView{PodsRVListed: "120", Acks: map[string]string{"n2": "99", "n3": "120"}}, "100", "100", true)
	step("n2 deleted, n3 caught up", ClusterView{PodsRVListed: "130", Acks: map[string]string{"n3": "1000"}}, "", "", false)
}
