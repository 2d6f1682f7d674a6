package datapath

import (
	"testing"
	"time"
)

func TestToJiffies(t *testing.T) {
	tick := 4 * time.Millisecond // HZ=250
	for _, c := range []struct {
		d    time.Duration
		want uint64
	}{
		{time.Nanosecond, 0}, // less than a tick: expired at the next tick
		{4 * time.Millisecond, 1},
		{7 * time.Millisecond, 1}, // rounded down
		{60 * time.Second, 15000},
		{6 * time.Hour, 5400000},
	} {
		if got := toJiffies(c.d, tick); got != c.want {
			t.Errorf("toJiffies(%v, %v) = %d, want %d", c.d, tick, got, c.want)
		}
	}
}

// Times of earlier versions keep their age: a time 1 s before the reading is 250 ticks
// before it at HZ=250; a time after the reading (written by a CPU ahead) is now; a time
// older than the tick counter is 0, not a wrapped value far in the future.
func TestNsToJiffies(t *testing.T) {
	c := nsToJiffies{nowNs: 100e9, nowJ: 1_000_000, tick: 4 * time.Millisecond}
	for _, x := range []struct {
		ns, want uint64
	}{
		{100e9, 1_000_000},
		{99e9, 1_000_000 - 250},
		{99e9 + 3e6, 1_000_000 - 249}, // 997 ms ago: 249 whole ticks
		{101e9, 1_000_000},
		{0, 1_000_000 - 25000},
	} {
		if got := c.jiffies(x.ns); got != x.want {
			t.Errorf("jiffies(%d ns) = %d, want %d", x.ns, got, x.want)
		}
	}
	old := nsToJiffies{nowNs: 100e9, nowJ: 100, tick: 4 * time.Millisecond}
	if got := old.jiffies(0); got != 0 {
		t.Errorf("a time older than the tick counter: %d, want 0", got)
	}
}
