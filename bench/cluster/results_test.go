package cluster

import (
	"math"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func near(f benchkit.Float, want float64) bool { return f.Valid() && math.Abs(float64(f)-want) < 1e-9 }

// Pod ratios are taken against one pair of the same round, mode, traffic and policy
// variant; the most pairs get the verdict.
func TestSummarizePods(t *testing.T) {
	res := &PodsResult{Samples: []PodSample{
		{Mode: "vxlan", Traffic: "tcp", Policy: true, Pairs: 1, Round: 0, Bps: 10, PairBps: []float64{10}},
		{Mode: "vxlan", Traffic: "tcp", Policy: true, Pairs: 40, Round: 0, Bps: 9.5, PairBps: []float64{0.2, 0.3}, CPUBusy: []float64{100, 90}},
		{Mode: "vxlan", Traffic: "tcp", Policy: true, Pairs: 1, Round: 1, Bps: 20, PairBps: []float64{20}},
		{Mode: "vxlan", Traffic: "tcp", Policy: true, Pairs: 40, Round: 1, Bps: 18.4, PairBps: []float64{0.4, 0.5}, CPUBusy: []float64{100, 100}},
		{Mode: "native", Traffic: "tcp", Policy: false, Pairs: 1, Round: 0, Bps: 10, PairBps: []float64{10}},
		{Mode: "native", Traffic: "tcp", Policy: false, Pairs: 40, Round: 0, Bps: 5, PairBps: []float64{0.1}},
	}}
	summarizePods(res, []int{1, 40})
	if len(res.Summary) != 4 {
		t.Fatalf("%d summaries, want 4: %+v", len(res.Summary), res.Summary)
	}
	// Order: modes as measured, policy first, pairs ascending.
	first, vx40, nat40 := res.Summary[0], res.Summary[1], res.Summary[3]
	if first.Mode != "vxlan" || first.Pairs != 1 || !near(first.Ratio, 1) || first.Verdict != "" {
		t.Errorf("first summary %+v", first)
	}
	// Round ratios 0.95 and 0.92: median 0.935, a pass; not the ratio of the medians.
	if vx40.Pairs != 40 || !near(vx40.Ratio, 0.935) || vx40.Verdict != VerdictPass || !near(vx40.CPUBusy, 97.5) {
		t.Errorf("vxlan 40 pairs %+v", vx40)
	}
	if !near(vx40.MinPairBps, 0.3) || !near(vx40.MaxPairBps, 0.4) {
		t.Errorf("vxlan 40 pairs slowest/fastest pair medians %v %v, want 0.3 0.4", vx40.MinPairBps, vx40.MaxPairBps)
	}
	if nat40.Mode != "native" || !near(nat40.Ratio, 0.5) || nat40.Verdict != VerdictMiss || nat40.CPUBusy.Valid() {
		t.Errorf("native 40 pairs %+v", nat40)
	}
}

func sample(round, pair int, bps, tps, p50 float64) PathSample {
	s := PathSample{Round: round, Pair: pair, Flow: Flow{Bps: bps}}
	s.RR.TPS, s.RR.P50Us = tps, p50
	return s
}

// Policy ratios are each pair's ratio to the no-policy sample of the same pair.
func TestSummarizePolicies(t *testing.T) {
	res := &PoliciesResult{Cases: []PolicyCase{
		{Name: CaseNoPolicy, Samples: []PathSample{sample(0, 0, 10, 100, 30), sample(0, 1, 20, 100, 30), sample(1, 2, 10, 100, 30)}},
		{Name: CaseControl, Samples: []PathSample{sample(0, 0, 10, 100, 30)}},
		{Name: "policies-10000", Policies: 10000, Samples: []PathSample{sample(0, 1, 19, 95, 33), sample(1, 2, 9, 100, 30)}},
		{Name: "policies-1", Policies: 1},
	}}
	res.Cases[2].Samples[0].MapEntries, res.Cases[2].Samples[0].EnforcedSeconds = 10002, 2
	summarizePolicies(res)
	want := []string{VerdictBaseline, VerdictControl, VerdictMiss, VerdictInvalid}
	for i, c := range res.Cases {
		if c.Summary.Verdict != want[i] {
			t.Errorf("%s: verdict %s, want %s", c.Name, c.Summary.Verdict, want[i])
		}
	}
	s := res.Cases[2].Summary
	// Pair ratios 0.95 and 0.9: median 0.925 (below the target: a miss).
	if !near(s.Ratio, 0.925) || !near(s.RatioMin, 0.9) || !near(s.RatioMax, 0.95) || s.MapEntries != 10002 || !near(s.EnforcedSecs, 2) {
		t.Errorf("policies-10000 summary %+v", s)
	}
	res.Cases[2].Samples[1].Flow.Bps = 10
	summarizePolicies(res)
	if res.Cases[2].Summary.Verdict != VerdictPass || !near(res.Cases[2].Summary.Ratio, 0.975) {
		t.Errorf("after the change: %+v", res.Cases[2].Summary)
	}
}

// Overlay ratios are per round, to native and to the fabric.
func TestSummarizeOverlay(t *testing.T) {
	res := &OverlayResult{Cases: []OverlayCase{
		{Name: CaseFabric, Available: true, Samples: []PathSample{sample(0, 0, 20, 200, 20), sample(1, 1, 10, 100, 20)}},
		{Name: CaseNative, Available: true, Samples: []PathSample{sample(0, 0, 10, 100, 25), sample(1, 1, 5, 50, 25)}},
		{Name: "vxlan", Available: true, Samples: []PathSample{sample(0, 0, 8, 80, 30), sample(1, 1, 4, 40, 30)}},
		{Name: "ipip", Reason: "tunnel mode not available"},
	}}
	summarizeOverlay(res)
	v := res.Cases[2].Summary
	if !near(v.VsNativeBps, 0.8) || !near(v.VsNativeTPS, 0.8) || !near(v.VsNativeP50, 1.2) || !near(v.VsFabricBps, 0.4) || !near(v.Bps, 6) {
		t.Errorf("vxlan summary %+v", v)
	}
	if res.Cases[3].Summary.Bps.Valid() {
		t.Errorf("unavailable case has numbers: %+v", res.Cases[3].Summary)
	}
	rep := &Report{Overlay: res, Published: published}
	if md := Table(rep); !strings.Contains(md, "| ipip | - | not available: tunnel mode not available |") || !strings.Contains(md, "| vxlan | 0 | 0.00 | 0.800 | 0.400 |") {
		t.Errorf("table:\n%s", md)
	}
}

// Every two nodes share a /24 of their own on their fabric veth; nodes 0 and 1 keep the
// two-node cluster's addresses.
func TestFabricAddr(t *testing.T) {
	for _, c := range []struct {
		i, j int
		want string
	}{{0, 1, "198.19.255.1"}, {1, 0, "198.19.255.2"}, {0, 2, "198.19.254.1"}, {2, 0, "198.19.254.3"}, {1, 2, "198.19.253.2"}, {2, 1, "198.19.253.3"}} {
		if got := fabricAddr(c.i, c.j).String(); got != c.want {
			t.Errorf("fabricAddr(%d, %d) = %s, want %s", c.i, c.j, got, c.want)
		}
	}
}
