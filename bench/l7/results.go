package l7

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Targets from the issue: L7 keeps at least TargetL7OverL4 of the L4 configuration's
// highest sustained rate, and forty L7 rules keep at least TargetManyOverOne of one L7
// rule's (within 5 %).
const (
	TargetL7OverL4    = 0.7
	TargetManyOverOne = 0.95
)

// Schema names the layout of the JSON report; bump it when fields change meaning.
const Schema = "rampart.bench.l7/v1"

// Verdicts of a configuration.
const (
	VerdictMeasured     = "MEASURED"
	VerdictInvalid      = "INVALID"       // errors: no trustworthy numbers (see Errors)
	VerdictNotAvailable = "NOT AVAILABLE" // the agent cannot enforce it yet (see NotAvailable)
)

// Verdicts of a comparison.
const (
	VerdictPass = "PASS"
	VerdictMiss = "MISS"
)

// Result is the whole JSON report of one run.
type Result struct {
	Schema      string       `json:"schema"`
	Started     time.Time    `json:"started"`
	Finished    time.Time    `json:"finished"`
	Host        HostInfo     `json:"host"`
	Settings    Settings     `json:"settings"`
	Cases       []CaseResult `json:"cases"`
	Comparisons []Comparison `json:"comparisons"`
	Errors      []string     `json:"errors,omitempty"`     // run-level failures (set-up, clean-up)
	Incomplete  bool         `json:"incomplete,omitempty"` // interrupted before all rounds ran
	JSONPath    string       `json:"-"`
	PlotPath    string       `json:"-"`
	TablePath   string       `json:"-"`
}

// HostInfo says where the numbers come from; they only compare within one machine.
type HostInfo struct {
	benchkit.Machine
	Fortio string `json:"fortio"`
	// Proxy is the L7 proxy the agent ran (its binary and version), if any configuration
	// needed one.
	Proxy string `json:"proxy,omitempty"`
	// BPFStats is what the run found of kernel.bpf_stats_enabled and did about it: the
	// statistics add two clock reads to every BPF program run (benchkit.BPFStatsOff).
	BPFStats string `json:"bpf_stats"`
	// Load averages (1 min) before and after the run: other work on a shared machine is
	// the main source of noise.
	LoadStart float64 `json:"load_start"`
	LoadEnd   float64 `json:"load_end"`
}

// Settings are the knobs the run used.
type Settings struct {
	Quick            bool      `json:"quick"`
	Repeats          int       `json:"repeats"`
	RateQPS          float64   `json:"rate_qps"` // the fixed rate of the latency runs
	LatencySeconds   float64   `json:"latency_seconds"`
	SaturationSecs   float64   `json:"saturation_seconds"`
	StepSeconds      float64   `json:"step_seconds"`
	SearchSteps      int       `json:"search_steps"`
	Connections      int       `json:"connections"`
	Criterion        Criterion `json:"criterion"`
	L7Rules          int       `json:"l7_rules"` // of the many-rules configuration
	InterleavedCases bool      `json:"interleaved_cases"`
	// CPU lists the processes are pinned to ("" = not pinned): the load generator in the
	// client endpoint, the HTTP server, and the agent with the proxy it runs.
	ClientCPUs string `json:"client_cpus"`
	ServerCPUs string `json:"server_cpus"`
	ProxyCPUs  string `json:"proxy_cpus"`
	// EnvoyOnly: the agent ran without its HTTP/1.1 fast path (every L7 request through
	// Envoy).
	EnvoyOnly bool `json:"envoy_only"`
	// SendSide: the agent ran with --l7-send-side (L7 rules the kernel can match checked
	// on the client's socket, no proxy hop).
	SendSide bool   `json:"send_side"`
	PodCIDR  string `json:"pod_cidr"`
	// Instance is the agent's instance name: every namespace, link and pin the run creates
	// carries it.
	Instance string `json:"instance"`
}

// CaseResult holds one configuration's samples (one per round) and their summary.
type CaseResult struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Layer       string `json:"layer,omitempty"`
	Rules       int    `json:"rules"`
	// NotAvailable says why a configuration was not measured (the agent cannot enforce it
	// yet); such a configuration has no samples and no numbers.
	NotAvailable string   `json:"not_available,omitempty"`
	Manifest     string   `json:"manifest,omitempty"`
	Samples      []Sample `json:"samples"`
	Errors       []string `json:"errors,omitempty"`
	Summary      Summary  `json:"summary"`
}

// Sample is one round of one configuration.
type Sample struct {
	Round int `json:"round"`
	// Time from starting `rampart apply` until it returned, and until every enforcement
	// check passed (for L7: the proxy answers as the policy says).
	ApplySeconds    float64 `json:"apply_seconds,omitempty"`
	EnforcedSeconds float64 `json:"enforced_seconds,omitempty"`
	DeleteSeconds   float64 `json:"delete_seconds,omitempty"`
	// MapEntries is the number of the server's policy map entries while the policy was
	// applied; AgentPolicies what `rampart status` reported as stored.
	MapEntries    int `json:"map_entries,omitempty"`
	AgentPolicies int `json:"agent_policies,omitempty"`
	// ProxyProcesses is the number of proxy (envoy) processes the agent ran while the
	// configuration was measured.
	ProxyProcesses int `json:"proxy_processes"`
	// Probes are the enforcement checks run before measuring (name -> outcome).
	Probes map[string]string `json:"probes,omitempty"`
	// Latency is the run at the fixed rate; LatencySustained whether it met the criterion.
	Latency          LoadRun `json:"latency"`
	LatencySustained bool    `json:"latency_sustained"`
	LatencyWhy       string  `json:"latency_why,omitempty"`
	// Saturation is the closed-loop run (every connection sends its next request as soon
	// as the last one is answered): the ceiling of the search.
	Saturation LoadRun `json:"saturation"`
	Steps      []Step  `json:"steps"`
	// SustainedQPS is the highest rate that met the criterion (0: none did).
	SustainedQPS float64 `json:"sustained_qps"`
	// Incidents are load runs that failed and were retried (see runner.loadRetry).
	Incidents []string `json:"incidents,omitempty"`
}

// Summary is the configuration over all rounds. Latency percentiles (and max) are medians
// over rounds of each round's value, so that one round disturbed by other work on the
// machine does not set the tail (the pooled percentiles of all rounds are kept too); rates
// are medians over rounds; ratios to the no-policy configuration are medians of per-round
// ratios, which cancel slow drift of the machine better than a ratio of medians.
type Summary struct {
	Verdict           string         `json:"verdict"`
	Rounds            int            `json:"rounds"`
	Requests          int64          `json:"requests"` // at the fixed rate, all rounds
	ActualQPS         benchkit.Float `json:"actual_qps"`
	LatencySustained  int            `json:"latency_sustained_rounds"`
	MeanUs            benchkit.Float `json:"mean_us"`
	P50Us             benchkit.Float `json:"p50_us"`
	P90Us             benchkit.Float `json:"p90_us"`
	P99Us             benchkit.Float `json:"p99_us"`
	P999Us            benchkit.Float `json:"p999_us"`
	MaxUs             benchkit.Float `json:"max_us"`
	WorstMaxUs        benchkit.Float `json:"worst_max_us"` // the largest of all rounds
	PooledP99Us       benchkit.Float `json:"pooled_p99_us"`
	PooledP999Us      benchkit.Float `json:"pooled_p999_us"`
	SustainedQPS      benchkit.Float `json:"sustained_qps"`
	SustainedMinQPS   benchkit.Float `json:"sustained_min_qps"`
	SustainedMaxQPS   benchkit.Float `json:"sustained_max_qps"`
	SaturationQPS     benchkit.Float `json:"saturation_qps"`
	SustainedVsNone   benchkit.Float `json:"sustained_vs_no_policy"`
	P99VsNone         benchkit.Float `json:"p99_vs_no_policy"`
	EnforcedSeconds   benchkit.Float `json:"enforced_seconds"`
	Incidents         int            `json:"incidents"`                             // retried load runs, all rounds
	SaturationCPUBusy []float64      `json:"saturation_cpu_busy_percent,omitempty"` // median per CPU
}

// Comparison is one of the ratios between two configurations.
type Comparison struct {
	Name        string  `json:"name"`
	Numerator   string  `json:"numerator"`
	Denominator string  `json:"denominator"`
	Target      float64 `json:"target"`
	// Ratio is the median over rounds of the numerator's sustained rate over the
	// denominator's in the same round; Min and Max show the spread.
	Ratio  benchkit.Float `json:"ratio"`
	Min    benchkit.Float `json:"ratio_min"`
	Max    benchkit.Float `json:"ratio_max"`
	Rounds int            `json:"rounds"`
	// Latency at the fixed rate, numerator over denominator (pooled percentiles).
	P50Ratio benchkit.Float `json:"p50_ratio"`
	P99Ratio benchkit.Float `json:"p99_ratio"`
	Verdict  string         `json:"verdict"` // PASS, MISS, NOT AVAILABLE or INVALID
	Note     string         `json:"note,omitempty"`
}

// comparisonDefs are the ratios.
var comparisonDefs = []struct {
	name, num, den string
	target         float64
}{
	{"L7/L4 throughput", CaseL7, CaseL4, TargetL7OverL4},
	{"40 rules/1 rule throughput", CaseL7Many, CaseL7, TargetManyOverOne},
}

// summarize fills every case's Summary and the comparisons.
func summarize(res *Result) {
	byName := map[string]*CaseResult{}
	for i := range res.Cases {
		c := &res.Cases[i]
		byName[c.Name] = c
		c.Summary = summarizeCase(c)
	}
	if none := byName[CaseNone]; none != nil && none.Summary.Verdict == VerdictMeasured {
		for i := range res.Cases {
			c := &res.Cases[i]
			if c.Summary.Verdict != VerdictMeasured {
				continue
			}
			c.Summary.SustainedVsNone = roundRatio(c.Samples, none.Samples)
			c.Summary.P99VsNone = benchkit.Float(benchkit.Ratio(float64(c.Summary.P99Us), float64(none.Summary.P99Us)))
		}
	}
	res.Comparisons = nil
	for _, d := range comparisonDefs {
		res.Comparisons = append(res.Comparisons, compare(d.name, byName[d.num], byName[d.den], d.num, d.den, d.target))
	}
}

func summarizeCase(c *CaseResult) Summary {
	s := Summary{Rounds: len(c.Samples)}
	nan := benchkit.NaN()
	s.ActualQPS, s.MeanUs, s.P50Us, s.P90Us, s.P99Us, s.P999Us, s.MaxUs = nan, nan, nan, nan, nan, nan, nan
	s.WorstMaxUs, s.PooledP99Us, s.PooledP999Us = nan, nan, nan
	s.SustainedQPS, s.SustainedMinQPS, s.SustainedMaxQPS, s.SaturationQPS = nan, nan, nan, nan
	s.SustainedVsNone, s.P99VsNone, s.EnforcedSeconds = nan, nan, nan
	switch {
	case c.NotAvailable != "":
		s.Verdict = VerdictNotAvailable
		return s
	case len(c.Errors) > 0 || len(c.Samples) == 0:
		s.Verdict = VerdictInvalid
	default:
		s.Verdict = VerdictMeasured
	}
	var lat []LoadRun
	var qps, sust, sat, enforced, mean, p50, p90, p99, p999, mx []float64
	var busy [][]float64
	for _, x := range c.Samples {
		lat = append(lat, x.Latency)
		s.Requests += x.Latency.Requests
		qps = append(qps, x.Latency.ActualQPS)
		mean = append(mean, x.Latency.MeanUs)
		if x.LatencySustained {
			s.LatencySustained++
		}
		s.WorstMaxUs = benchkit.Float(maxValid(float64(s.WorstMaxUs), x.Latency.MaxUs))
		p50 = append(p50, x.Latency.P50Us)
		p90 = append(p90, x.Latency.P90Us)
		p99 = append(p99, x.Latency.P99Us)
		p999 = append(p999, x.Latency.P999Us)
		mx = append(mx, x.Latency.MaxUs)
		sust = append(sust, x.SustainedQPS)
		sat = append(sat, x.Saturation.ActualQPS)
		busy = append(busy, x.Saturation.CPUBusy)
		if x.EnforcedSeconds > 0 {
			enforced = append(enforced, x.EnforcedSeconds)
		}
		s.Incidents += len(x.Incidents)
	}
	h := pool(lat)
	s.ActualQPS = benchkit.Float(benchkit.Median(qps))
	s.MeanUs = benchkit.Float(benchkit.Median(mean))
	s.P50Us = benchkit.Float(benchkit.Median(p50))
	s.P90Us = benchkit.Float(benchkit.Median(p90))
	s.P99Us = benchkit.Float(benchkit.Median(p99))
	s.P999Us = benchkit.Float(benchkit.Median(p999))
	s.MaxUs = benchkit.Float(benchkit.Median(mx))
	s.PooledP99Us = benchkit.Float(HistogramPercentile(h, 99))
	s.PooledP999Us = benchkit.Float(HistogramPercentile(h, 99.9))
	s.SustainedQPS = benchkit.Float(benchkit.Median(sust))
	lo, hi := benchkit.MinMax(sust)
	s.SustainedMinQPS, s.SustainedMaxQPS = benchkit.Float(lo), benchkit.Float(hi)
	s.SaturationQPS = benchkit.Float(benchkit.Median(sat))
	if len(enforced) > 0 {
		s.EnforcedSeconds = benchkit.Float(benchkit.Median(enforced))
	}
	s.SaturationCPUBusy = medianPerCPU(busy)
	return s
}

func maxValid(a, b float64) float64 {
	if math.IsNaN(a) {
		return b
	}
	return math.Max(a, b)
}

// medianPerCPU returns, per CPU, the median over runs.
func medianPerCPU(runs [][]float64) []float64 {
	n := 0
	for _, r := range runs {
		n = max(n, len(r))
	}
	var out []float64
	for cpu := range n {
		var xs []float64
		for _, r := range runs {
			if cpu < len(r) {
				xs = append(xs, r[cpu])
			}
		}
		out = append(out, math.Round(benchkit.Median(xs)*10)/10)
	}
	return out
}

// roundRatios returns num's sustained rate over den's for every round both measured.
func roundRatios(num, den []Sample) []float64 {
	byRound := map[int]Sample{}
	for _, s := range den {
		byRound[s.Round] = s
	}
	var out []float64
	for _, s := range num {
		if d, ok := byRound[s.Round]; ok {
			if r := benchkit.Ratio(s.SustainedQPS, d.SustainedQPS); !math.IsNaN(r) {
				out = append(out, r)
			}
		}
	}
	return out
}

func roundRatio(num, den []Sample) benchkit.Float {
	return benchkit.Float(benchkit.Median(roundRatios(num, den)))
}

func compare(name string, num, den *CaseResult, numName, denName string, target float64) Comparison {
	c := Comparison{Name: name, Numerator: numName, Denominator: denName, Target: target}
	nan := benchkit.NaN()
	c.Ratio, c.Min, c.Max, c.P50Ratio, c.P99Ratio = nan, nan, nan, nan, nan
	for _, x := range []*CaseResult{num, den} {
		if x == nil {
			c.Verdict = VerdictNotAvailable
			c.Note = "not run (excluded by --cases)"
			return c
		}
	}
	// A side that cannot be measured at all says more than one that failed.
	for _, x := range []*CaseResult{num, den} {
		if x.Summary.Verdict == VerdictNotAvailable {
			c.Verdict = VerdictNotAvailable
			c.Note = x.Name + ": " + x.NotAvailable
			return c
		}
	}
	for _, x := range []*CaseResult{num, den} {
		if x.Summary.Verdict == VerdictInvalid {
			c.Verdict = VerdictInvalid
			c.Note = x.Name + " has errors"
			return c
		}
	}
	rs := roundRatios(num.Samples, den.Samples)
	c.Rounds = len(rs)
	c.Ratio = benchkit.Float(benchkit.Median(rs))
	lo, hi := benchkit.MinMax(rs)
	c.Min, c.Max = benchkit.Float(lo), benchkit.Float(hi)
	c.P50Ratio = benchkit.Float(benchkit.Ratio(float64(num.Summary.P50Us), float64(den.Summary.P50Us)))
	c.P99Ratio = benchkit.Float(benchkit.Ratio(float64(num.Summary.P99Us), float64(den.Summary.P99Us)))
	switch {
	case !c.Ratio.Valid():
		c.Verdict = VerdictInvalid
		c.Note = "no round with a sustained rate for both"
	case float64(c.Ratio) >= target:
		c.Verdict = VerdictPass
	default:
		c.Verdict = VerdictMiss
	}
	return c
}

// baseName is the file name stem of a run's outputs.
func (r *Result) baseName() string {
	return benchkit.Stamped("l7", r.Started)
}

// WriteJSON writes the report to dir/l7-<timestamp>.json and returns the path.
func (r *Result) WriteJSON(dir string) (string, error) {
	p := filepath.Join(dir, r.baseName()+".json")
	if err := benchkit.WriteJSON(p, r); err != nil {
		return "", err
	}
	r.JSONPath = p
	return p, nil
}

// WriteTable writes the markdown table (WriteMarkdown) to dir/l7-<timestamp>.md.
func (r *Result) WriteTable(dir string) (string, error) {
	var b strings.Builder
	r.WriteMarkdown(&b)
	p := filepath.Join(dir, r.baseName()+".md")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("writing table: %w", err)
	}
	r.TablePath = p
	return p, nil
}

// WriteMarkdown writes the report as markdown tables: one row per configuration, then the
// issue's ratios with PASS/MISS, then how the numbers were made.
func (r *Result) WriteMarkdown(w io.Writer) {
	st := r.Settings
	fmt.Fprintf(w, "Latency at a fixed %.0f requests/s (%d connections, %s per round; each percentile and the max is the median over %d rounds) and the highest sustained rate (median over rounds, min-max):\n\n",
		st.RateQPS, st.Connections, secs(st.LatencySeconds), st.Repeats)
	fmt.Fprintln(w, "| configuration | rules | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | sustained req/s (min-max) | vs no policy | closed-loop req/s | state |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, c := range r.Cases {
		s := c.Summary
		rules := "-"
		if c.Rules > 0 {
			rules = fmt.Sprint(c.Rules)
		}
		state := s.Verdict
		switch s.Verdict {
		case VerdictNotAvailable:
			state = "not available: " + c.NotAvailable
		case VerdictMeasured:
			state = "measured"
			if s.LatencySustained < s.Rounds {
				state += fmt.Sprintf("; fixed rate not sustained in %d of %d rounds", s.Rounds-s.LatencySustained, s.Rounds)
			}
			if s.Incidents > 0 {
				state += fmt.Sprintf("; %d load runs retried (see incidents)", s.Incidents)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s (%s-%s) | %s | %s | %s |\n",
			c.Name, rules, ms(s.P50Us), ms(s.P90Us), ms(s.P99Us), ms(s.P999Us), ms(s.MaxUs),
			num(s.SustainedQPS, 0), num(s.SustainedMinQPS, 0), num(s.SustainedMaxQPS, 0),
			num(s.SustainedVsNone, 2), num(s.SaturationQPS, 0), mdEscape(state))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| ratio | value (min-max over rounds) | target | verdict | p50 ratio | p99 ratio at fixed rate |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|---:|")
	for _, c := range r.Comparisons {
		v := c.Verdict
		if c.Note != "" {
			v += ": " + c.Note
		}
		fmt.Fprintf(w, "| %s (%s / %s) | %s (%s-%s) | >= %.2f | %s | %s | %s |\n",
			c.Name, c.Numerator, c.Denominator, num(c.Ratio, 3), num(c.Min, 2), num(c.Max, 2), c.Target,
			mdEscape(v), num(c.P50Ratio, 2), num(c.P99Ratio, 2))
	}
	fmt.Fprintln(w)
	cr := st.Criterion
	fmt.Fprintf(w, "Sustained: every response 200, achieved >= %.0f%% of the target rate, p99 <= %s, in a %s run; searched by %d bisection steps between %.2f and %.2f x the closed-loop rate.\n",
		100*cr.MinAchieved, ms(benchkit.Float(cr.P99BoundUs))+" ms", secs(st.StepSeconds), st.SearchSteps, searchLow, searchHigh)
	fmt.Fprintf(w, "CPUs: load generator %s, HTTP server %s, agent and proxy %s; %d CPUs; load average %.2f at start, %.2f at end.\n",
		cpuText(st.ClientCPUs), cpuText(st.ServerCPUs), cpuText(st.ProxyCPUs), r.Host.CPUs, r.Host.LoadStart, r.Host.LoadEnd)
	if r.Host.BPFStats != "" {
		fmt.Fprintf(w, "BPF run-time statistics (kernel.bpf_stats_enabled): %s.\n", r.Host.BPFStats)
	}
	if st.SendSide {
		fmt.Fprintln(w, "L7 path: send-side verdict (--send-side): the L7 rules the kernel can match are checked on the client's socket, with no proxy hop; others as below.")
	}
	if st.EnvoyOnly {
		fmt.Fprintln(w, "L7 path: Envoy only (--envoy-only): every L7 request through Envoy, no fast path.")
	} else {
		fmt.Fprintln(w, "L7 path: the agent's HTTP/1.1 fast path (Envoy for what it hands over).")
	}
	for _, c := range r.Cases {
		for _, x := range c.Samples {
			for _, in := range x.Incidents {
				fmt.Fprintf(w, "\n%s: incident in round %d: %s\n", c.Name, x.Round+1, in)
			}
		}
		for _, e := range c.Errors {
			fmt.Fprintf(w, "\n%s: error: %s\n", c.Name, e)
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "\nerror: %s\n", e)
	}
}

func cpuText(s string) string {
	if s == "" {
		return "unpinned"
	}
	return "CPU " + s
}

func secs(s float64) string { return strings.TrimSuffix(fmt.Sprintf("%.1f", s), ".0") + " s" }

func ms(us benchkit.Float) string {
	if !us.Valid() {
		return "n/a"
	}
	v := float64(us) / 1000
	switch {
	case v < 10:
		return fmt.Sprintf("%.3f", v)
	case v < 100:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func num(v benchkit.Float, prec int) string {
	if !v.Valid() {
		return "n/a"
	}
	return fmt.Sprintf("%.*f", prec, float64(v))
}

func mdEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}
