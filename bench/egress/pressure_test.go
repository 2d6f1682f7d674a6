package egress

import (
	"testing"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func TestSomeTotal(t *testing.T) {
	const cpu = "some avg10=0.17 avg60=2.04 avg300=5.04 total=30312934\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"
	if v, ok := someTotal(cpu); !ok || v != 30312934 {
		t.Errorf("someTotal = %d, %v", v, ok)
	}
	// The "full" line alone, or a malformed total, is no reading.
	for _, s := range []string{"full avg10=0.00 total=7\n", "some avg10=0.00 total=x\n", ""} {
		if v, ok := someTotal(s); ok {
			t.Errorf("someTotal(%q) = %d, want no reading", s, v)
		}
	}
}

func TestStallsSince(t *testing.T) {
	before := readStalls()
	if before == nil {
		// The set-up stalls are part of the report: CI's machine must have them.
		benchkit.SkipOrFail(t, "no /proc/pressure on this kernel (CONFIG_PSI)")
	}
	got := stallsSince(before)
	for _, r := range stallResources {
		if v, ok := got[r]; !ok || v < 0 {
			t.Errorf("%s stall %v, %v (all: %v)", r, v, ok, got)
		}
	}
	if stallsSince(nil) != nil {
		t.Error("stalls since no reading")
	}
}
