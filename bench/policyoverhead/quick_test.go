package policyoverhead

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// TestQuickRun runs the benchmark command in quick mode, as CI's smoke test, and checks
// that it produced a well-formed report with numbers for every case, that the enforcement
// checks passed, and that it left nothing behind. It asserts no speed: targets belong in
// the benchmark's output.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and runs the benchmark for about 20 s", "iperf3", "nsenter", "taskset", "go")
	q := benchkit.BuildQuickRun(t, 5*time.Minute, "policyoverhead")
	dir, out := q.Dir, q.Out
	stdout, _ := benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--bin-dir", dir, "--out", out)

	var res Result
	benchkit.ReadReportForTest(t, out, "policy-overhead", &res)
	if res.Schema != Schema || !res.Settings.Quick || res.Incomplete || len(res.Errors) > 0 {
		t.Errorf("schema %q, quick %v, incomplete %v, errors %v", res.Schema, res.Settings.Quick, res.Incomplete, res.Errors)
	}
	want := []string{CaseNoAgent, CaseControl, CaseNoPolicy, CaseAllowAll, CaseL3, CaseL4, CaseObserved, "rules-1000", "rules-10000"}
	if len(res.Cases) != len(want) {
		t.Fatalf("%d cases, want %v", len(res.Cases), want)
	}
	basePairs := map[int]bool{}
	for _, b := range res.Cases[0].Samples {
		basePairs[b.Pair] = true
	}
	for i, c := range res.Cases {
		if c.Name != want[i] {
			t.Errorf("case %d is %s, want %s", i, c.Name, want[i])
		}
		// Quick mode: one round; the baseline is measured once next to each agent case.
		wantSamples := 1
		if i == 0 {
			wantSamples = len(want) - 1
		}
		if len(c.Errors) > 0 || c.Summary.Verdict == VerdictInvalid || len(c.Samples) != wantSamples {
			t.Errorf("%s: verdict %s, %d samples (want %d), errors %v", c.Name, c.Summary.Verdict, len(c.Samples), wantSamples, c.Errors)
			continue
		}
		if c.Summary.ThroughputRatio <= 0 || c.Summary.TPSRatio <= 0 || c.Summary.P99Ratio <= 0 {
			t.Errorf("%s: missing ratios: %+v", c.Name, c.Summary)
		}
		for _, s := range c.Samples {
			if s.Iperf.BitsPerSecond <= 0 || s.RR.Transactions <= 0 || s.RR.P50Us <= 0 || s.RR.P99Us < s.RR.P50Us {
				t.Errorf("%s: missing numbers: iperf %+v rr %+v", c.Name, s.Iperf, s.RR)
			}
			if i > 0 && !basePairs[s.Pair] {
				t.Errorf("%s: sample of pair %d has no baseline sample", c.Name, s.Pair)
			}
			if !c.Agent {
				continue
			}
			if len(s.Probes) != len(c.Samples[0].Probes) || len(s.Probes) == 0 {
				t.Errorf("%s: enforcement probes %v", c.Name, s.Probes)
			}
			if c.Name == CaseNoPolicy {
				if s.MapEntries != 0 || s.EnforcedSeconds != 0 {
					t.Errorf("%s: %d map entries, enforced %.3fs; want no policy", c.Name, s.MapEntries, s.EnforcedSeconds)
				}
				continue
			}
			// Every rule is one policy document here, and yields at least one map entry.
			if s.EnforcedSeconds <= 0 || s.EnforcedSeconds < s.ApplySeconds || s.MapEntries < c.Rules ||
				s.AgentPolicies != c.Rules || len(s.Probes) == 0 {
				t.Errorf("%s: apply %.3fs enforced %.3fs, %d map entries and %d policies for %d rules, probes %v",
					c.Name, s.ApplySeconds, s.EnforcedSeconds, s.MapEntries, s.AgentPolicies, c.Rules, s.Probes)
			}
		}
	}
	if !strings.Contains(stdout, "BASELINE") {
		t.Errorf("no table printed")
	}

	// The observed agent's readers read each of what it serves (the run fails otherwise).
	if o := res.Settings.ObservedReads; o == nil || o.MetricsScrapes == 0 || o.ServiceMapReads == 0 || o.FollowFlowBytes == 0 {
		t.Errorf("observed agent's reads: %+v", o)
	}

	// Nothing left behind: namespaces and pins carry the run's instance names.
	instances := []string{res.Settings.BaselineInstance, res.Settings.ControlInstance, res.Settings.AgentInstance, res.Settings.ObservedInstance}
	if slices.Contains(instances, "") {
		t.Fatalf("instance names not reported: %+v", res.Settings)
	}
	benchkit.CheckLeftBehindForTest(t, instances, filepath.Join("/sys/fs/bpf/rampart", res.Settings.AgentInstance),
		filepath.Join("/sys/fs/bpf/rampart", res.Settings.ObservedInstance))

	// Over IPv6: dual-stack topologies, the l4 case's enforcement checks against the
	// server's IPv6 address.
	out6 := filepath.Join(dir, "results6")
	benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--ipv6", "--cases", "control,l4", "--bin-dir", dir, "--out", out6)
	var res6 Result
	benchkit.ReadReportForTest(t, out6, "policy-overhead", &res6)
	if !res6.Settings.IPv6 || !strings.Contains(res6.Settings.PodCIDRAgent, ",2001:2:") || res6.Incomplete || len(res6.Errors) > 0 {
		t.Fatalf("IPv6 run: settings %+v, incomplete %v, errors %v", res6.Settings, res6.Incomplete, res6.Errors)
	}
	if len(res6.Cases) != 3 || res6.Cases[2].Name != CaseL4 {
		t.Fatalf("IPv6 run: cases %+v, want no-agent, control, l4", res6.Cases)
	}
	l4 := res6.Cases[2]
	if len(l4.Errors) > 0 || len(l4.Samples) != 1 || len(l4.Samples[0].Probes) == 0 || l4.Summary.ThroughputRatio <= 0 || l4.Samples[0].RR.Transactions <= 0 {
		t.Errorf("IPv6 l4: errors %v, samples %+v", l4.Errors, l4.Samples)
	}
}
