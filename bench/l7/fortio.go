package l7

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// LoadRun is what the benchmark keeps of one fortio run: the rate asked for and achieved,
// the responses by status, and the latency distribution.
type LoadRun struct {
	// TargetQPS is the rate asked for; 0 means as fast as the connections go (closed loop).
	TargetQPS   float64 `json:"target_qps"`
	ActualQPS   float64 `json:"actual_qps"`
	Seconds     float64 `json:"seconds"`
	Connections int     `json:"connections"`
	Requests    int64   `json:"requests"`
	OK          int64   `json:"ok"`     // HTTP 200
	Errors      int64   `json:"errors"` // anything else, socket errors included
	// RetCodes counts responses by status ("-1": socket error), as fortio reports them.
	RetCodes map[string]int64 `json:"ret_codes"`
	// Sockets is how many connections fortio opened: more than Connections means
	// connections were closed under it and reopened.
	Sockets int `json:"sockets"`
	// Latency of each request in microseconds (fortio's histogram, percentiles
	// interpolated inside its buckets; min and max are exact).
	MinUs  float64 `json:"min_us"`
	MeanUs float64 `json:"mean_us"`
	P50Us  float64 `json:"p50_us"`
	P90Us  float64 `json:"p90_us"`
	P99Us  float64 `json:"p99_us"`
	P999Us float64 `json:"p999_us"`
	MaxUs  float64 `json:"max_us"`
	// Histogram keeps the buckets, so that runs can be pooled (more samples for p99.9).
	Histogram []Bucket `json:"histogram,omitempty"`
	// CPUBusy is how busy each CPU was during the run, in percent (index: CPU number): it
	// shows which side was the bottleneck.
	CPUBusy []float64 `json:"cpu_busy_percent,omitempty"`
}

// Bucket is a histogram bucket: Count requests took between StartUs and EndUs.
type Bucket struct {
	StartUs float64 `json:"start_us"`
	EndUs   float64 `json:"end_us"`
	Count   int64   `json:"count"`
}

// fortioJSON is the part of `fortio load -json -` output the benchmark reads.
type fortioJSON struct {
	RequestedQPS      string
	ActualQPS         float64
	ActualDuration    int64 // nanoseconds
	NumThreads        int
	Version           string
	DurationHistogram struct {
		Count int64
		Min   float64 // seconds
		Max   float64
		Avg   float64
		Data  []struct {
			Start, End float64
			Count      int64
		}
		Percentiles []struct {
			Percentile float64
			Value      float64
		}
	}
	RetCodes    map[string]int64
	SocketCount int
}

// ParseFortio reads fortio's JSON report (`fortio load -json -`), for the benchmarks
// that run fortio too.
func ParseFortio(b []byte) (LoadRun, error) { return parseFortio(b) }

// parseFortio reads fortio's JSON report.
func parseFortio(b []byte) (LoadRun, error) {
	var f fortioJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return LoadRun{}, fmt.Errorf("reading fortio report: %w", err)
	}
	h := f.DurationHistogram
	if h.Count == 0 {
		return LoadRun{}, fmt.Errorf("fortio made no requests")
	}
	r := LoadRun{
		ActualQPS:   f.ActualQPS,
		Seconds:     float64(f.ActualDuration) / 1e9,
		Connections: f.NumThreads,
		Requests:    h.Count,
		RetCodes:    f.RetCodes,
		Sockets:     f.SocketCount,
		MinUs:       h.Min * 1e6,
		MeanUs:      h.Avg * 1e6,
		MaxUs:       h.Max * 1e6,
	}
	if f.RequestedQPS != "max" && f.RequestedQPS != "" {
		q, err := strconv.ParseFloat(f.RequestedQPS, 64)
		if err != nil {
			return LoadRun{}, fmt.Errorf("fortio requested qps %q: %w", f.RequestedQPS, err)
		}
		r.TargetQPS = q
	}
	for code, n := range f.RetCodes {
		if code == "200" {
			r.OK += n
		}
	}
	r.Errors = r.Requests - r.OK
	for _, d := range h.Data {
		r.Histogram = append(r.Histogram, Bucket{StartUs: d.Start * 1e6, EndUs: d.End * 1e6, Count: d.Count})
	}
	// Computed from the buckets (the same interpolation fortio uses), so that pooled and
	// single-run percentiles are comparable; fortio's own values are checked in tests.
	r.P50Us = HistogramPercentile(r.Histogram, 50)
	r.P90Us = HistogramPercentile(r.Histogram, 90)
	r.P99Us = HistogramPercentile(r.Histogram, 99)
	r.P999Us = HistogramPercentile(r.Histogram, 99.9)
	return r, nil
}

// HistogramPercentile returns the p-th percentile (0 < p <= 100) of the requests in
// buckets, taking each bucket's requests as spread evenly over it (as fortio does). The
// buckets may come from several runs and overlap; NaN if there are none.
func HistogramPercentile(buckets []Bucket, p float64) float64 {
	var total int64
	var pts []float64
	for _, b := range buckets {
		if b.Count <= 0 {
			continue
		}
		total += b.Count
		pts = append(pts, b.StartUs, b.EndUs)
	}
	if total == 0 {
		return math.NaN()
	}
	slices.Sort(pts)
	pts = slices.Compact(pts)
	target := p / 100 * float64(total)
	// cdf counts the requests at or below x (a zero-width bucket counts from its start).
	cdf := func(x float64) float64 {
		var c float64
		for _, b := range buckets {
			if b.Count <= 0 {
				continue
			}
			switch {
			case x >= b.EndUs:
				c += float64(b.Count)
			case x > b.StartUs:
				c += float64(b.Count) * (x - b.StartUs) / (b.EndUs - b.StartUs)
			}
		}
		return c
	}
	prevX, prevC := pts[0], cdf(pts[0])
	if prevC >= target {
		return prevX
	}
	for _, x := range pts[1:] {
		c := cdf(x)
		if c >= target {
			// Between two consecutive bucket edges the cdf is linear.
			return prevX + (x-prevX)*(target-prevC)/(c-prevC)
		}
		prevX, prevC = x, c
	}
	return pts[len(pts)-1]
}

// pool merges runs' histograms.
func pool(runs []LoadRun) []Bucket {
	var out []Bucket
	for _, r := range runs {
		out = append(out, r.Histogram...)
	}
	return out
}
