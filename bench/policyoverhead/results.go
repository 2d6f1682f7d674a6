package policyoverhead

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// TargetThroughputRatio is the target: every case keeps at least this fraction of
// the no-agent baseline's TCP throughput.
const TargetThroughputRatio = 0.95

// Schema names the layout of the JSON report; bump it when fields change meaning.
const Schema = "rampart.bench.policy-overhead/v1"

// Verdicts printed per case.
const (
	VerdictBaseline = "BASELINE"
	VerdictPass     = "PASS"    // throughput ratio >= TargetThroughputRatio
	VerdictMiss     = "MISS"    // below the target
	VerdictInvalid  = "INVALID" // errors: no trustworthy numbers (see Errors)
	VerdictControl  = "CONTROL" // the A/A control: its ratio is noise, not a result
)

// Result is the whole JSON report of one run.
type Result struct {
	Schema     string       `json:"schema"`
	Started    time.Time    `json:"started"`
	Finished   time.Time    `json:"finished"`
	Host       HostInfo     `json:"host"`
	Settings   Settings     `json:"settings"`
	Target     float64      `json:"target_throughput_ratio"`
	Cases      []CaseResult `json:"cases"`
	Errors     []string     `json:"errors,omitempty"` // run-level failures (set-up, clean-up)
	JSONPath   string       `json:"-"`
	PlotPath   string       `json:"-"`
	Incomplete bool         `json:"incomplete,omitempty"` // interrupted before all rounds ran
	// Pooled is how many runs Pool merged into this result (0: a single run).
	Pooled int `json:"pooled,omitempty"`
}

// HostInfo says where the numbers come from; they only compare within one machine.
type HostInfo struct {
	benchkit.Machine
	Iperf3 string `json:"iperf3"`
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
	Quick            bool    `json:"quick"`
	Repeats          int     `json:"repeats"`
	IperfSeconds     int     `json:"iperf_seconds"`
	RRSeconds        float64 `json:"rr_seconds"`
	RRRequestBytes   int     `json:"rr_request_bytes"`
	RRResponseBytes  int     `json:"rr_response_bytes"`
	PodCIDRBaseline  string  `json:"pod_cidr_baseline"`
	PodCIDRAgent     string  `json:"pod_cidr_agent,omitempty"`
	InterleavedCases bool    `json:"interleaved_cases"`
	CPU              int     `json:"cpu"`            // measured processes pinned here; -1: unpinned
	IPv6             bool    `json:"ipv6,omitempty"` // every case over IPv6 (dual-stack topologies)
	// Instance names: every namespace, link and pin the run creates carries one of them.
	BaselineInstance string `json:"baseline_instance"`
	AgentInstance    string `json:"agent_instance,omitempty"`
	ControlInstance  string `json:"control_instance,omitempty"`
	ObservedInstance string `json:"observed_instance,omitempty"`
	// ObservedReads counts what the observed agent's readers read (CaseObserved).
	ObservedReads *ObservedReads `json:"observed_reads,omitempty"`
}

// CaseResult holds one case's samples (one per round) and their summary.
type CaseResult struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Agent       bool     `json:"agent"`
	Control     bool     `json:"control,omitempty"`
	Rules       int      `json:"rules"`
	Samples     []Sample `json:"samples"`
	Errors      []string `json:"errors,omitempty"`
	Summary     Summary  `json:"summary"`
}

// Sample is one measurement of one case.
type Sample struct {
	Round int `json:"round"`
	// Pair links an agent case's sample to the baseline sample measured next to it; the
	// baseline has one sample per pair.
	Pair  int               `json:"pair"`
	Iperf IperfResult       `json:"iperf"`
	RR    benchkit.RRResult `json:"rr"`
	// Agent cases: time from starting `rampart apply` until it returned, and until the
	// server's policy map held the expected entries (enforced).
	ApplySeconds    float64 `json:"apply_seconds,omitempty"`
	EnforcedSeconds float64 `json:"enforced_seconds,omitempty"`
	// DeleteSeconds: `rampart delete` until the server's entries were gone.
	DeleteSeconds float64 `json:"delete_seconds,omitempty"`
	// MapEntries is the number of policy map entries of the server endpoint while the
	// case's policy was applied.
	MapEntries int `json:"map_entries,omitempty"`
	// AgentPolicies is the number of policies the agent reported storing (rampart status).
	AgentPolicies int `json:"agent_policies,omitempty"`
	// Probes are the enforcement checks run before measuring (name -> outcome).
	Probes map[string]string `json:"probes,omitempty"`
}

// Summary is the medians over samples and the ratios to the baseline. Ratios are medians
// of per-pair ratios (each sample over the baseline sample measured right next to it),
// which cancels the machine's drift and other work better than a ratio of medians.
type Summary struct {
	Rounds             int     `json:"rounds"`
	ThroughputBps      float64 `json:"throughput_bps"`
	ThroughputMinBps   float64 `json:"throughput_min_bps"`
	ThroughputMaxBps   float64 `json:"throughput_max_bps"`
	Retransmits        float64 `json:"retransmits"`
	TPS                float64 `json:"tps"`
	P50Us              float64 `json:"p50_us"`
	P90Us              float64 `json:"p90_us"`
	P99Us              float64 `json:"p99_us"`
	ApplySeconds       float64 `json:"apply_seconds,omitempty"`
	EnforcedSeconds    float64 `json:"enforced_seconds,omitempty"`
	MapEntries         int     `json:"map_entries,omitempty"`
	ThroughputRatio    float64 `json:"throughput_ratio"`
	ThroughputRatioMin float64 `json:"throughput_ratio_min"` // over rounds: shows the noise
	ThroughputRatioMax float64 `json:"throughput_ratio_max"`
	TPSRatio           float64 `json:"tps_ratio"`
	P50Ratio           float64 `json:"p50_ratio"`
	P90Ratio           float64 `json:"p90_ratio"`
	P99Ratio           float64 `json:"p99_ratio"`
	Verdict            string  `json:"verdict"`
}

// summarize fills every case's Summary; cases[0] must be the baseline.
func summarize(cases []CaseResult) {
	if len(cases) == 0 {
		return
	}
	base := map[int]Sample{}
	for _, s := range cases[0].Samples {
		base[s.Pair] = s
	}
	for i := range cases {
		c := &cases[i]
		var tput, retr, tps, p50, p90, p99, apply, enforced []float64
		var rt, rtps, r50, r90, r99 []float64
		entries := 0
		for _, s := range c.Samples {
			tput = append(tput, s.Iperf.BitsPerSecond)
			retr = append(retr, float64(s.Iperf.Retransmits))
			tps = append(tps, s.RR.TPS)
			p50 = append(p50, s.RR.P50Us)
			p90 = append(p90, s.RR.P90Us)
			p99 = append(p99, s.RR.P99Us)
			if c.Agent {
				apply = append(apply, s.ApplySeconds)
				enforced = append(enforced, s.EnforcedSeconds)
			}
			entries = max(entries, s.MapEntries)
			if b, ok := base[s.Pair]; ok {
				rt = append(rt, ratio(s.Iperf.BitsPerSecond, b.Iperf.BitsPerSecond))
				rtps = append(rtps, ratio(s.RR.TPS, b.RR.TPS))
				r50 = append(r50, ratio(s.RR.P50Us, b.RR.P50Us))
				r90 = append(r90, ratio(s.RR.P90Us, b.RR.P90Us))
				r99 = append(r99, ratio(s.RR.P99Us, b.RR.P99Us))
			}
		}
		lo, hi := benchkit.MinMax(tput)
		rlo, rhi := benchkit.MinMax(rt)
		c.Summary = Summary{
			Rounds:             len(c.Samples),
			ThroughputBps:      benchkit.Median(tput),
			ThroughputMinBps:   lo,
			ThroughputMaxBps:   hi,
			Retransmits:        benchkit.Median(retr),
			TPS:                benchkit.Median(tps),
			P50Us:              benchkit.Median(p50),
			P90Us:              benchkit.Median(p90),
			P99Us:              benchkit.Median(p99),
			MapEntries:         entries,
			ThroughputRatio:    benchkit.Median(rt),
			ThroughputRatioMin: rlo,
			ThroughputRatioMax: rhi,
			TPSRatio:           benchkit.Median(rtps),
			P50Ratio:           benchkit.Median(r50),
			P90Ratio:           benchkit.Median(r90),
			P99Ratio:           benchkit.Median(r99),
		}
		if c.Agent {
			c.Summary.ApplySeconds = benchkit.Median(apply)
			c.Summary.EnforcedSeconds = benchkit.Median(enforced)
		}
		switch {
		case len(c.Errors) > 0 || len(c.Samples) == 0 || math.IsNaN(c.Summary.ThroughputRatio):
			c.Summary.Verdict = VerdictInvalid
		case i == 0:
			c.Summary.Verdict = VerdictBaseline
		case c.Control:
			c.Summary.Verdict = VerdictControl
		case c.Summary.ThroughputRatio >= TargetThroughputRatio:
			c.Summary.Verdict = VerdictPass
		default:
			c.Summary.Verdict = VerdictMiss
		}
	}
}

func ratio(x, base float64) float64 {
	if base <= 0 {
		return math.NaN()
	}
	return x / base
}

// MarshalJSON writes NaN (no samples, or no baseline to compare with) as null, which
// encoding/json refuses to do for a float64 by itself.
func (s Summary) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(s)
	t := v.Type()
	var b bytes.Buffer
	b.WriteByte('{')
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		f := v.Field(i)
		if opts == "omitempty" && f.IsZero() {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:", name)
		x := f.Interface()
		if fl, ok := x.(float64); ok && (math.IsNaN(fl) || math.IsInf(fl, 0)) {
			x = nil
		}
		e, err := json.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", name, err)
		}
		b.Write(e)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// WriteJSON writes the report to dir/policy-overhead-<timestamp>.json and returns the path.
func (r *Result) WriteJSON(dir string) (string, error) {
	p := filepath.Join(dir, benchkit.Stamped("policy-overhead", r.Started)+".json")
	if err := benchkit.WriteJSON(p, r); err != nil {
		return "", err
	}
	r.JSONPath = p
	return p, nil
}

// tableRows returns the header and one row per case of the summary table.
func (r *Result) tableRows() [][]string {
	rows := [][]string{{"case", "rules", "map entries", "Gbit/s (min-max)", "ratio (min-max)", "verdict",
		"TPS", "ratio", "p50 us", "p90 us", "p99 us", "p50 ratio", "p99 ratio", "enforced s"}}
	for _, c := range r.Cases {
		s := c.Summary
		rules, entries, setup := "-", "-", "-"
		if c.Agent {
			rules = fmt.Sprint(c.Rules)
			entries = fmt.Sprint(s.MapEntries)
			if c.Rules > 0 {
				setup = fmtF(s.EnforcedSeconds, 3)
			}
		}
		rows = append(rows, []string{
			c.Name, rules, entries,
			fmt.Sprintf("%s (%s-%s)", fmtF(s.ThroughputBps/1e9, 2), fmtF(s.ThroughputMinBps/1e9, 2), fmtF(s.ThroughputMaxBps/1e9, 2)),
			fmt.Sprintf("%s (%s-%s)", fmtF(s.ThroughputRatio, 3), fmtF(s.ThroughputRatioMin, 2), fmtF(s.ThroughputRatioMax, 2)),
			s.Verdict,
			fmtF(s.TPS, 0), fmtF(s.TPSRatio, 3),
			fmtF(s.P50Us, 1), fmtF(s.P90Us, 1), fmtF(s.P99Us, 1),
			fmtF(s.P50Ratio, 3), fmtF(s.P99Ratio, 3), setup,
		})
	}
	return rows
}

// PrintTable writes the per-case table with ratios to the baseline and PASS/MISS.
func (r *Result) PrintTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range r.tableRows() {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	r.printNotes(w)
}

// PrintMarkdown writes the same table as Markdown, for docs.
func (r *Result) PrintMarkdown(w io.Writer) {
	for i, row := range r.tableRows() {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		if i == 0 {
			fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(row)))
		}
	}
	fmt.Fprintln(w)
	r.printNotes(w)
}

func (r *Result) printNotes(w io.Writer) {
	if r.Settings.IPv6 {
		fmt.Fprintln(w, "every case over IPv6 (dual-stack topologies, traffic to the server's IPv6 address)")
	}
	fmt.Fprintf(w, "target: throughput ratio >= %.2f of the no-agent baseline measured in the same run\n", TargetThroughputRatio)
	fmt.Fprintf(w, "ratios: medians over %d rounds of sample / baseline sample measured next to it; (min-max) shows the noise\n",
		r.Settings.Repeats)
	if r.Pooled > 1 {
		fmt.Fprintf(w, "pooled: the pairs of %d runs, %s to %s\n", r.Pooled,
			r.Started.UTC().Format("2006-01-02 15:04"), r.Finished.UTC().Format("2006-01-02 15:04 MST"))
	}
	fmt.Fprintf(w, "load average %.2f at start, %.2f at end (%d CPUs)\n", r.Host.LoadStart, r.Host.LoadEnd, r.Host.CPUs)
	if r.Host.BPFStats != "" {
		fmt.Fprintf(w, "BPF run-time statistics (kernel.bpf_stats_enabled): %s\n", r.Host.BPFStats)
	}
	for _, c := range r.Cases {
		for _, e := range c.Errors {
			fmt.Fprintf(w, "%s: error: %s\n", c.Name, e)
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}

// ReadResult reads a JSON report written by WriteJSON. Ratios written as null (no
// numbers) read back as NaN.
func ReadResult(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading report: %w", err)
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parsing report %s: %w", path, err)
	}
	if r.Schema != Schema {
		return nil, fmt.Errorf("report %s: schema %q, want %q", path, r.Schema, Schema)
	}
	r.JSONPath = path
	return &r, nil
}

// UnmarshalJSON reads null numbers as NaN, the inverse of MarshalJSON.
func (s *Summary) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	v := reflect.ValueOf(s).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		raw, ok := m[name]
		f := v.Field(i)
		if ok && string(raw) == "null" && f.Kind() == reflect.Float64 {
			f.SetFloat(math.NaN())
			continue
		}
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, f.Addr().Interface()); err != nil {
			return fmt.Errorf("summary field %s: %w", name, err)
		}
	}
	return nil
}

func fmtF(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return strings.TrimSpace(fmt.Sprintf("%.*f", prec, v))
}
