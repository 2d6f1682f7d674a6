package l7

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

// TestParseFortio reads a report fortio 1.68.2 wrote (GET /v1 on the benchmark's server at
// 2000/s over loopback) and checks the fields the benchmark keeps, including that the
// percentiles recomputed from the buckets agree with fortio's own.
func TestParseFortio(t *testing.T) {
	b, err := os.ReadFile("testdata/fortio-2000qps.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := parseFortio(b)
	if err != nil {
		t.Fatal(err)
	}
	if r.TargetQPS != 2000 || r.Requests != 1998 || r.OK != 1998 || r.Errors != 0 || r.Connections != 4 || r.Sockets != 4 {
		t.Errorf("target %v requests %d ok %d errors %d connections %d sockets %d", r.TargetQPS, r.Requests, r.OK, r.Errors, r.Connections, r.Sockets)
	}
	if math.Abs(r.ActualQPS-1994.72) > 0.01 || math.Abs(r.Seconds-1.0) > 0.01 {
		t.Errorf("actual qps %v over %v s", r.ActualQPS, r.Seconds)
	}
	if r.MinUs <= 0 || r.MaxUs < r.P999Us || r.P999Us < r.P99Us || r.P99Us < r.P90Us || r.P90Us < r.P50Us || r.P50Us < r.MinUs {
		t.Errorf("percentiles out of order: %+v", r)
	}
	var raw fortioJSON
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	got := map[float64]float64{50: r.P50Us, 90: r.P90Us, 99: r.P99Us, 99.9: r.P999Us}
	for _, p := range raw.DurationHistogram.Percentiles {
		want := p.Value * 1e6
		if math.Abs(got[p.Percentile]-want) > 1e-6*want {
			t.Errorf("p%v: %v us, fortio says %v us", p.Percentile, got[p.Percentile], want)
		}
	}
	var n int64
	for _, bk := range r.Histogram {
		n += bk.Count
		if bk.EndUs < bk.StartUs {
			t.Errorf("bucket %+v ends before it starts", bk)
		}
	}
	if n != r.Requests {
		t.Errorf("histogram holds %d requests, want %d", n, r.Requests)
	}
}

func TestParseFortioErrors(t *testing.T) {
	in := `{"RequestedQPS":"max","ActualQPS":50,"ActualDuration":1000000000,"NumThreads":2,
	"DurationHistogram":{"Count":10,"Min":0.001,"Max":0.002,"Avg":0.0015,
	"Data":[{"Start":0.001,"End":0.002,"Count":10}]},
	"RetCodes":{"200":7,"403":2,"-1":1},"SocketCount":3}`
	r, err := parseFortio([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if r.TargetQPS != 0 || r.OK != 7 || r.Errors != 3 || r.Sockets != 3 {
		t.Errorf("closed-loop run with errors: %+v", r)
	}
	if math.Abs(r.P50Us-1500) > 1e-9 {
		t.Errorf("p50 %v, want 1500 (middle of the only bucket)", r.P50Us)
	}
	for _, bad := range []string{`{}`, `not json`, `{"DurationHistogram":{"Count":0}}`, `{"RequestedQPS":"fast","DurationHistogram":{"Count":1}}`} {
		if _, err := parseFortio([]byte(bad)); err == nil {
			t.Errorf("parseFortio(%s) accepted", bad)
		}
	}
}

func TestHistogramPercentile(t *testing.T) {
	one := []Bucket{{0, 100, 50}, {100, 200, 50}}
	for _, c := range []struct{ p, want float64 }{{50, 100}, {25, 50}, {75, 150}, {100, 200}, {1, 2}} {
		if got := HistogramPercentile(one, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	// Pooling a run with itself keeps every percentile.
	two := append(append([]Bucket{}, one...), one...)
	for _, p := range []float64{10, 50, 90, 99.9} {
		if a, b := HistogramPercentile(one, p), HistogramPercentile(two, p); math.Abs(a-b) > 1e-9 {
			t.Errorf("p%v: one run %v, pooled with itself %v", p, a, b)
		}
	}
	// Overlapping buckets of different runs: [0,100) x100 and [50,150) x100 -> the cdf is
	// 1/100 per us on [0,50), 2/100 on [50,100), 1/100 on [100,150).
	ov := []Bucket{{0, 100, 100}, {50, 150, 100}}
	for _, c := range []struct{ p, want float64 }{{25, 50}, {50, 75}, {75, 100}, {87.5, 125}} {
		if got := HistogramPercentile(ov, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("overlapping: p%v = %v, want %v", c.p, got, c.want)
		}
	}
	// A zero-width bucket (every sample at one value, as fortio writes for a min==max
	// bucket) and no buckets at all.
	if got := HistogramPercentile([]Bucket{{75, 75, 3}}, 50); got != 75 {
		t.Errorf("zero-width bucket: %v", got)
	}
	if got := HistogramPercentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("no buckets: %v, want NaN", got)
	}
}
