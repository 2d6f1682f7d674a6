package l7

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// sample makes a round's sample with a given sustained rate and a latency histogram
// centred on latUs.
func sample(round int, sustained, latUs float64) Sample {
	run := LoadRun{TargetQPS: 1000, ActualQPS: 1000, Requests: 1000, OK: 1000, MaxUs: 2 * latUs,
		Histogram: []Bucket{{latUs / 2, latUs, 500}, {latUs, 2 * latUs, 500}}, CPUBusy: []float64{50, 80}}
	run.P50Us, run.P90Us = HistogramPercentile(run.Histogram, 50), HistogramPercentile(run.Histogram, 90)
	run.P99Us, run.P999Us = HistogramPercentile(run.Histogram, 99), HistogramPercentile(run.Histogram, 99.9)
	return Sample{Round: round, Latency: run, LatencySustained: true,
		Saturation: LoadRun{ActualQPS: sustained * 1.1, CPUBusy: []float64{60, 100}}, SustainedQPS: sustained}
}

func testResult() *Result {
	res := &Result{Schema: Schema, Started: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC),
		Settings: Settings{Repeats: 3, RateQPS: 1000, Connections: 16, Criterion: Criterion{MinAchieved: 0.98, P99BoundUs: 10000}}}
	rates := map[string][]float64{
		CaseNone:   {10000, 10400, 9800},
		CaseL3:     {9900, 10000, 9700},
		CaseL4:     {9800, 10000, 9600},
		CaseL7:     {7000, 6800, 7300},
		CaseL7Many: {6800, 6700, 6400},
	}
	lat := map[string]float64{CaseNone: 200, CaseL3: 210, CaseL4: 220, CaseL7: 600, CaseL7Many: 650}
	for _, n := range CaseNames {
		c := CaseResult{Name: n}
		for i, r := range rates[n] {
			c.Samples = append(c.Samples, sample(i, r, lat[n]))
		}
		res.Cases = append(res.Cases, c)
	}
	return res
}

func TestSummarize(t *testing.T) {
	res := testResult()
	summarize(res)
	l4, l7 := res.Cases[2].Summary, res.Cases[3].Summary
	if l4.Verdict != VerdictMeasured || l4.Rounds != 3 || l4.Requests != 3000 || l4.LatencySustained != 3 {
		t.Errorf("l4 summary %+v", l4)
	}
	if float64(l4.SustainedQPS) != 9800 || float64(l4.SustainedMinQPS) != 9600 || float64(l4.SustainedMaxQPS) != 10000 {
		t.Errorf("l4 sustained %v (%v-%v), want median 9800 of 9600..10000", l4.SustainedQPS, l4.SustainedMinQPS, l4.SustainedMaxQPS)
	}
	// Every round: half the requests in [110, 220], half in [220, 440].
	if math.Abs(float64(l4.P50Us)-220) > 1e-9 || float64(l4.MaxUs) != 440 || math.Abs(float64(l4.P99Us)-435.6) > 1e-9 {
		t.Errorf("l4 p50 %v p99 %v max %v, want 220, 435.6 and 440", l4.P50Us, l4.P99Us, l4.MaxUs)
	}
	if l4.PooledP99Us != l4.P99Us || l4.WorstMaxUs != l4.MaxUs {
		t.Errorf("identical rounds: pooled p99 %v and worst max %v differ from the medians", l4.PooledP99Us, l4.WorstMaxUs)
	}
	// One disturbed round does not set the summary's tail; it shows in the worst max.
	res.Cases[2].Samples[1].Latency.P99Us = 90000
	res.Cases[2].Samples[1].Latency.MaxUs = 95000
	summarize(res)
	if l4 = res.Cases[2].Summary; math.Abs(float64(l4.P99Us)-435.6) > 1e-9 || float64(l4.MaxUs) != 440 || float64(l4.WorstMaxUs) != 95000 {
		t.Errorf("disturbed round: p99 %v max %v worst %v", l4.P99Us, l4.MaxUs, l4.WorstMaxUs)
	}
	if got := l4.SaturationCPUBusy; len(got) != 2 || got[0] != 60 || got[1] != 100 {
		t.Errorf("cpu busy %v", got)
	}
	// Per-round ratios l7/l4: 7000/9800, 6800/10000, 7300/9600 -> median 7000/9800.
	cmp := res.Comparisons[0]
	if cmp.Numerator != CaseL7 || cmp.Denominator != CaseL4 || cmp.Rounds != 3 || math.Abs(float64(cmp.Ratio)-7000.0/9800) > 1e-9 {
		t.Errorf("L7/L4 %+v, want ratio %v", cmp, 7000.0/9800)
	}
	if cmp.Verdict != VerdictPass || math.Abs(float64(cmp.Min)-0.68) > 1e-9 {
		t.Errorf("L7/L4 verdict %s min %v, want PASS (0.714 >= 0.7) and min 0.68", cmp.Verdict, cmp.Min)
	}
	if math.Abs(float64(cmp.P50Ratio)-600.0/220) > 1e-9 {
		t.Errorf("L7/L4 p50 ratio %v", cmp.P50Ratio)
	}
	many := res.Comparisons[1]
	// 6800/7000, 6700/6800, 6400/7300 -> median 6800/7000 = 0.971.
	if many.Verdict != VerdictPass || math.Abs(float64(many.Ratio)-6800.0/7000) > 1e-9 {
		t.Errorf("40/1 %+v", many)
	}
	if math.Abs(float64(l7.SustainedVsNone)-0.7) > 1e-9 {
		t.Errorf("l7 vs no policy %v, want median of 0.7, 0.654, 0.745 = 0.7", l7.SustainedVsNone)
	}

	// A miss.
	res.Cases[4].Samples[1].SustainedQPS = 5000
	res.Cases[4].Samples[0].SustainedQPS = 5000
	summarize(res)
	if res.Comparisons[1].Verdict != VerdictMiss {
		t.Errorf("40 rules at 5000 vs 7000: %+v", res.Comparisons[1])
	}
}

func TestSummarizeNotAvailable(t *testing.T) {
	res := testResult()
	res.Cases[3] = CaseResult{Name: CaseL7, NotAvailable: "the parser says no"}
	res.Cases[4].Errors = []string{"round 1: boom"}
	res.Cases[0].Samples[1].Incidents = []string{"run at 5000/s: could not connect; retried"}
	summarize(res)
	if n := res.Cases[0].Summary.Incidents; n != 1 || res.Cases[0].Summary.Verdict != VerdictMeasured {
		t.Errorf("incidents %d, verdict %s; want 1, measured", n, res.Cases[0].Summary.Verdict)
	}
	if s := res.Cases[3].Summary; s.Verdict != VerdictNotAvailable || s.SustainedQPS.Valid() || s.P99Us.Valid() {
		t.Errorf("not-available case has numbers: %+v", s)
	}
	if res.Cases[4].Summary.Verdict != VerdictInvalid {
		t.Errorf("case with errors: %s", res.Cases[4].Summary.Verdict)
	}
	for _, c := range res.Comparisons {
		if c.Verdict != VerdictNotAvailable || !strings.Contains(c.Note, "the parser says no") || c.Ratio.Valid() {
			t.Errorf("comparison with an unavailable side: %+v", c)
		}
	}

	// JSON: NaN as null, and it reads back.
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"sustained_qps":null`)) || !bytes.Contains(b, []byte(`"not_available":"the parser says no"`)) {
		t.Errorf("JSON lacks null numbers or the reason: %s", b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var back Result
	if err := dec.Decode(&back); err != nil {
		t.Fatal(err)
	}
	if back.Cases[3].Summary.SustainedQPS.Valid() || back.Cases[2].Summary.SustainedQPS != res.Cases[2].Summary.SustainedQPS {
		t.Errorf("round trip changed numbers")
	}

	var md strings.Builder
	res.WriteMarkdown(&md)
	out := md.String()
	for _, want := range []string{"| l7 | - | n/a", "not available: the parser says no", "| l4 |", "NOT AVAILABLE: l7: the parser says no", "l7-40: error: round 1: boom",
		"no-policy: incident in round 2: run at 5000/s: could not connect; retried", "1 load runs retried"} {
		if !strings.Contains(out, want) {
			t.Errorf("markdown lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteOutputs(t *testing.T) {
	dir := t.TempDir()
	res := testResult()
	res.Cases[3].NotAvailable = "not yet"
	res.Cases[3].Samples = nil
	summarize(res)
	if _, err := res.WriteJSON(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := res.WriteTable(dir); err != nil {
		t.Fatal(err)
	}
	p := strings.TrimSuffix(res.JSONPath, ".json") + ".png"
	if err := WritePlot(res, p); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(res.JSONPath, "l7-20261122T080000Z.json") || !strings.HasSuffix(res.TablePath, ".md") {
		t.Errorf("paths %s %s", res.JSONPath, res.TablePath)
	}
	// Nothing measured at all still plots (an empty frame, not a panic on a log axis).
	empty := &Result{Started: res.Started, Cases: []CaseResult{{Name: CaseNone, Errors: []string{"x"}}}}
	summarize(empty)
	if err := WritePlot(empty, dir+"/empty.png"); err != nil {
		t.Fatal(err)
	}
}
