package taps

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestQuickRun runs the benchmark command in quick mode, as CI's smoke test, and checks
// that it produced a well-formed report with a pair for every case, that every tap run
// had its tap in the path (copies or redirected packets, counted by the monitor too), that
// the slowed monitor lost copies and the loss is reported, and that it left nothing
// behind. It asserts no speed: targets belong in the benchmark's output.
func TestQuickRun(t *testing.T) {
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds three binaries and runs the benchmark for about a minute")
	}
	for _, tool := range []string{"iperf3", "nsenter", "taskset", "go", "suricata"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.SkipOrFail(t, "%s not found: %v", tool, err)
		}
	}
	fortio := benchkit.FortioForTest(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	benchkit.BuildForTest(t, ctx, "../..", dir, "./cmd/rampartd", "./cmd/rampart")
	benchkit.BuildForTest(t, ctx, "..", dir, "./cmd/tapbench")

	out := filepath.Join(dir, "results")
	stdout, _ := benchkit.RunForTest(t, ctx, filepath.Join(dir, "tapbench"), "--quick", "--bin-dir", dir, "--fortio", fortio, "--out", out)

	var res Result
	benchkit.ReadReportForTest(t, out, "taps", &res)
	if res.Schema != Schema || !res.Settings.Quick || res.Incomplete || len(res.Errors) > 0 {
		t.Errorf("schema %q, quick %v, incomplete %v, errors %v", res.Schema, res.Settings.Quick, res.Incomplete, res.Errors)
	}
	want := []string{CaseMirrorNoReader, CaseAAThroughput, CaseMirrorThroughput, CaseAAWeb, CaseMirrorWeb, CaseMirrorSlow, CaseRedirectThroughput, CaseRedirectLatency}
	if len(res.Cases) != len(want) {
		t.Fatalf("%d cases, want %v", len(res.Cases), want)
	}
	for i, c := range res.Cases {
		if c.Name != want[i] {
			t.Errorf("case %d is %s, want %s", i, c.Name, want[i])
		}
		if len(c.Errors) > 0 || len(c.Samples) != 1 || c.Summary.Verdict == verdictInvalid || !c.Summary.Ratio.Valid() {
			t.Errorf("%s: %d samples, verdict %s, ratio %v, errors %v", c.Name, len(c.Samples), c.Summary.Verdict, c.Summary.Ratio, c.Errors)
			continue
		}
		s := c.Samples[0]
		if !(metric(&c, s.Tap) > 0) || !(metric(&c, s.Base) > 0) {
			t.Errorf("%s: missing numbers: %+v", c.Name, s)
		}
		switch c.Action {
		case "none":
			if s.Counters != nil || s.Monitor != nil {
				t.Errorf("%s: the A/A control has tap counters %+v", c.Name, s.Counters)
			}
		case "mirror":
			if c.Name == CaseMirrorNoReader {
				if s.Counters == nil || s.Counters.MirroredPackets == 0 || s.Monitor != nil {
					t.Errorf("%s: nothing mirrored, or a monitor counted: %+v %+v", c.Name, s.Counters, s.Monitor)
				}
				continue
			}
			if s.Counters == nil || s.Monitor == nil || s.Counters.MirroredPackets == 0 || s.Monitor.KernelPackets == 0 {
				t.Errorf("%s: no copies reached the monitor: %+v %+v", c.Name, s.Counters, s.Monitor)
			}
		case "redirect":
			if s.Counters == nil || s.Monitor == nil || s.Counters.RedirectedPackets == 0 || s.Monitor.Accepted == 0 {
				t.Errorf("%s: nothing went through the monitor: %+v %+v", c.Name, s.Counters, s.Monitor)
			}
		}
	}
	slow := res.find(CaseMirrorSlow)
	if slow.Summary.KernelDrops+slow.Summary.CopiesLost == 0 {
		t.Errorf("the slowed monitor lost no copies: %+v", slow.Summary)
	}
	na := 0
	for _, p := range res.Placements {
		if p.Status == placementNotAvailable && p.Reason != "" {
			na++
		}
	}
	if len(res.Placements) != 4 || na != 3 {
		t.Errorf("placements %+v: want four, three not available with a reason", res.Placements)
	}
	if !strings.Contains(stdout, "| case |") || !strings.Contains(stdout, CaseMirrorSlow+" | 1 |") {
		t.Errorf("no table with the copies lost per run printed")
	}

	// Nothing left behind: namespaces and pins carry the run's instance name.
	inst := res.Settings.Instance
	if inst == "" {
		t.Fatal("instance name not reported")
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.Contains(e.Name(), inst) {
			t.Errorf("network namespace %s left behind", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/bpf/rampart", inst)); !os.IsNotExist(err) {
		t.Errorf("pin directory of %s left behind (stat: %v)", inst, err)
	}
}
