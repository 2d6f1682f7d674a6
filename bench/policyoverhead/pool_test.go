package policyoverhead

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestPoolKeepsPairsWithinRuns(t *testing.T) {
	a, b := testResult(), testResult()
	// Run b's l4 case is 0.9 of its baseline in every pair: pooled with run a's 0.95,
	// 0.96 and 1.0, the median of the six is (0.95+0.96)/2 only if b's samples are paired
	// with b's own baseline (the pair numbers of both runs overlap).
	for i := range b.Cases[1].Samples {
		s := &b.Cases[1].Samples[i]
		s.Iperf.BitsPerSecond = 0.9 * b.Cases[0].Samples[s.Pair].Iperf.BitsPerSecond
	}
	b.Settings.Repeats = 4
	p, err := Pool([]*Result{a, b})
	if err != nil {
		t.Fatal(err)
	}
	l4 := p.Cases[1].Summary
	if l4.Rounds != 6 || math.Abs(l4.ThroughputRatio-0.925) > 1e-9 || l4.Verdict != VerdictMiss {
		t.Errorf("pooled l4: %d rounds, ratio %v, verdict %s; want 6, 0.925, MISS", l4.Rounds, l4.ThroughputRatio, l4.Verdict)
	}
	if math.Abs(l4.ThroughputRatioMin-0.9) > 1e-9 || math.Abs(l4.ThroughputRatioMax-1) > 1e-9 {
		t.Errorf("pooled l4 range %v-%v, want 0.9-1", l4.ThroughputRatioMin, l4.ThroughputRatioMax)
	}
	if p.Settings.Repeats != 7 || p.Pooled != 2 || p.Cases[0].Summary.Rounds != 12 {
		t.Errorf("pooled: repeats %d, runs %d, baseline rounds %d", p.Settings.Repeats, p.Pooled, p.Cases[0].Summary.Rounds)
	}
	// The case that failed in both runs stays invalid, with both runs' errors.
	if l3 := p.Cases[3]; l3.Summary.Verdict != VerdictInvalid || len(l3.Errors) != 2 || !strings.HasPrefix(l3.Errors[1], "run 2: ") {
		t.Errorf("pooled l3: %s %v", l3.Summary.Verdict, l3.Errors)
	}
	var out bytes.Buffer
	p.PrintTable(&out)
	if !strings.Contains(out.String(), "pooled: the pairs of 2 runs") {
		t.Errorf("table does not say it is pooled:\n%s", out.String())
	}
	// The inputs are not changed.
	if a.Cases[1].Samples[0].Pair != 0 || b.Cases[1].Samples[0].Pair != 0 {
		t.Error("pooling renumbered the runs' own samples")
	}
}

func TestPoolRefusesDifferentCases(t *testing.T) {
	a, b := testResult(), testResult()
	b.Cases = b.Cases[:2]
	if _, err := Pool([]*Result{a, b}); err == nil || !strings.Contains(err.Error(), "run 2: cases") {
		t.Errorf("pooling runs with different cases: %v", err)
	}
	if _, err := Pool(nil); err == nil {
		t.Error("pooling nothing did not fail")
	}
}
