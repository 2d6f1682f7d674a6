package agent

import (
	"runtime/debug"
	"testing"
)

// gcPercent reads the current GC percent without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}

func TestRelaxGCScopes(t *testing.T) {
	saved := operatorGC
	operatorGC = false
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { operatorGC = saved; debug.SetGCPercent(prev) })

	relaxGC(largeApplyBytes - 1)()
	if p := gcPercent(); p != 100 {
		t.Fatalf("a small request changed the GC percent to %d", p)
	}
	end1 := relaxGC(largeApplyBytes)
	end2 := relaxGC(largeApplyBytes)
	if p := gcPercent(); p != applyGCPercent {
		t.Fatalf("during large requests: GC percent %d, want %d", p, applyGCPercent)
	}
	end1()
	if p := gcPercent(); p != applyGCPercent {
		t.Fatalf("one of two large requests ended: GC percent %d, want %d", p, applyGCPercent)
	}
	end2()
	if p := gcPercent(); p != 100 {
		t.Fatalf("after the large requests: GC percent %d, want 100", p)
	}

	operatorGC = true
	relaxGC(largeApplyBytes)()
	if p := gcPercent(); p != 100 {
		t.Fatalf("with the operator's GOGC: GC percent %d, want 100", p)
	}
}
