package taps

import (
	"math"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/bench/l7"
	"github.com/rampartnet/rampart/bench/policyoverhead"
)

func iperfM(bps float64) Measurement {
	return Measurement{Iperf: &policyoverhead.IperfResult{BitsPerSecond: bps, Seconds: 1}}
}

// Summaries take the median of the pairs' ratios, judge them against the target, total
// the copies lost, and skip broken pairs instead of counting them as zero.
func TestSummarize(t *testing.T) {
	cases := []CaseResult{
		{Name: CaseMirrorThroughput, Metric: metricThroughput, Action: "mirror", Target: 0.9, Samples: []Sample{
			{Tap: iperfM(9e9), Base: iperfM(10e9), Counters: &TapCounters{MirroredPackets: 10, CopiesLost: 1}, Monitor: &MonitorRun{KernelPackets: 100, KernelDrops: 5}},
			{Tap: iperfM(8e9), Base: iperfM(10e9), Counters: &TapCounters{MirroredPackets: 20, CopiesLost: 2}, Monitor: &MonitorRun{KernelPackets: 200, KernelDrops: 7},
				Remote: &RemoteCounters{Delivered: 19, Lost: 1}},
			{Tap: iperfM(9.5e9), Base: iperfM(10e9)},
			{Tap: Measurement{}, Base: iperfM(10e9)}, // a broken pair
		}},
		{Name: CaseRedirectLatency, Metric: metricLatency, Action: "redirect", Samples: []Sample{
			{Tap: Measurement{Web: &l7.LoadRun{P50Us: 200, P90Us: 300, P99Us: 900}}, Base: Measurement{Web: &l7.LoadRun{P50Us: 100, P90Us: 150, P99Us: 300}}},
		}},
		{Name: CaseMirrorWeb, Metric: metricRate, Action: "mirror", Target: 0.97},
	}
	summarize(cases)
	s := cases[0].Summary
	if s.Pairs != 3 || math.Abs(float64(s.Ratio)-0.9) > 1e-9 || s.Verdict != verdictPass || float64(s.RatioMin) != 0.8 ||
		s.CopiesLost != 3 || s.KernelDrops != 12 || s.Mirrored != 30 || s.KernelPackets != 300 || s.RemoteDelivered != 19 || s.RemoteLost != 1 {
		t.Errorf("mirror summary %+v", s)
	}
	l := cases[1].Summary
	if l.Ratio != 0.5 || l.P99Us != 900 || l.BaseP99Us != 300 || l.Verdict != verdictReport {
		t.Errorf("latency summary %+v", l)
	}
	if cases[2].Summary.Verdict != verdictInvalid {
		t.Errorf("a case without pairs is %s", cases[2].Summary.Verdict)
	}
	cases[0].Samples = cases[0].Samples[1:2] // 0.8 alone
	summarize(cases)
	if cases[0].Summary.Verdict != verdictMiss {
		t.Errorf("0.8 against 0.9 is %s", cases[0].Summary.Verdict)
	}
	res := &Result{Cases: cases, Placements: placements()}
	if ExitCode(res, false) != 1 || ExitCode(&Result{Cases: cases[:2]}, true) != 3 || ExitCode(&Result{Cases: cases[:2]}, false) != 0 {
		t.Error("exit codes")
	}
	tbl := res.Table()
	for _, want := range []string{"| mirror-throughput | throughput | 8000 Mbit/s | 10000 Mbit/s | 0.800",
		"| A, B and S on one node | node-a | node-a | mirror-throughput | 12000 -> 9100 Mbit/s (0.76) | 10000 Mbit/s | 8000 Mbit/s | 0.800 | 20 | 2 | - |",
		"| mirror-throughput | 1 | 20 | 2 | 19 / 1 | 200 | 7 |", "200/300/900 us"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}
}
