package policyoverhead

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func sample(pair int, gbps, tps, p50 float64) Sample {
	return Sample{
		Round: pair % 3,
		Pair:  pair,
		Iperf: IperfResult{BitsPerSecond: gbps * 1e9, Seconds: 3},
		RR:    benchkit.RRResult{Transactions: int64(tps), TPS: tps, P50Us: p50, P90Us: 2 * p50, P99Us: 4 * p50},
	}
}

func testResult() *Result {
	cases := []CaseResult{
		{Name: CaseNoAgent, Samples: []Sample{
			sample(0, 10, 1000, 20), sample(1, 12, 1000, 20), sample(2, 8, 1000, 20),
			sample(3, 10, 1000, 20), sample(4, 12, 1000, 20), sample(5, 8, 1000, 20),
		}},
		// Pair by pair 0.96, 0.95, 1.0: passes.
		{Name: CaseL4, Agent: true, Rules: 1, Samples: []Sample{sample(0, 9.6, 900, 22), sample(1, 11.4, 950, 24), sample(2, 8, 1000, 26)}},
		// 0.9 in every pair: misses, though its best sample beats the baseline's median.
		{Name: "rules-10000", Agent: true, Rules: 10000, Samples: []Sample{sample(3, 9, 800, 30), sample(4, 10.8, 800, 30), sample(5, 7.2, 800, 30)}},
		{Name: CaseL3, Agent: true, Rules: 1, Errors: []string{"round 1: enforcement check failed"}},
	}
	for i := range cases[1].Samples {
		cases[1].Samples[i].EnforcedSeconds = 0.01 * float64(i+1)
		cases[1].Samples[i].MapEntries = 2
	}
	r := &Result{Schema: Schema, Started: time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC), Target: TargetThroughputRatio,
		Settings: Settings{Repeats: 3}, Cases: cases}
	summarize(r.Cases)
	return r
}

func TestSummarizeRatiosAndVerdicts(t *testing.T) {
	r := testResult()
	base, l4, many, l3 := r.Cases[0].Summary, r.Cases[1].Summary, r.Cases[2].Summary, r.Cases[3].Summary
	if base.Verdict != VerdictBaseline || base.ThroughputRatio != 1 || base.ThroughputBps != 10e9 {
		t.Errorf("baseline: %+v", base)
	}
	if base.ThroughputMinBps != 8e9 || base.ThroughputMaxBps != 12e9 {
		t.Errorf("baseline spread %v-%v, want 8e9-12e9", base.ThroughputMinBps, base.ThroughputMaxBps)
	}
	if math.Abs(l4.ThroughputRatio-0.96) > 1e-9 || l4.Verdict != VerdictPass {
		t.Errorf("l4: ratio %v verdict %s, want 0.96 PASS", l4.ThroughputRatio, l4.Verdict)
	}
	if math.Abs(l4.ThroughputRatioMin-0.95) > 1e-9 || math.Abs(l4.ThroughputRatioMax-1) > 1e-9 {
		t.Errorf("l4 ratio range %v-%v, want 0.95-1", l4.ThroughputRatioMin, l4.ThroughputRatioMax)
	}
	if math.Abs(l4.P50Ratio-1.2) > 1e-9 || math.Abs(l4.TPSRatio-0.95) > 1e-9 || l4.EnforcedSeconds != 0.02 || l4.MapEntries != 2 {
		t.Errorf("l4: p50 ratio %v, tps ratio %v, enforced %v, entries %d", l4.P50Ratio, l4.TPSRatio, l4.EnforcedSeconds, l4.MapEntries)
	}
	if math.Abs(many.ThroughputRatio-0.9) > 1e-9 || many.Verdict != VerdictMiss {
		t.Errorf("rules-10000: ratio %v verdict %s, want 0.9 MISS", many.ThroughputRatio, many.Verdict)
	}
	if l3.Verdict != VerdictInvalid || !math.IsNaN(l3.ThroughputRatio) {
		t.Errorf("case with errors and no samples: %+v", l3)
	}
}

func TestReportJSONAndTable(t *testing.T) {
	r := testResult()
	dir := t.TempDir()
	p, err := r.WriteJSON(dir)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p) != "policy-overhead-20261122T070000Z.json" {
		t.Errorf("file name %s", filepath.Base(p))
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Schema string `json:"schema"`
		Cases  []struct {
			Name    string         `json:"name"`
			Summary map[string]any `json:"summary"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("report is not valid JSON: %v", err)
	}
	if back.Schema != Schema || len(back.Cases) != 4 {
		t.Fatalf("schema %q, %d cases", back.Schema, len(back.Cases))
	}
	if v, ok := back.Cases[3].Summary["throughput_ratio"]; !ok || v != nil {
		t.Errorf("ratio without numbers written as %v (present %v), want null", v, ok)
	}
	if v := back.Cases[1].Summary["verdict"]; v != VerdictPass {
		t.Errorf("l4 verdict %v", v)
	}

	back2, err := ReadResult(p)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(back2.Cases[3].Summary.ThroughputRatio) || back2.Cases[1].Summary != r.Cases[1].Summary {
		t.Errorf("summaries do not survive a round trip: %+v, %+v", back2.Cases[3].Summary, back2.Cases[1].Summary)
	}
	var md bytes.Buffer
	back2.PrintMarkdown(&md)
	if !strings.Contains(md.String(), "| l4 | 1 | 2 | ") || !strings.Contains(md.String(), "|---|") {
		t.Errorf("markdown table:\n%s", md.String())
	}

	var out bytes.Buffer
	r.PrintTable(&out)
	for _, want := range []string{"PASS", "MISS", "INVALID", "BASELINE", "0.960", "0.900", "enforcement check failed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestWritePlot(t *testing.T) {
	p := filepath.Join(t.TempDir(), "plot.png")
	if err := WritePlot(testResult(), p); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 10000 {
		t.Errorf("not a plausible PNG: %d bytes", len(b))
	}
}
