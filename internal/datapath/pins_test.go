package datapath

import (
	"slices"
	"testing"
)

// TestPinNames: the pin names come from the tc object, the pins of earlier versions and
// the other objects' pins (extra); the one map the programs do not pin is not among them.
func TestPinNames(t *testing.T) {
	names, err := PinNames("sv_conns", "sv_sockops_link")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"policy", "conntrack4_peer", "ipcache_gen", "frags_peer", "endpoints", "cidr_top", "sv_flows", "sv_conns", "sv_sockops_link", legacyCT4Pin, jiffiesConntrackPin, "frags"} {
		if !slices.Contains(names, want) {
			t.Errorf("PinNames() lacks %q: %v", want, names)
		}
	}
	if slices.Contains(names, "flow_cache") {
		t.Errorf("PinNames() has flow_cache, which is never pinned")
	}
}
