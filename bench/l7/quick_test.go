package l7

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// TestQuickRun runs the benchmark command in quick mode, as CI's smoke test, and checks
// that it produced a well-formed report: every configuration either measured (with
// numbers, passed enforcement checks and a rate search) or, for the L7 ones only, reported
// as not available with a reason; the ratios computed or marked not available; the
// markdown table and the plot written; nothing left behind. It asserts no speed: targets
// belong in the benchmark's output.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and runs the benchmark for about a minute", "nsenter", "taskset", "go")
	fortio := benchkit.FortioForTest(t)
	q := benchkit.BuildQuickRun(t, 8*time.Minute, "l7bench")
	stdout, _ := benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--bin-dir", q.Dir, "--out", q.Out, "--fortio", fortio)
	var res Result
	benchkit.ReadReportTableForTest(t, q.Out, "l7", &res)
	if res.Schema != Schema || !res.Settings.Quick || res.Incomplete || len(res.Errors) > 0 || res.Host.Fortio == "" {
		t.Errorf("schema %q, quick %v, incomplete %v, errors %v, fortio %q", res.Schema, res.Settings.Quick, res.Incomplete, res.Errors, res.Host.Fortio)
	}
	var names []string
	for _, c := range res.Cases {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, CaseNames) {
		t.Fatalf("configurations %v, want %v", names, CaseNames)
	}
	for _, c := range res.Cases {
		checkCase(t, c)
	}
	if len(res.Comparisons) != 2 {
		t.Fatalf("%d comparisons, want 2", len(res.Comparisons))
	}
	for _, c := range res.Comparisons {
		switch c.Verdict {
		case VerdictPass, VerdictMiss:
			// A ratio of 0 is a measurement too: on a loaded machine a configuration may
			// sustain no rate under the p99 bound in a 1 s quick run.
			if !c.Ratio.Valid() || c.Ratio < 0 || c.Rounds != 1 {
				t.Errorf("%s: verdict %s without a ratio: %+v", c.Name, c.Verdict, c)
			}
		case VerdictInvalid:
			// Only when the denominator sustained no rate in the round (timing, not a
			// harness fault); any other INVALID (errors in a case) fails the test.
			if c.Note != "no round with a sustained rate for both" {
				t.Errorf("%s: verdict %s: %s", c.Name, c.Verdict, c.Note)
			}
			t.Logf("%s: %s (quick run on a loaded machine)", c.Name, c.Note)
		case VerdictNotAvailable:
			if c.Note == "" || c.Ratio.Valid() {
				t.Errorf("%s: not available without a reason, or with a number: %+v", c.Name, c)
			}
			t.Logf("%s: not available: %s", c.Name, c.Note)
		default:
			t.Errorf("%s: verdict %s", c.Name, c.Verdict)
		}
	}
	md := stdout
	for _, want := range []string{"| configuration |", "| no-policy |", "| l7-40 |", "L7/L4 throughput", "40 rules/1 rule throughput"} {
		if !strings.Contains(md, want) {
			t.Errorf("printed table lacks %q", want)
		}
	}

	// Nothing left behind: namespaces and pins carry the run's instance name.
	if res.Settings.Instance == "" {
		t.Fatal("instance name not reported")
	}
	benchkit.CheckLeftBehindForTest(t, []string{res.Settings.Instance}, filepath.Join("/sys/fs/bpf/rampart", res.Settings.Instance))
}

// checkCase checks one configuration of a quick run's report.
func checkCase(t *testing.T, c CaseResult) {
	t.Helper()
	s := c.Summary
	if s.Verdict == VerdictNotAvailable {
		if c.Layer != "L7" || c.NotAvailable == "" || len(c.Samples) != 0 || s.SustainedQPS.Valid() {
			t.Errorf("%s: not available must be an L7 configuration with a reason and no numbers: %+v", c.Name, c)
		}
		t.Logf("%s: not available: %s", c.Name, c.NotAvailable)
		return
	}
	if s.Verdict != VerdictMeasured || len(c.Errors) > 0 || len(c.Samples) != 1 {
		t.Errorf("%s: verdict %s, %d samples, errors %v", c.Name, s.Verdict, len(c.Samples), c.Errors)
		return
	}
	x := c.Samples[0]
	l := x.Latency
	if l.Requests <= 0 || l.TargetQPS <= 0 || l.ActualQPS <= 0 || l.MinUs <= 0 || l.P50Us < l.MinUs ||
		l.P90Us < l.P50Us || l.P99Us < l.P90Us || l.P999Us < l.P99Us || l.MaxUs < l.P999Us || len(l.Histogram) == 0 {
		t.Errorf("%s: fixed-rate run lacks numbers: %+v", c.Name, l)
	}
	if x.Saturation.TargetQPS != 0 || x.Saturation.ActualQPS <= 0 || len(x.Steps) == 0 || x.SustainedQPS < 0 {
		t.Errorf("%s: closed-loop run %+v, %d steps, sustained %v", c.Name, x.Saturation, len(x.Steps), x.SustainedQPS)
	}
	for _, st := range x.Steps {
		if st.TargetQPS <= 0 || st.Requests <= 0 || st.Sustained == (st.Why != "") {
			t.Errorf("%s: search step %+v", c.Name, st)
		}
		if st.Sustained && st.TargetQPS > x.SustainedQPS {
			t.Errorf("%s: step at %v passed but sustained is %v", c.Name, st.TargetQPS, x.SustainedQPS)
		}
	}
	if len(x.Probes) == 0 {
		t.Errorf("%s: no enforcement checks recorded", c.Name)
	}
	if c.Name == CaseNone {
		return
	}
	if x.EnforcedSeconds <= 0 || x.EnforcedSeconds < x.ApplySeconds || x.MapEntries < 1 || x.AgentPolicies != 1 || x.DeleteSeconds <= 0 {
		t.Errorf("%s: apply %.3fs enforced %.3fs delete %.3fs, %d map entries, %d policies",
			c.Name, x.ApplySeconds, x.EnforcedSeconds, x.DeleteSeconds, x.MapEntries, x.AgentPolicies)
	}
	if c.Layer == "L7" && x.ProxyProcesses < 1 {
		t.Errorf("%s: measured with no proxy process", c.Name)
	}
}
