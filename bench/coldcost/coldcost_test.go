package coldcost

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func TestSummarize(t *testing.T) {
	samples := []Sample{
		{Round: 0, Build: "a", NsPerRun: map[string]float64{ProgFromEp: 300, ProgEmpty: 70}},
		{Round: 1, Build: "a", NsPerRun: map[string]float64{ProgFromEp: 900, ProgEmpty: 80}},
		{Round: 2, Build: "a", NsPerRun: map[string]float64{ProgFromEp: 310, ProgEmpty: 60}},
		{Round: 0, Build: "b", NsPerRun: map[string]float64{ProgFromEp: 200, ProgEmpty: 70}},
	}
	m := Summarize(samples)
	if m["a"][ProgFromEp] != 310 || m["a"][ProgEmpty] != 70 || m["b"][ProgFromEp] != 200 {
		t.Fatalf("medians %v, want a: from_ep 310 (the outlier 900 ignored), empty 70; b: from_ep 200", m)
	}
	rep := &Report{Builds: []Build{{Name: "a"}, {Name: "b"}}, Median: map[string]map[string]float64{
		"a": {ProgFromEp: 310, ProgToEp: 200, ProgEmpty: 70},
		"b": {ProgFromEp: 200, ProgToEp: 150, ProgEmpty: 70},
	}}
	tab := Table(rep)
	for _, row := range []string{"| a | 310 | 200 | 510 | 70 | 370 |", "| b | 200 | 150 | 350 | 70 | 210 |"} {
		if !strings.Contains(tab, row) {
			t.Errorf("table lacks %q:\n%s", row, tab)
		}
	}
}

// TestQuickRun runs the command on two builds (the same binary twice) for two short
// rounds and checks the report: every round measured both builds, both programs ran at
// least once per ping, the empty program gave a floor, outputs written, nothing left
// behind. It asserts no speed.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and pings for a few seconds")
	q := benchkit.BuildQuickRun(t, 5*time.Minute, "coldcost")
	rd := filepath.Join(q.Dir, "rampartd")
	_, cmd := benchkit.RunForTest(t, q.Ctx, q.Bin, "--builds", "x="+rd+",y="+rd,
		"--rampart", filepath.Join(q.Dir, "rampart"), "--rounds", "2", "--pings", "50", "--out", q.Out)
	var rep Report
	benchkit.ReadReportTableForTest(t, q.Out, "cold-cost", &rep)
	if len(rep.Samples) != 4 {
		t.Fatalf("%d samples, want 2 rounds x 2 builds", len(rep.Samples))
	}
	for _, s := range rep.Samples {
		for _, prog := range []string{ProgFromEp, ProgToEp} {
			if s.Runs[prog] < 50 || s.NsPerRun[prog] <= 0 {
				t.Errorf("round %d build %s: %s ran %d times at %.0f ns, want at least 50 runs and a time", s.Round, s.Build, prog, s.Runs[prog], s.NsPerRun[prog])
			}
		}
		if s.Runs[ProgEmpty] < 100 || s.NsPerRun[ProgEmpty] <= 0 {
			t.Errorf("round %d build %s: the empty program ran %d times, want one per packet on both hooks", s.Round, s.Build, s.Runs[ProgEmpty])
		}
	}
	if m := rep.Median["x"]; m[ProgFromEp] <= 0 || m[ProgToEp] <= 0 {
		t.Errorf("medians of x: %v", m)
	}
	// Nothing left: the instance's pins and node namespace went with the agent.
	instance := fmt.Sprintf("cc%d", cmd.Process.Pid%100000)
	benchkit.CheckLeftBehindForTest(t, []string{instance}, "/sys/fs/bpf/rampart/"+instance)
}
