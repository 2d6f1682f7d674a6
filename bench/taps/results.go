package taps

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/bench/l7"
	"github.com/rampartnet/rampart/bench/policyoverhead"
)

// Schema names the JSON report's format.
const Schema = "rampart.bench.taps/v2"

// Case names.
const (
	CaseAAThroughput     = "aa-throughput"      // no tap vs no tap, iperf3
	CaseMirrorNoReader   = "mirror-no-reader"   // the copies' cost alone: nothing reads them
	CaseMirrorThroughput = "mirror-throughput"  // Table II, A, B and S on one node
	CaseMirrorBRemote    = "mirror-b-remote"    // Table II, A and S on one node, B on another
	CaseMirrorSRemote    = "mirror-s-remote"    // Table II, A and B on one node, S on another
	CaseMirrorThreeNodes = "mirror-three-nodes" // Table II, A, B and S on three nodes
	CaseAAWeb            = "aa-web"             // no tap vs no tap, web server at its maximum rate
	CaseMirrorWeb        = "mirror-web"         // Table III
	// The same two with the copies steered to the monitor's CPU (monitor run --steer-copies).
	CaseMirrorThroughputSteered = "mirror-throughput-steered"
	CaseMirrorWebSteered        = "mirror-web-steered"
	CaseMirrorSlow              = "mirror-slow-monitor" // mirror to a monitor that falls behind
	CaseRedirectThroughput      = "redirect-throughput" // inline Suricata (IPS), iperf3
	CaseRedirectLatency         = "redirect-latency"    // inline Suricata (IPS), fortio at a fixed rate
	metricThroughput            = "throughput"          // iperf3 receiver rate, bit/s
	metricRate                  = "request rate"        // fortio closed loop, requests/s
	metricLatency               = "latency"             // fortio at a fixed rate, p50/p90/p99
	verdictPass                 = "PASS"                // ratio at or above the target
	verdictMiss                 = "MISS"                // below the target
	verdictReport               = "REPORT"              // no target: the number is reported
	verdictInvalid              = "INVALID"             // no valid pair
)

// Targets of issue 18 (ratios to no tap).
const (
	TargetMirrorThroughput = 0.9
	TargetMirrorWeb        = 0.97
)

// Result is the report of one run.
type Result struct {
	Schema   string    `json:"schema"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Host     HostInfo  `json:"host"`
	Settings Settings  `json:"settings"`
	// Cases are the measured cases, each a list of pairs (with the tap, without).
	Cases []CaseResult `json:"cases"`
	// Placements are the rows of the paper's Table II, each measured by a case.
	Placements []Placement `json:"placements"`
	Errors     []string    `json:"errors,omitempty"`
	Incomplete bool        `json:"incomplete,omitempty"`
	JSONPath   string      `json:"-"`
	PlotPath   string      `json:"-"`
}

// HostInfo describes the machine and tools.
type HostInfo struct {
	benchkit.Machine
	Iperf3    string  `json:"iperf3"`
	Fortio    string  `json:"fortio"`
	Suricata  string  `json:"suricata"`
	LoadStart float64 `json:"load_start"` // 1-minute load average
	LoadEnd   float64 `json:"load_end"`
	BPFStats  string  `json:"bpf_stats"` // kernel.bpf_stats_enabled before the run (off during it)
}

// Settings are the run's parameters.
type Settings struct {
	Quick          bool    `json:"quick"`
	Repeats        int     `json:"repeats"`
	IperfSeconds   int     `json:"iperf_seconds"`
	WebSeconds     float64 `json:"web_seconds"`
	WebConnections int     `json:"web_connections"`
	LatencyQPS     float64 `json:"latency_qps"`
	// CPU is where the measured processes (iperf3, fortio, the web server) run; MonitorCPUs
	// where Suricata runs (empty: not pinned).
	CPU         int   `json:"cpu"`
	MonitorCPUs []int `json:"monitor_cpus,omitempty"`
	// Instance starts the nodes' instance names (Instance+"a", +"b", +"c"); Nodes agents
	// run, joined by Tunnel.
	Instance  string         `json:"instance"`
	Nodes     int            `json:"nodes"`
	Tunnel    string         `json:"tunnel"`
	Endpoints []EndpointInfo `json:"endpoints"`
	// Monitor says what S runs: what reads the copies, and how it was slowed.
	Monitor     string `json:"monitor"`
	SlowMonitor string `json:"slow_monitor"`
	SlowRules   int    `json:"slow_rules"`
}

// EndpointInfo is an endpoint of the run and its node.
type EndpointInfo struct {
	Name string `json:"name"`
	Node string `json:"node"`
	IP   string `json:"ip"`
	MTU  int    `json:"mtu"`
}

// CaseResult is one case: its pairs and their summary.
type CaseResult struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Metric      string  `json:"metric"` // throughput, request rate, latency
	Action      string  `json:"action"` // mirror, redirect, none (A/A control)
	Monitor     string  `json:"monitor,omitempty"`
	Target      float64 `json:"target,omitempty"` // minimum ratio to no tap; 0: reported only
	// Published is the paper's figure for the same measurement, if it has one.
	Published *Published `json:"published,omitempty"`
	Samples   []Sample   `json:"samples"`
	Summary   Summary    `json:"summary"`
	Errors    []string   `json:"errors,omitempty"`
}

// Published is a figure of the paper (seeds/002, FlowTap).
type Published struct {
	Source   string  `json:"source"`
	Baseline float64 `json:"baseline"`
	Tap      float64 `json:"tap"`
	Unit     string  `json:"unit"`
	Ratio    float64 `json:"ratio"`
}

// Sample is one pair: the case (Tap) and no tap (Base) measured back to back.
type Sample struct {
	Round    int         `json:"round"`
	Pair     int         `json:"pair"`
	TapFirst bool        `json:"tap_first"`
	Tap      Measurement `json:"tap"`
	Base     Measurement `json:"base"`
	// Counters are the tap contract's counters for this run (the contract is created for
	// the run and deleted after it), Monitor the monitor's capture counters over the run.
	Counters *TapCounters `json:"counters,omitempty"`
	Monitor  *MonitorRun  `json:"monitor,omitempty"`
	// Remote is what the monitor's node counted of the copies over the run, when the
	// monitor is on another node than A.
	Remote *RemoteCounters `json:"remote,omitempty"`
}

// RemoteCounters are the copies that arrived at the monitor's node through the tap tunnel
// during a run (its dataplane's counters of copies from other nodes): handed to the
// monitor, and dropped there for no monitor with their key.
type RemoteCounters struct {
	Delivered uint64 `json:"delivered"`
	Lost      uint64 `json:"lost"`
}

// Measurement is one side of a pair: iperf3 or fortio.
type Measurement struct {
	Iperf *policyoverhead.IperfResult `json:"iperf,omitempty"`
	Web   *l7.LoadRun                 `json:"web,omitempty"`
}

// TapCounters are the contract's dataplane counters after the run.
type TapCounters struct {
	MirroredPackets   uint64 `json:"mirrored_packets"`
	RedirectedPackets uint64 `json:"redirected_packets"`
	DroppedByMonitor  uint64 `json:"dropped_by_monitor"`
	CopiesLost        uint64 `json:"copies_lost"`
}

// MonitorRun is what Suricata counted during the run: packets the kernel handed it and
// packets the kernel dropped because it did not read them in time.
type MonitorRun struct {
	KernelPackets uint64 `json:"kernel_packets"`
	KernelDrops   uint64 `json:"kernel_drops"`
	Accepted      uint64 `json:"accepted,omitempty"` // IPS: passed on
	Blocked       uint64 `json:"blocked,omitempty"`
}

// Summary is the median over the case's pairs.
type Summary struct {
	Pairs int `json:"pairs"`
	// Value and Baseline: medians of the metric (bit/s, requests/s; latency: p50 in us).
	Value    benchkit.Float `json:"value"`
	Baseline benchkit.Float `json:"baseline"`
	// Ratio is the median of the pairs' ratios (tap / no tap; latency: no tap / tap, so
	// that higher is better throughout), with the smallest and largest.
	Ratio    benchkit.Float `json:"ratio"`
	RatioMin benchkit.Float `json:"ratio_min"`
	RatioMax benchkit.Float `json:"ratio_max"`
	// Latency percentiles (medians over the pairs), microseconds.
	P50Us     benchkit.Float `json:"p50_us,omitzero"`
	P90Us     benchkit.Float `json:"p90_us,omitzero"`
	P99Us     benchkit.Float `json:"p99_us,omitzero"`
	BaseP50Us benchkit.Float `json:"base_p50_us,omitzero"`
	BaseP90Us benchkit.Float `json:"base_p90_us,omitzero"`
	BaseP99Us benchkit.Float `json:"base_p99_us,omitzero"`
	// Totals over the pairs: copies the dataplane could not deliver, packets the monitor's
	// kernel socket dropped, copies delivered.
	CopiesLost  uint64 `json:"copies_lost"`
	KernelDrops uint64 `json:"kernel_drops"`
	Mirrored    uint64 `json:"mirrored"`
	// KernelPackets are the packets the monitor's socket received (dropped ones included):
	// Mirrored plus the flush probes' packets (a GSO copy arrives whole, one packet).
	KernelPackets uint64 `json:"kernel_packets"`
	// RemoteDelivered and RemoteLost total Sample.Remote (monitor on another node).
	RemoteDelivered uint64 `json:"remote_delivered,omitempty"`
	RemoteLost      uint64 `json:"remote_lost,omitempty"`
	Verdict         string `json:"verdict"`
}

// Placement is a row of Table II: where B and S are (A is on node-a), the case that
// measures it, and the paper's figures.
type Placement struct {
	Name      string     `json:"name"`
	BNode     string     `json:"b_node"`
	SNode     string     `json:"s_node"`
	Case      string     `json:"case"`
	Published *Published `json:"published"`
}

// placements are Table II's four rows, in the paper's order.
func placements() []Placement {
	row := func(name, b, s, c string, base, tap float64) Placement {
		return Placement{Name: name, BNode: b, SNode: s, Case: c, Published: &Published{
			Source: "FlowTap Table II, " + name, Baseline: base, Tap: tap, Unit: "Mbit/s", Ratio: tap / base}}
	}
	return []Placement{
		row("A, B and S on three nodes", "node-b", "node-c", CaseMirrorThreeNodes, 2600, 2100),
		row("A and S on one node, B on another", "node-b", "node-a", CaseMirrorBRemote, 2600, 2600),
		row("A and B on one node, S on another", "node-a", "node-c", CaseMirrorSRemote, 12000, 5100),
		row("A, B and S on one node", "node-a", "node-a", CaseMirrorThroughput, 12000, 9100),
	}
}

// placementOf is the Table II row measured by case name.
func placementOf(name string) Placement {
	for _, p := range placements() {
		if p.Case == name {
			return p
		}
	}
	panic("no Table II placement for case " + name)
}

// metric returns the case's value of a measurement: bit/s, requests/s, or p50 latency.
func metric(c *CaseResult, m Measurement) float64 {
	switch {
	case c.Metric == metricThroughput && m.Iperf != nil:
		return m.Iperf.BitsPerSecond
	case c.Metric == metricRate && m.Web != nil:
		return m.Web.ActualQPS
	case c.Metric == metricLatency && m.Web != nil:
		return m.Web.P50Us
	}
	return math.NaN()
}

// summarize fills every case's summary from its samples.
func summarize(cases []CaseResult) {
	for i := range cases {
		cases[i].Summary = summarizeCase(&cases[i])
	}
}

func summarizeCase(c *CaseResult) Summary {
	var vals, bases, ratios, p50, p90, p99, b50, b90, b99 []float64
	s := Summary{}
	for _, p := range c.Samples {
		v, b := metric(c, p.Tap), metric(c, p.Base)
		if !(v > 0) || !(b > 0) {
			continue
		}
		vals, bases = append(vals, v), append(bases, b)
		if c.Metric == metricLatency {
			ratios = append(ratios, b/v)
			p50, p90, p99 = append(p50, p.Tap.Web.P50Us), append(p90, p.Tap.Web.P90Us), append(p99, p.Tap.Web.P99Us)
			b50, b90, b99 = append(b50, p.Base.Web.P50Us), append(b90, p.Base.Web.P90Us), append(b99, p.Base.Web.P99Us)
		} else {
			ratios = append(ratios, v/b)
		}
		if p.Counters != nil {
			s.CopiesLost += p.Counters.CopiesLost
			s.Mirrored += p.Counters.MirroredPackets
		}
		if p.Remote != nil {
			s.RemoteDelivered += p.Remote.Delivered
			s.RemoteLost += p.Remote.Lost
		}
		if p.Monitor != nil {
			s.KernelDrops += p.Monitor.KernelDrops
			s.KernelPackets += p.Monitor.KernelPackets
		}
	}
	s.Pairs = len(ratios)
	s.Value, s.Baseline = benchkit.Float(benchkit.Median(vals)), benchkit.Float(benchkit.Median(bases))
	s.Ratio = benchkit.Float(benchkit.Median(ratios))
	lo, hi := benchkit.MinMax(ratios)
	s.RatioMin, s.RatioMax = benchkit.Float(lo), benchkit.Float(hi)
	if c.Metric == metricLatency {
		s.P50Us, s.P90Us, s.P99Us = med(p50), med(p90), med(p99)
		s.BaseP50Us, s.BaseP90Us, s.BaseP99Us = med(b50), med(b90), med(b99)
	}
	switch {
	case s.Pairs == 0:
		s.Verdict = verdictInvalid
	case c.Target == 0:
		s.Verdict = verdictReport
	case float64(s.Ratio) >= c.Target:
		s.Verdict = verdictPass
	default:
		s.Verdict = verdictMiss
	}
	return s
}

func med(xs []float64) benchkit.Float { return benchkit.Float(benchkit.Median(xs)) }

// baseName is the report's file name without extension.
func (r *Result) baseName() string {
	return benchkit.Stamped("taps", r.Started)
}

// Table renders the report as markdown: the measured cases, Table II's placements, and
// the copies lost per run.
func (r *Result) Table() string {
	var b strings.Builder
	quick := ""
	if r.Settings.Quick {
		quick = ", quick run"
	}
	fmt.Fprintf(&b, "flow taps, %s, kernel %s, %d CPUs, %s, %d rounds%s, load average %.2f at start, %.2f at end\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Host.Kernel, r.Host.CPUs, r.Host.Suricata, r.Settings.Repeats, quick,
		r.Host.LoadStart, r.Host.LoadEnd)
	fmt.Fprintf(&b, "Monitor S: %s. Slowed monitor: %s.\n\n", r.Settings.Monitor, r.Settings.SlowMonitor)
	fmt.Fprintf(&b, "Nodes: %d agents (instances %sa...), tunnel %s;", r.Settings.Nodes, r.Settings.Instance, r.Settings.Tunnel)
	for _, e := range r.Settings.Endpoints {
		fmt.Fprintf(&b, " %s on %s (MTU %d)", e.Name, e.Node, e.MTU)
	}
	b.WriteString(".\n\n")
	b.WriteString("| case | metric | with tap | no tap | ratio (min-max) | target | published (FlowTap) | copies lost (tap) / monitor kernel drops | verdict |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---|---:|---|\n")
	for i := range r.Cases {
		c := &r.Cases[i]
		s := c.Summary
		target, pub := "-", "-"
		if c.Target > 0 {
			target = fmt.Sprintf("%.2f", c.Target)
		}
		if c.Published != nil {
			pub = fmt.Sprintf("%g -> %g %s (%.2f)", c.Published.Baseline, c.Published.Tap, c.Published.Unit, c.Published.Ratio)
		}
		lost := "-"
		if c.Action == "mirror" {
			lost = fmt.Sprintf("%d of %d / %d of %d", s.CopiesLost, s.Mirrored, s.KernelDrops, s.KernelPackets)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s (%s-%s) | %s | %s | %s | %s |\n", c.Name, c.Metric,
			c.format(s.Value, s.P90Us, s.P99Us), c.format(s.Baseline, s.BaseP90Us, s.BaseP99Us),
			num(s.Ratio, 3), num(s.RatioMin, 2), num(s.RatioMax, 2), target, pub, lost, s.Verdict)
	}
	b.WriteString("\nTable II placements (raw TCP throughput, mirror of A's outgoing traffic to S; A on node-a; " +
		"copies: mirrored and lost on A's node, delivered and lost on S's node when it is another):\n\n")
	b.WriteString("| placement | B | S | case | published (FlowTap) | no tap | with tap | ratio | copies mirrored | copies lost | S's node: delivered / lost |\n")
	b.WriteString("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Placements {
		c := r.find(p.Case)
		if c == nil {
			continue
		}
		s := c.Summary
		remote := "-"
		if p.SNode != "node-a" {
			remote = fmt.Sprintf("%d / %d", s.RemoteDelivered, s.RemoteLost)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %g -> %g %s (%.2f) | %s | %s | %s | %d | %d | %s |\n", p.Name, p.BNode, p.SNode, p.Case,
			p.Published.Baseline, p.Published.Tap, p.Published.Unit, p.Published.Ratio,
			c.format(s.Baseline, 0, 0), c.format(s.Value, 0, 0), num(s.Ratio, 3), s.Mirrored, s.CopiesLost, remote)
	}
	b.WriteString("\nCopies lost per run (mirror cases): tap counter copiesLost, Suricata capture.kernel_drops, of the copies mirrored:\n\n")
	b.WriteString("| case | round | mirrored | copies lost | S's node: delivered / lost | monitor kernel packets | monitor kernel drops | with tap | no tap |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Cases {
		c := &r.Cases[i]
		if c.Action != "mirror" {
			continue
		}
		for _, p := range c.Samples {
			if p.Counters == nil {
				continue
			}
			mp, md, rm := "-", "-", "-"
			if p.Monitor != nil {
				mp, md = fmt.Sprint(p.Monitor.KernelPackets), fmt.Sprint(p.Monitor.KernelDrops)
			}
			if p.Remote != nil {
				rm = fmt.Sprintf("%d / %d", p.Remote.Delivered, p.Remote.Lost)
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %s | %s | %s | %s |\n", c.Name, p.Round+1, p.Counters.MirroredPackets,
				p.Counters.CopiesLost, rm, mp, md,
				c.text(p.Tap), c.text(p.Base))
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintf(&b, "\nErrors: %s\n", strings.Join(r.Errors, "; "))
	}
	for _, c := range r.Cases {
		if len(c.Errors) > 0 {
			fmt.Fprintf(&b, "\n%s errors: %s\n", c.Name, strings.Join(c.Errors, "; "))
		}
	}
	return b.String()
}

func (r *Result) find(name string) *CaseResult {
	for i := range r.Cases {
		if r.Cases[i].Name == name {
			return &r.Cases[i]
		}
	}
	return nil
}

// text renders one measurement in the case's unit.
func (c *CaseResult) text(m Measurement) string {
	if c.Metric == metricLatency && m.Web != nil {
		return c.format(benchkit.Float(m.Web.P50Us), benchkit.Float(m.Web.P90Us), benchkit.Float(m.Web.P99Us))
	}
	return c.format(benchkit.Float(metric(c, m)), 0, 0)
}

// format renders a case's value in its unit (latency: p50/p90/p99).
func (c *CaseResult) format(v, p90, p99 benchkit.Float) string {
	if !v.Valid() {
		return "-"
	}
	switch c.Metric {
	case metricThroughput:
		return fmt.Sprintf("%.0f Mbit/s", float64(v)/1e6)
	case metricRate:
		return fmt.Sprintf("%.0f req/s", float64(v))
	}
	return fmt.Sprintf("%.0f/%.0f/%.0f us", float64(v), float64(p90), float64(p99))
}

func num(v benchkit.Float, prec int) string {
	if !v.Valid() {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, float64(v))
}

// ExitCode is the command's exit status for a finished run: 1 if a case has no valid pair
// or the run had errors, 3 if a case missed its target and failOnMiss, else 0.
func ExitCode(res *Result, failOnMiss bool) int {
	invalid, missed := false, false
	for _, c := range res.Cases {
		invalid = invalid || c.Summary.Verdict == verdictInvalid
		missed = missed || c.Summary.Verdict == verdictMiss
	}
	return benchkit.ExitCode(invalid, res.Errors, missed, failOnMiss)
}
