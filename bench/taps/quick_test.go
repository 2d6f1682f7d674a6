package taps

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// TestQuickRun runs the benchmark command in quick mode, as CI's smoke test, and checks
// that it produced a well-formed report with a pair for every case, that every tap run
// had its tap in the path (copies or redirected packets, counted by the monitor too, and
// by the monitor's node when it is another), that every Table II placement was measured,
// that the slowed monitor lost copies and the loss is reported, and that it left nothing
// behind. It asserts no speed: targets belong in the benchmark's output.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and runs the benchmark for about a minute and a half", "iperf3", "nsenter", "taskset", "go", "suricata")
	fortio := benchkit.FortioForTest(t)
	q := benchkit.BuildQuickRun(t, 6*time.Minute, "tapbench")
	stdout, _ := benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--bin-dir", q.Dir, "--fortio", fortio, "--out", q.Out)
	var res Result
	benchkit.ReadReportForTest(t, q.Out, "taps", &res)
	if res.Schema != Schema || !res.Settings.Quick || res.Incomplete || len(res.Errors) > 0 {
		t.Errorf("schema %q, quick %v, incomplete %v, errors %v", res.Schema, res.Settings.Quick, res.Incomplete, res.Errors)
	}
	want := []string{CaseMirrorNoReader, CaseAAThroughput, CaseMirrorThroughput, CaseMirrorBRemote, CaseAAWeb, CaseMirrorWeb,
		CaseMirrorThroughputSteered, CaseMirrorWebSteered, CaseMirrorSRemote, CaseMirrorThreeNodes, CaseMirrorSlow, CaseRedirectThroughput, CaseRedirectLatency}
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
			// A monitor on another node gets its copies through that node's tap tunnel.
			remote := c.Name == CaseMirrorSRemote || c.Name == CaseMirrorThreeNodes
			if remote != (s.Remote != nil) || (remote && s.Remote.Delivered == 0) {
				t.Errorf("%s: counters of the monitor's node %+v", c.Name, s.Remote)
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
	if len(res.Placements) != 4 {
		t.Errorf("placements %+v: want Table II's four", res.Placements)
	}
	for _, p := range res.Placements {
		if c := res.find(p.Case); c == nil || !c.Summary.Ratio.Valid() || p.Published == nil {
			t.Errorf("placement %q not measured (case %q)", p.Name, p.Case)
		}
	}
	if !strings.Contains(stdout, "| case |") || !strings.Contains(stdout, CaseMirrorSlow+" | 1 |") ||
		!strings.Contains(stdout, "| A, B and S on three nodes | node-b | node-c |") {
		t.Errorf("no table with the placements and the copies lost per run printed")
	}

	// Nothing left behind: namespaces and pins carry the run's instance name.
	inst := res.Settings.Instance
	if inst == "" {
		t.Fatal("instance name not reported")
	}
	benchkit.CheckLeftBehindForTest(t, []string{inst}, filepath.Join("/sys/fs/bpf/rampart", inst+"[abc]"))
}
