package egress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Schema names the layout of the JSON report; bump it when fields change meaning.
const Schema = "rampart.bench.egress/v1"

// Statuses of one filter at one count.
const (
	StatusMeasured     = "MEASURED"
	StatusBaseline     = "BASELINE"      // the no-filter row: the pairs' baseline samples
	StatusControl      = "CONTROL"       // no filter on the peers' topology, paired like a filter (A/A)
	StatusSkipped      = "SKIPPED"       // predicted over the time or memory budget (see Prediction)
	StatusFailed       = "FAILED"        // the filter could not hold the list (see Reason)
	StatusNotAvailable = "NOT AVAILABLE" // the filter cannot run here at all (see Reason)
	StatusInvalid      = "INVALID"       // measured with errors: no trustworthy numbers (see Errors)
)

// Verdicts of a target.
const (
	VerdictPass         = "PASS"
	VerdictMiss         = "MISS"
	VerdictNotAvailable = "NOT AVAILABLE"
)

// Result is the whole JSON report of one run.
type Result struct {
	Schema     string        `json:"schema"`
	Started    time.Time     `json:"started"`
	Finished   time.Time     `json:"finished"`
	Host       HostInfo      `json:"host"`
	Settings   Settings      `json:"settings"`
	Counts     []CountResult `json:"counts"`
	Targets    []Target      `json:"targets"`
	Errors     []string      `json:"errors,omitempty"`     // run-level failures (set-up, clean-up)
	Incomplete bool          `json:"incomplete,omitempty"` // interrupted before every case ran
	JSONPath   string        `json:"-"`
	TablePath  string        `json:"-"`
	PlotPath   string        `json:"-"`
}

// HostInfo says where the numbers come from; they only compare within one machine.
type HostInfo struct {
	benchkit.Machine
	// MemAvailableBytes is /proc/meminfo's MemAvailable at the start.
	MemAvailableBytes int64 `json:"mem_available_bytes"`
	// Versions of the tools, by filter (and iperf3, ping).
	Versions map[string]string `json:"versions"`
	// BPFStats is what the run found of kernel.bpf_stats_enabled and did about it: the
	// statistics add two clock reads to every BPF program run (benchkit.BPFStatsOff).
	BPFStats  string  `json:"bpf_stats"`
	LoadStart float64 `json:"load_start"`
	LoadEnd   float64 `json:"load_end"`
}

// Settings are the knobs the run used.
type Settings struct {
	Quick   bool     `json:"quick"`
	Counts  []int    `json:"counts"`
	Filters []string `json:"filters"`
	Repeats int      `json:"repeats"`
	// Blocks: each metric of a pair ran in this many short runs per side, alternating
	// sides (runs before it was recorded: one).
	Blocks int `json:"blocks,omitempty"`
	// PingBlock: the most pings in one block of the latency run (Config.PingBlock).
	PingBlock    int     `json:"ping_block,omitempty"`
	TCPSeconds   float64 `json:"tcp_seconds"`
	UDPSeconds   float64 `json:"udp_seconds"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	CPURate      string  `json:"cpu_rate"` // iperf3 -b of the CPU run
	UDPLength    int     `json:"udp_length"`
	PingCount    int     `json:"ping_count"`
	PingInterval float64 `json:"ping_interval_seconds"`
	RRSeconds    float64 `json:"rr_seconds"`
	// ProbeInterval is the spacing of the set-up time probes (its resolution).
	ProbeInterval float64 `json:"probe_interval_seconds"`
	BudgetSeconds float64 `json:"budget_seconds"`
	MemLimitBytes int64   `json:"mem_limit_bytes"`
	Seed          uint64  `json:"seed"`
	Mix           Mix     `json:"mix"`
	ClientCPUs    string  `json:"client_cpus"`
	ServerCPUs    string  `json:"server_cpus"`
	Iptables      string  `json:"iptables"` // legacy or nft backend
	Instance      string  `json:"instance"`
	// Addresses: the listed probe address and its unlisted neighbour in the world
	// namespace, and the pod ranges of the topologies.
	ProbeAddr     string            `json:"probe_addr"`
	NeighbourAddr string            `json:"neighbour_addr"`
	PodCIDRs      map[string]string `json:"pod_cidrs"`
	// IPv6: every filter ran over IPv6 (lists drawn with Mix6, the pod ranges dual-stack).
	IPv6 bool  `json:"ipv6,omitempty"`
	Mix6 *Mix6 `json:"mix6,omitempty"`
}

// CountResult is every filter at one list size.
type CountResult struct {
	Count int `json:"count"`
	// N16, N24, N32 are the drawn prefixes by length (the probe address is one more /32).
	N16 int `json:"n16"`
	N24 int `json:"n24"`
	N32 int `json:"n32"`
	// Lengths6 are the drawn prefixes by length of an IPv6 list (N16..N32 are then 0).
	Lengths6        *Lengths6      `json:"lengths6,omitempty"`
	ListBytes       int64          `json:"list_bytes"`
	GenerateSeconds float64        `json:"generate_seconds"`
	Filters         []FilterResult `json:"filters"`
}

// Lengths6 are an IPv6 list's drawn prefixes by length (the probe address is one more
// /128).
type Lengths6 struct {
	N32  int `json:"n32"`
	N48  int `json:"n48"`
	N128 int `json:"n128"`
}

// FilterResult is one filter at one count.
type FilterResult struct {
	Filter      string `json:"filter"`
	Description string `json:"description"`
	Status      string `json:"status"`
	// Reason says why a filter was skipped, failed or is not available.
	Reason     string      `json:"reason,omitempty"`
	Prediction *Prediction `json:"prediction,omitempty"`
	Setup      *Setup      `json:"setup,omitempty"`
	// Checks are the enforcement checks (name -> outcome), before and after measuring.
	Checks        map[string]string `json:"checks,omitempty"`
	RemoveSeconds float64           `json:"remove_seconds,omitempty"`
	// Pairs are the samples: the filter's topology and the baseline measured back to back.
	// The baseline row has its samples as the Base side of Pairs with an empty Filter side.
	Pairs       []Pair   `json:"pairs"`
	Errors      []string `json:"errors,omitempty"`
	Summary     Summary  `json:"summary"`
	WallSeconds float64  `json:"wall_seconds"`
}

// Prediction is what the benchmark expected a case to cost, from the same filter at the
// smaller counts of this run.
type Prediction struct {
	SetupSeconds   float64 `json:"setup_seconds"`
	MeasureSeconds float64 `json:"measure_seconds"`
	RemoveSeconds  float64 `json:"remove_seconds"`
	TotalSeconds   float64 `json:"total_seconds"`
	MemoryBytes    int64   `json:"memory_bytes"`
	FromCounts     []int   `json:"from_counts"`
}

// Setup is the set-up time of one filter at one count.
type Setup struct {
	// Seconds is from starting the set-up command until the first probe to the listed
	// address that was never answered (and no later one was): the filter in force.
	Seconds float64 `json:"seconds"`
	// CommandSeconds is until the set-up command(s) returned.
	CommandSeconds float64   `json:"command_seconds"`
	Commands       []Command `json:"commands"`
	// Entries is what the filter reports holding (-1: not asked).
	Entries int `json:"entries"`
	// ReportedBytes is the memory the filter reports for itself (ipset, Rampart).
	ReportedBytes int64 `json:"reported_bytes,omitempty"`
	// MemoryBytes is the memory the filter holds once set up: how much the kernel's own
	// allocations (Slab, VmallocUsed and Percpu in /proc/meminfo: rules, set elements,
	// trie nodes, map arrays) and, for Rampart, the agent's resident memory grew from
	// before the set-up to after it. Approximate: other work on the machine allocates too.
	// PeakRSSBytes is the largest set-up command's peak user memory (getrusage).
	MemoryBytes  int64 `json:"memory_bytes"`
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// Probes sent to the listed address during set-up, answered, and refused by the
	// sender's own stack (EPERM from iptables/nftables).
	ProbesSent     int `json:"probes_sent"`
	ProbesAnswered int `json:"probes_answered"`
	ProbeSendErrs  int `json:"probe_send_errors"`
	// StallMs is how long tasks on the machine were stalled during the set-up (from the
	// command to the filter in force), by resource: "cpu", "memory" and "io", the "some"
	// totals of /proc/pressure (absent without PSI). A set-up slower than usual with
	// large stalls waited on the machine, not on its own work.
	StallMs map[string]float64 `json:"stall_ms,omitempty"`
	// Report is what the filter says about itself after set-up (Rampart: `rampart
	// cidrset get -o json`, with the agent's own load timings and bytes per prefix).
	Report json.RawMessage `json:"report,omitempty"`
}

// Pair is one round: the filter's topology and the no-filter baseline, measured back to
// back (in alternating order), so that a burst of other work on the machine hits both.
type Pair struct {
	Round     int      `json:"round"`
	BaseFirst bool     `json:"base_first"`
	Filter    *Metrics `json:"filter,omitempty"`
	Base      *Metrics `json:"base"`
}

// Metrics are one measurement of one topology.
type Metrics struct {
	// TCP: iperf3 TCP, as fast as it goes.
	TCP Iperf `json:"tcp"`
	// UDP: iperf3 UDP with 1470-byte datagrams, unlimited rate (the original benchmark set
	// its link speed, 10 Gbit/s). Its throughput is the sender's rate, as the original
	// reports it (iperf3's end.sum): how fast the client pushes datagrams through its
	// egress and the path; what the server, on another CPU, fails to read is lost there
	// (UDP.LostPercent) and is not the filter's cost.
	UDP Iperf `json:"udp"`
	// CPU: iperf3 UDP at a fixed rate (1 Gbit/s): the CPU it costs.
	CPU Iperf `json:"cpu"`
	// CPUPercent is the iperf3 client's CPU use in the fixed-rate run (user plus system
	// time over wall time, iperf3's host_total), the original benchmark's CPU metric,
	// scaled to the fixed rate when the sender fell short of it (CPU.SenderBps). With
	// tick-based accounting and no IRQ time accounting (this kernel), softirq work done in
	// the sender's context is charged to it: the filters in the sending stack, tc on both
	// veth ends and the forwarding in the node namespace. Unlike /proc/stat (kept in
	// CPU.CPUBusy) it does not count other processes on the same CPU.
	CPUPercent float64 `json:"cpu_percent"`
	// Ping: ping -i 0.001 from the client to the server.
	Ping Ping `json:"ping"`
	// RR: one-byte request/response on one TCP connection (netperf TCP_RR).
	RR benchkit.RRResult `json:"rr"`
}

// Summary is one filter at one count over its pairs: medians of the filter's samples, and
// ratios to the baseline as the median of per-pair ratios (lower is better for CPU and
// latency, higher for throughput).
type Summary struct {
	Rounds       int            `json:"rounds"`
	TCPGbps      benchkit.Float `json:"tcp_gbps"`
	UDPGbps      benchkit.Float `json:"udp_gbps"`
	CPURateGbps  benchkit.Float `json:"cpu_rate_gbps"` // sent in the fixed-rate run
	CPUPercent   benchkit.Float `json:"cpu_percent"`
	PingP50Us    benchkit.Float `json:"ping_p50_us"`
	PingP99Us    benchkit.Float `json:"ping_p99_us"`
	RRP50Us      benchkit.Float `json:"rr_p50_us"`
	RRP99Us      benchkit.Float `json:"rr_p99_us"`
	TCPRatio     benchkit.Float `json:"tcp_ratio"`
	UDPRatio     benchkit.Float `json:"udp_ratio"`
	CPURatio     benchkit.Float `json:"cpu_ratio"`
	PingP50Ratio benchkit.Float `json:"ping_p50_ratio"`
	PingP99Ratio benchkit.Float `json:"ping_p99_ratio"`
	RRP50Ratio   benchkit.Float `json:"rr_p50_ratio"`
	SetupSeconds benchkit.Float `json:"setup_seconds"`
	// RatioRanges are the smallest and largest per-pair ratios of each ratio above (tcp,
	// udp, cpu, ping_p50, ping_p99, rr_p50): how far one pair can be off on this machine.
	RatioRanges map[string][2]benchkit.Float `json:"ratio_ranges,omitempty"`
}

// Target is one of the targets.
type Target struct {
	Name    string         `json:"name"`
	Filter  string         `json:"filter"`
	Count   int            `json:"count"`
	Want    string         `json:"want"`
	Value   benchkit.Float `json:"value"`
	Limit   benchkit.Float `json:"limit"`
	Verdict string         `json:"verdict"`
	Note    string         `json:"note,omitempty"`
}

// Targets from the issue: Rampart at 10M prefixes within 5 % of no filter in throughput
// and latency; set-up at 1M faster than ipset's, and (the load targets, from the
// command to enforcement) 1M within 1 s and 10M within 10 s.
const (
	targetCount        = 10_000_000
	targetSetupCount   = 1_000_000
	targetThroughput   = 0.95
	targetLatency      = 1.05
	targetSetup1M      = 1.0
	targetSetup10M     = 10.0
	targetSetupVsIpset = 1.0
)

func (res *Result) find(count int, filter string) *FilterResult {
	for i := range res.Counts {
		if res.Counts[i].Count != count {
			continue
		}
		for j := range res.Counts[i].Filters {
			if res.Counts[i].Filters[j].Filter == filter {
				return &res.Counts[i].Filters[j]
			}
		}
	}
	return nil
}

// summarize fills every filter's Summary and the targets.
func summarize(res *Result) {
	for i := range res.Counts {
		for j := range res.Counts[i].Filters {
			f := &res.Counts[i].Filters[j]
			f.Summary = summarizeFilter(f)
		}
	}
	res.Targets = targets(res)
}

func nanSummary() Summary {
	n := benchkit.NaN()
	return Summary{TCPGbps: n, UDPGbps: n, CPURateGbps: n, CPUPercent: n, PingP50Us: n, PingP99Us: n, RRP50Us: n, RRP99Us: n,
		TCPRatio: n, UDPRatio: n, CPURatio: n, PingP50Ratio: n, PingP99Ratio: n, RRP50Ratio: n, SetupSeconds: n}
}

// metricDefs extract each summarised metric from a measurement.
var metricDefs = []struct {
	key   string // in Summary.RatioRanges
	value func(m *Metrics) float64
	dst   func(s *Summary) *benchkit.Float
	ratio func(s *Summary) *benchkit.Float
}{
	{"tcp", func(m *Metrics) float64 { return m.TCP.BitsPerSecond / 1e9 }, func(s *Summary) *benchkit.Float { return &s.TCPGbps }, func(s *Summary) *benchkit.Float { return &s.TCPRatio }},
	{"udp", func(m *Metrics) float64 { return m.UDP.SenderBps / 1e9 }, func(s *Summary) *benchkit.Float { return &s.UDPGbps }, func(s *Summary) *benchkit.Float { return &s.UDPRatio }},
	{"", func(m *Metrics) float64 { return m.CPU.SenderBps / 1e9 }, func(s *Summary) *benchkit.Float { return &s.CPURateGbps }, nil},
	{"cpu", func(m *Metrics) float64 { return m.CPUPercent }, func(s *Summary) *benchkit.Float { return &s.CPUPercent }, func(s *Summary) *benchkit.Float { return &s.CPURatio }},
	{"ping_p50", func(m *Metrics) float64 { return m.Ping.P50Us }, func(s *Summary) *benchkit.Float { return &s.PingP50Us }, func(s *Summary) *benchkit.Float { return &s.PingP50Ratio }},
	{"ping_p99", func(m *Metrics) float64 { return m.Ping.P99Us }, func(s *Summary) *benchkit.Float { return &s.PingP99Us }, func(s *Summary) *benchkit.Float { return &s.PingP99Ratio }},
	{"rr_p50", func(m *Metrics) float64 { return m.RR.P50Us }, func(s *Summary) *benchkit.Float { return &s.RRP50Us }, func(s *Summary) *benchkit.Float { return &s.RRP50Ratio }},
	{"", func(m *Metrics) float64 { return m.RR.P99Us }, func(s *Summary) *benchkit.Float { return &s.RRP99Us }, nil},
}

func summarizeFilter(f *FilterResult) Summary {
	s := nanSummary()
	if f.Setup != nil {
		s.SetupSeconds = benchkit.Float(f.Setup.Seconds)
	}
	if f.Status != StatusMeasured && f.Status != StatusBaseline && f.Status != StatusControl && f.Status != StatusInvalid {
		return s
	}
	s.Rounds = len(f.Pairs)
	for _, d := range metricDefs {
		var vals, ratios []float64
		for _, p := range f.Pairs {
			side := p.Filter
			if f.Status == StatusBaseline {
				side = p.Base
			}
			if side == nil {
				continue
			}
			v := d.value(side)
			vals = append(vals, v)
			if p.Filter != nil && p.Base != nil {
				if r := benchkit.Ratio(v, d.value(p.Base)); !math.IsNaN(r) {
					ratios = append(ratios, r)
				}
			}
		}
		if len(vals) > 0 {
			*d.dst(&s) = benchkit.Float(benchkit.Median(vals))
		}
		if d.ratio != nil && len(ratios) > 0 && f.Status != StatusBaseline {
			*d.ratio(&s) = benchkit.Float(benchkit.Median(ratios))
			lo, hi := benchkit.MinMax(ratios)
			if s.RatioRanges == nil {
				s.RatioRanges = map[string][2]benchkit.Float{}
			}
			s.RatioRanges[d.key] = [2]benchkit.Float{benchkit.Float(lo), benchkit.Float(hi)}
		}
	}
	return s
}

// targets judges the targets.
func targets(res *Result) []Target {
	var out []Target
	ratio := func(name, key string, get func(s Summary) benchkit.Float, want string, limit float64, atMost bool) {
		t := Target{Name: name, Filter: FilterRampart, Count: targetCount, Want: want, Limit: benchkit.Float(limit), Value: benchkit.NaN()}
		f := res.find(targetCount, FilterRampart)
		switch {
		case f == nil:
			t.Verdict, t.Note = VerdictNotAvailable, "not run (10M not among the counts, or rampart not among the filters)"
		case f.Status != StatusMeasured:
			t.Verdict, t.Note = VerdictNotAvailable, fmt.Sprintf("rampart at 10M: %s %s", f.Status, f.Reason)
		default:
			t.Value = get(f.Summary)
			t.Verdict = judge(t.Value, limit, atMost)
			t.Note = rangeNote(f, key)
			// The A/A control shows how far from 1 noise alone moves a ratio here.
			if c := res.find(targetCount, FilterControl); c != nil && c.Status == StatusControl {
				t.Note += fmt.Sprintf("; control (A/A) %s", num(get(c.Summary), 2))
				if cr := rangeNote(c, key); cr != "" {
					t.Note += ", " + cr
				}
			}
		}
		out = append(out, t)
	}
	ratio("Rampart TCP throughput at 10M / no filter", "tcp", func(s Summary) benchkit.Float { return s.TCPRatio }, ">= 0.95", targetThroughput, false)
	ratio("Rampart UDP throughput at 10M / no filter", "udp", func(s Summary) benchkit.Float { return s.UDPRatio }, ">= 0.95", targetThroughput, false)
	ratio("Rampart ping p50 at 10M / no filter", "ping_p50", func(s Summary) benchkit.Float { return s.PingP50Ratio }, "<= 1.05", targetLatency, true)
	ratio("Rampart TCP request/response p50 at 10M / no filter", "rr_p50", func(s Summary) benchkit.Float { return s.RRP50Ratio }, "<= 1.05", targetLatency, true)

	setup := func(name string, count int, limit float64, vsIpset bool) {
		t := Target{Name: name, Filter: FilterRampart, Count: count, Value: benchkit.NaN(), Limit: benchkit.Float(limit)}
		t.Want = fmt.Sprintf("<= %g s", limit)
		f := res.find(count, FilterRampart)
		var base *FilterResult
		if vsIpset {
			t.Want = "< ipset's set-up time"
			base = res.find(count, FilterIpset)
		}
		switch {
		case f == nil:
			t.Verdict, t.Note = VerdictNotAvailable, fmt.Sprintf("not run (%d not among the counts, or rampart not among the filters)", count)
		case f.Setup == nil:
			t.Verdict, t.Note = VerdictNotAvailable, fmt.Sprintf("rampart at %d: %s %s", count, f.Status, f.Reason)
		case vsIpset && (base == nil || base.Setup == nil):
			t.Verdict, t.Note = VerdictNotAvailable, "no ipset set-up time at this count"
			if base != nil {
				t.Note += ": " + base.Status + " " + base.Reason
			}
		case vsIpset:
			t.Value = benchkit.Float(f.Setup.Seconds / base.Setup.Seconds)
			t.Limit = targetSetupVsIpset
			t.Note = fmt.Sprintf("rampart %.3f s, ipset %.3f s (value: ratio)", f.Setup.Seconds, base.Setup.Seconds)
			t.Verdict = VerdictMiss
			if f.Setup.Seconds < base.Setup.Seconds {
				t.Verdict = VerdictPass
			}
		default:
			t.Value = benchkit.Float(f.Setup.Seconds)
			t.Verdict = judge(t.Value, limit, true)
		}
		out = append(out, t)
	}
	setup("Rampart set-up at 1M vs ipset", targetSetupCount, targetSetupVsIpset, true)
	setup("Rampart set-up at 1M (command to enforcement)", targetSetupCount, targetSetup1M, false)
	setup("Rampart set-up at 10M (command to enforcement)", targetCount, targetSetup10M, false)
	return out
}

// rangeNote says over how many pairs a ratio is the median, and their spread.
func rangeNote(f *FilterResult, key string) string {
	r, ok := f.Summary.RatioRanges[key]
	if !ok {
		return ""
	}
	return fmt.Sprintf("%d pair(s), %s-%s", len(f.Pairs), num(r[0], 2), num(r[1], 2))
}

func judge(v benchkit.Float, limit float64, atMost bool) string {
	switch {
	case !v.Valid():
		return VerdictNotAvailable
	case atMost && float64(v) <= limit, !atMost && float64(v) >= limit:
		return VerdictPass
	}
	return VerdictMiss
}

// WriteJSON writes the report to dir/egress-<UTC time>.json (the same name on every call
// of one run, so that a long run's partial report is replaced as it grows).
func (res *Result) WriteJSON(dir string) (string, error) {
	if res.JSONPath == "" {
		res.JSONPath = filepath.Join(dir, benchkit.Stamped("egress", res.Started)+".json")
	}
	return res.JSONPath, benchkit.WriteJSON(res.JSONPath, res)
}

// WriteTable writes the markdown table next to the JSON report.
func (res *Result) WriteTable(dir string) (string, error) {
	if res.JSONPath == "" {
		if _, err := res.WriteJSON(dir); err != nil {
			return "", err
		}
	}
	p := strings.TrimSuffix(res.JSONPath, ".json") + ".md"
	f, err := os.Create(p)
	if err != nil {
		return "", fmt.Errorf("creating table: %w", err)
	}
	res.WriteMarkdown(f)
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("writing table: %w", err)
	}
	res.TablePath = p
	return p, nil
}

// WriteMarkdown prints the tables: every filter at every count with its ratio to the
// baseline measured in the same pairs, then the targets.
func (res *Result) WriteMarkdown(w io.Writer) {
	st := res.Settings
	family := ""
	if res.Settings.IPv6 {
		family = " over IPv6"
	}
	fmt.Fprintf(w, "### Egress filtering%s: %s\n\n", family, res.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "Each cell: median over %d round(s), and in parentheses the median of the per-pair ratios to no filter measured back to back. "+
		"Throughput: higher is better; CPU and latency: lower is better. CPU: the iperf3 client's CPU use (user and system, softirq in its context included) sending UDP at %s; "+
		"* marks a run that sent less than 90%% of that rate, whose CPU use was scaled up to it.", st.Repeats, st.CPURate)
	if st.Blocks > 1 {
		fmt.Fprintf(w, " Within a pair each metric ran in %d short blocks per side, the sides alternating (A B B A ...).", st.Blocks)
	}
	if st.PingBlock > 0 && st.PingCount > st.PingBlock {
		fmt.Fprintf(w, " Ping: %d per side and pair, in blocks of at most %d alternating sides.", st.PingCount, st.PingBlock)
	}
	fmt.Fprint(w, " Ping p50: median of the pooled round trips as grouped data (ping prints whole microseconds).\n\n")
	fmt.Fprintln(w, "| prefixes | filter | status | TCP Gbit/s | UDP Gbit/s | CPU % at "+st.CPURate+" | ping p50 us | ping p99 us | TCP RR p50 us | set-up s | memory MiB |")
	fmt.Fprintln(w, "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, c := range res.Counts {
		for _, f := range c.Filters {
			s := f.Summary
			status := f.Status
			if f.Reason != "" {
				status += ": " + f.Reason
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				countText(c.Count), f.Filter, mdEscape(benchkit.Truncate(status, 160)),
				cell(s.TCPGbps, s.TCPRatio, 2), cell(s.UDPGbps, s.UDPRatio, 2), cpuCell(s, st.CPURate),
				cell(s.PingP50Us, s.PingP50Ratio, 0), cell(s.PingP99Us, s.PingP99Ratio, 0), cell(s.RRP50Us, s.RRP50Ratio, 0),
				setupText(f), memText(f))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | want | value | verdict | note |")
	fmt.Fprintln(w, "|---|---|---:|---|---|")
	for _, t := range res.Targets {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", t.Name, t.Want, num(t.Value, 3), t.Verdict, mdEscape(t.Note))
	}
	fmt.Fprintln(w)
	mix := fmt.Sprintf("%.0f%% /24, %.0f%% /16 (at most %d), the rest /32", 100*st.Mix.Share24, 100*st.Mix.Share16, st.Mix.Max16)
	if st.IPv6 && st.Mix6 != nil {
		fmt.Fprintln(w, "Every filter over IPv6 (dual-stack topologies, traffic to the IPv6 addresses, lists of IPv6 prefixes), paired with a no-filter baseline over IPv6.")
		mix = fmt.Sprintf("%.0f%% /48, %.0f%% /32 (at most %d), the rest /128", 100*st.Mix6.Share48, 100*st.Mix6.Share32, st.Mix6.Max32)
	}
	fmt.Fprintf(w, "Filters on the client's egress; the peers in the client namespace (iptables %s, OUTPUT chain; tc egress of eth0), Rampart at the client's host-side veth. "+
		"Client on CPU %s, server on CPU %s; %d CPUs; load average %.2f at start, %.2f at end. Seed %d; prefixes drawn %s.\n",
		st.Iptables, cpuText(st.ClientCPUs), cpuText(st.ServerCPUs), res.Host.CPUs, res.Host.LoadStart, res.Host.LoadEnd, st.Seed, mix)
	if res.Host.BPFStats != "" {
		fmt.Fprintf(w, "BPF run-time statistics (kernel.bpf_stats_enabled): %s.\n", res.Host.BPFStats)
	}
	for _, c := range res.Counts {
		for _, f := range c.Filters {
			for _, e := range f.Errors {
				fmt.Fprintf(w, "\n%s at %s: error: %s\n", f.Filter, countText(c.Count), e)
			}
		}
	}
	for _, e := range res.Errors {
		fmt.Fprintf(w, "\nerror: %s\n", e)
	}
}

func cell(v, ratio benchkit.Float, prec int) string {
	if !v.Valid() {
		return "-"
	}
	s := fmt.Sprintf("%.*f", prec, float64(v))
	if ratio.Valid() {
		s += fmt.Sprintf(" (%.2f)", float64(ratio))
	}
	return s
}

// cpuCell is the CPU cell, starred when the fixed rate was not reached (the CPU then
// bought less traffic than the baseline's).
func cpuCell(s Summary, rate string) string {
	c := cell(s.CPUPercent, s.CPURatio, 0)
	if want, err := parseRate(rate); err == nil && s.CPURateGbps.Valid() && float64(s.CPURateGbps)*1e9 < 0.9*want {
		c += "*"
	}
	return c
}

// parseRate parses an iperf3 rate such as 1G, 500M or 100000.
func parseRate(s string) (float64, error) {
	s, mult := benchkit.CutUnit(s, map[string]float64{"G": 1e9, "M": 1e6, "K": 1e3})
	v, err := strconv.ParseFloat(s, 64)
	return v * mult, err
}

func setupText(f FilterResult) string {
	if f.Setup == nil {
		if f.Prediction != nil && f.Status == StatusSkipped {
			return fmt.Sprintf("~%.0f predicted", f.Prediction.SetupSeconds)
		}
		return "-"
	}
	return fmt.Sprintf("%.3f", f.Setup.Seconds)
}

func memText(f FilterResult) string {
	if f.Setup == nil {
		if f.Prediction != nil && f.Status == StatusSkipped {
			return fmt.Sprintf("~%.0f predicted", float64(f.Prediction.MemoryBytes)/(1<<20))
		}
		return "-"
	}
	m := f.Setup.MemoryBytes
	if f.Setup.ReportedBytes > 0 {
		return fmt.Sprintf("%.1f (reports %.1f)", float64(max(m, 0))/(1<<20), float64(f.Setup.ReportedBytes)/(1<<20))
	}
	return fmt.Sprintf("%.1f", float64(max(m, 0))/(1<<20))
}

func countText(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func cpuText(s string) string {
	if s == "" {
		return "unpinned"
	}
	return s
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

// ReadResult reads a saved JSON report (strictly: an unknown field means another schema).
func ReadResult(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading report: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var res Result
	if err := dec.Decode(&res); err != nil {
		return nil, fmt.Errorf("reading report %s: %w", path, err)
	}
	if res.Schema != Schema {
		return nil, fmt.Errorf("report %s has schema %q, want %q", path, res.Schema, Schema)
	}
	res.JSONPath = path
	return &res, nil
}
