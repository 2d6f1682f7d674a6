package egress

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// TestQuickRun runs the benchmark command in quick mode, as CI's smoke test, and checks
// that it produced a well-formed report: at every count the baseline with numbers, every
// peer set up (its set-up time measured until the listed address stopped answering, the
// enforcement checks passed, the filter removed again) and measured in a pair with the
// baseline; the A/A control measured in pairs without a filter; Rampart measured the same way or, before the CLI has CIDR sets, not available
// with a reason; the targets judged or not available; the markdown table and the plot
// written; nothing left behind. Then the same over IPv6 at one small count. It asserts no
// speed: targets belong in the output.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and runs the benchmark for about two minutes",
		"nsenter", "taskset", "go", "iperf3", "ping", "ipset", "nft", "iptables-legacy", "iptables-legacy-restore", "ip6tables-legacy", "ip6tables-legacy-restore")
	q := benchkit.BuildQuickRun(t, 12*time.Minute, "egressbench")
	dir, out := q.Dir, q.Out
	stdout, _ := benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--bin-dir", dir, "--out", out)
	res := readQuickResult(t, out, QuickConfig().Counts)
	if res.Settings.IPv6 || res.Settings.Mix6 != nil {
		t.Errorf("an IPv4 run reports IPv6 settings: %+v", res.Settings)
	}
	if len(res.Targets) != 7 {
		t.Errorf("%d targets, want 7", len(res.Targets))
	}
	for _, tg := range res.Targets {
		// Quick mode has neither 1M nor 10M.
		if tg.Verdict != VerdictNotAvailable || tg.Note == "" {
			t.Errorf("target %s: %s %q", tg.Name, tg.Verdict, tg.Note)
		}
	}
	md := stdout
	for _, want := range []string{"| prefixes | filter |", "| 1k | none | BASELINE |", "| 1k | ipset | MEASURED |", "| 1k | tc-lpm | MEASURED |", "Rampart set-up at 1M vs ipset"} {
		if !strings.Contains(md, want) {
			t.Errorf("printed table lacks %q", want)
		}
	}

	checkLeftBehind(t, res)

	// Over IPv6: every filter at one small count, checked the same way.
	out6 := filepath.Join(dir, "results6")
	stdout6, _ := benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--ipv6", "--counts", "10", "--bin-dir", dir, "--out", out6)
	res6 := readQuickResult(t, out6, []int{10})
	st := res6.Settings
	if !st.IPv6 || st.Mix6 == nil || !strings.HasPrefix(st.ProbeAddr, "2001:2:") || !strings.HasPrefix(st.NeighbourAddr, "2001:2:") ||
		!strings.Contains(st.PodCIDRs["agent"], ",2001:2:") || !strings.Contains(st.PodCIDRs["none"], ",2001:2:") {
		t.Errorf("IPv6 run settings: %+v", st)
	}
	if l := res6.Counts[0].Lengths6; l == nil || l.N32+l.N48+l.N128 != 9 {
		t.Errorf("IPv6 list lengths %+v", l)
	}
	if !strings.Contains(stdout6, "Every filter over IPv6") || !strings.Contains(stdout6, "| 10 | rampart | MEASURED |") {
		t.Errorf("IPv6 table lacks the family note or rampart's row:\n%s", stdout6)
	}
	checkLeftBehind(t, res6)
}

// readQuickResult reads the report a quick run wrote into out (JSON, markdown, PNG) and
// checks its shape: well-formed, complete, every filter at each of counts.
func readQuickResult(t *testing.T, out string, counts []int) Result {
	t.Helper()
	var res Result
	benchkit.ReadReportTableForTest(t, out, "egress", &res)
	if res.Schema != Schema || !res.Settings.Quick || res.Incomplete || len(res.Errors) > 0 {
		t.Errorf("schema %q, quick %v, incomplete %v, errors %v", res.Schema, res.Settings.Quick, res.Incomplete, res.Errors)
	}
	if !slices.Equal(res.Settings.Filters, FilterNames) {
		t.Errorf("filters %v, want %v", res.Settings.Filters, FilterNames)
	}
	var got []int
	for _, c := range res.Counts {
		got = append(got, c.Count)
		checkCount(t, c)
	}
	if !slices.Equal(got, counts) {
		t.Errorf("counts %v, want %v", got, counts)
	}
	return res
}

// checkLeftBehind checks that a run removed its namespaces and pins, which carry its
// instance name.
func checkLeftBehind(t *testing.T, res Result) {
	t.Helper()
	if res.Settings.Instance == "" {
		t.Fatal("instance name not reported")
	}
	benchkit.CheckLeftBehindForTest(t, []string{res.Settings.Instance}, filepath.Join("/sys/fs/bpf/rampart", res.Settings.Instance+"*"))
}

// checkCount checks one count of a quick run's report.
func checkCount(t *testing.T, c CountResult) {
	t.Helper()
	if len(c.Filters) != len(FilterNames) {
		t.Fatalf("%d: %d filters, want %d", c.Count, len(c.Filters), len(FilterNames))
	}
	drawn := c.N16 + c.N24 + c.N32
	if c.Lengths6 != nil {
		drawn = c.Lengths6.N32 + c.Lengths6.N48 + c.Lengths6.N128
	}
	if drawn+1 != c.Count || c.ListBytes <= 0 {
		t.Errorf("%d: list of %d drawn prefixes and the probe, %d bytes", c.Count, drawn, c.ListBytes)
	}
	for i, f := range c.Filters {
		if f.Filter != FilterNames[i] {
			t.Errorf("%d: filter %d is %s, want %s", c.Count, i, f.Filter, FilterNames[i])
			continue
		}
		switch {
		case f.Filter == FilterNone:
			if f.Status != StatusBaseline || len(f.Pairs) < 1 || !f.Summary.TCPGbps.Valid() {
				t.Errorf("%d: baseline %s with %d samples", c.Count, f.Status, len(f.Pairs))
			}
			for _, p := range f.Pairs {
				checkMetrics(t, c.Count, "baseline", p.Base)
			}
		case f.Filter == FilterControl:
			if f.Status != StatusControl || len(f.Pairs) != 1 || f.Setup != nil || f.Checks["listed address"] != "answers" || f.Checks["server TCP"] != "connected" {
				t.Errorf("%d: control %s, %d pairs, checks %v", c.Count, f.Status, len(f.Pairs), f.Checks)
			}
			for _, p := range f.Pairs {
				checkMetrics(t, c.Count, "control", p.Filter)
			}
			if !f.Summary.TCPRatio.Valid() || !f.Summary.RRP50Ratio.Valid() {
				t.Errorf("%d: control without ratios: %+v", c.Count, f.Summary)
			}
		case f.Filter == FilterRampart && f.Status == StatusNotAvailable:
			if f.Reason == "" || len(f.Pairs) != 0 || f.Setup != nil {
				t.Errorf("%d: rampart not available without a reason, or with numbers: %+v", c.Count, f)
			}
			t.Logf("%d: rampart not available: %s", c.Count, f.Reason)
		default:
			checkMeasured(t, c.Count, f)
		}
	}
}

func checkMeasured(t *testing.T, count int, f FilterResult) {
	t.Helper()
	if f.Status != StatusMeasured || len(f.Errors) > 0 || len(f.Pairs) != 1 {
		t.Errorf("%d %s: status %s %s, %d pairs, errors %v", count, f.Filter, f.Status, f.Reason, len(f.Pairs), f.Errors)
		return
	}
	s := f.Setup
	if s == nil || s.Seconds <= 0 || s.CommandSeconds <= 0 || len(s.Commands) == 0 || s.ProbesSent < 2 || s.ProbesAnswered < 1 || s.ProbesAnswered >= s.ProbesSent {
		t.Errorf("%d %s: set-up %+v", count, f.Filter, s)
	} else if s.Entries >= 0 && s.Entries != count {
		t.Errorf("%d %s: holds %d entries", count, f.Filter, s.Entries)
	}
	want := map[string]string{"listed address": "blocked", "unlisted neighbour": "answers", "server": "answers", "server TCP": "connected",
		"listed address after removal": "answers"}
	for k, v := range want {
		if f.Checks[k] != v {
			t.Errorf("%d %s: check %q is %q, want %q", count, f.Filter, k, f.Checks[k], v)
		}
	}
	if f.RemoveSeconds <= 0 {
		t.Errorf("%d %s: removal not timed", count, f.Filter)
	}
	for _, p := range f.Pairs {
		checkMetrics(t, count, f.Filter, p.Filter)
		checkMetrics(t, count, f.Filter+" baseline", p.Base)
	}
	sum := f.Summary
	for name, v := range map[string]float64{"TCP": float64(sum.TCPRatio), "UDP": float64(sum.UDPRatio), "CPU": float64(sum.CPURatio),
		"ping": float64(sum.PingP50Ratio), "RR": float64(sum.RRP50Ratio)} {
		if !(v > 0) {
			t.Errorf("%d %s: %s ratio %v", count, f.Filter, name, v)
		}
	}
}

func checkMetrics(t *testing.T, count int, what string, m *Metrics) {
	t.Helper()
	if m == nil {
		t.Errorf("%d %s: no measurement", count, what)
		return
	}
	if m.TCP.BitsPerSecond <= 0 || m.UDP.BitsPerSecond <= 0 || m.CPU.BitsPerSecond <= 0 || m.CPUPercent <= 0 || len(m.CPU.CPUBusy) == 0 {
		t.Errorf("%d %s: iperf3 numbers missing: %+v", count, what, m)
	}
	if m.Ping.Received < 1 || m.Ping.P50Us <= 0 || m.Ping.P99Us < m.Ping.P50Us {
		t.Errorf("%d %s: ping %+v", count, what, m.Ping)
	}
	if m.RR.Transactions < 1 || m.RR.P50Us <= 0 {
		t.Errorf("%d %s: request/response %+v", count, what, m.RR)
	}
}
