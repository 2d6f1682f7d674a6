package taps

import (
	"testing"

	"github.com/rampartnet/rampart/internal/monitor/suricata"
)

// The counters are final only once Suricata counts what arrived on the monitor's
// interfaces: a run whose last counters are not yet published (8 of 22,392 packets, as
// seen) is not done, however still the counters stand.
func TestStatsCaughtUp(t *testing.T) {
	before := suricata.CaptureStats{KernelPackets: 1000, KernelDrops: 10, Accepted: 500}
	for _, c := range []struct {
		name     string
		cur      suricata.CaptureStats
		rxBefore uint64
		rx       uint64
		want     bool
	}{
		{"published a few of them", suricata.CaptureStats{KernelPackets: 1008, KernelDrops: 10}, 2000, 2000 + 22392, false},
		{"all read", suricata.CaptureStats{KernelPackets: 1000 + 22392, KernelDrops: 10}, 2000, 2000 + 22392, true},
		{"some dropped by its socket", suricata.CaptureStats{KernelPackets: 1000 + 22392, KernelDrops: 10 + 392}, 2000, 2000 + 22392, true},
		{"drops are among the packets", suricata.CaptureStats{KernelPackets: 1000 + 22000, KernelDrops: 10 + 392}, 2000, 2000 + 22392, false},
		{"one short", suricata.CaptureStats{KernelPackets: 1000 + 22391, KernelDrops: 10}, 2000, 2000 + 22392, false},
		{"inline verdicts do not count as captured", suricata.CaptureStats{KernelPackets: 1000, KernelDrops: 10, Accepted: 500 + 22392}, 2000, 2000 + 22392, false},
		{"nothing arrived", before, 2000, 2000, true},
		{"counters restarted", suricata.CaptureStats{KernelPackets: 5}, 2000, 2005, false},
	} {
		if got := statsCaughtUp(before, c.cur, c.rxBefore, c.rx); got != c.want {
			t.Errorf("%s: caught up %v, want %v", c.name, got, c.want)
		}
	}
}
