package applylatency

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

// probeSlackMs is how much later than the API answer a probe may first see the change: a
// probe that began its connection before the kernel held the policy reports after it.
const probeSlackMs = 25

// TestQuickRun runs the benchmark at small sizes, two builds (this checkout twice), and
// checks its outputs, that every sample saw the change in packets, and that it left
// nothing behind.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and starts two agents")
	q := benchkit.BuildQuickRun(t, 5*time.Minute, "applylatency")
	dir := q.Dir
	instance := "alq" + testenv.Suffix(4)
	benchkit.RunForTest(t, q.Ctx, q.Bin, "--builds", "a="+dir+",b="+dir,
		"--sizes", "10,200", "--rounds", "2", "--format", "json", "--instance", instance,
		"--pod-cidr", "198.19.80.0/23", "--work-dir", filepath.Join(dir, "work"), "--out", q.Out)
	var rep Report
	benchkit.ReadReportTableForTest(t, q.Out, "apply-latency", &rep)
	if len(rep.Series) != 8 {
		t.Fatalf("%d series, want 2 builds x 2 sizes x (A, control)", len(rep.Series))
	}
	for _, s := range rep.Series {
		// The rules' entries (see LargePolicy) and the agent's one for the host.
		if len(s.Samples) != 2 || s.Invalid != 0 || s.Entries != 2*s.Rules {
			t.Errorf("%s %d rules control=%v: %d samples, %d invalid, %d map entries; want 2, 0, %d",
				s.Build, s.Rules, s.Control, len(s.Samples), s.Invalid, s.Entries, 2*s.Rules)
		}
		for _, x := range s.Samples {
			// The agent answers after the kernel holds the policy: packets show it by then,
			// and never before the call. "By then" is within the probes' interval plus
			// the time one probe's connection takes, which on a 2-core machine running
			// the agent, the probers and the test can be several milliseconds.
			if x.EnforcedMs <= 0 || x.EnforcedMs > x.APIMs+2*rep.IntervalMs+probeSlackMs || x.AgentCPUMs <= 0 {
				t.Errorf("%s %d rules: sample %+v", s.Build, s.Rules, x)
			}
		}
	}
	// Nothing left: either agent's instance and namespaces.
	benchkit.CheckLeftBehindForTest(t, []string{instance}, "/sys/fs/bpf/rampart/"+instance+"[01]")
}
