package datapath

import (
	"slices"
	"testing"
)

// TestPinNames: the pin names come from the BPF objects (both of them) and the code
// that pins links; the one map the programs do not pin is not among them.
func TestPinNames(t *testing.T) {
	names, err := PinNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"policy", "conntrack4_jiffies", "endpoints", "cidr_top", "sv_flows", "sv_conns", sockopsLinkPin, legacyCT4Pin} {
		if !slices.Contains(names, want) {
			t.Errorf("PinNames() lacks %q: %v", want, names)
		}
	}
	if slices.Contains(names, "flow_cache") {
		t.Errorf("PinNames() has flow_cache, which is never pinned")
	}
}
