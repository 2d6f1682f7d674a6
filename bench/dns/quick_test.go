package dns

import (
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestQuickRun runs the benchmark in quick mode and checks that every case was measured,
// that every new name was answered and its address open from the first packet, that the
// proxy counted the queries, and that the run left nothing behind.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "starts an agent")
	q := benchkit.BuildQuickRun(t, 4*time.Minute, "dnsbench")
	prefix := "dnbq" + testenv.Suffix(4)
	benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--bin-dir", q.Dir, "--prefix", prefix, "--out", q.Out)
	var rep Report
	benchkit.ReadReportForTest(t, q.Out, "dns", &rep)
	if len(rep.Cases) != len(caseDefs) {
		t.Fatalf("%d cases, want %d", len(rep.Cases), len(caseDefs))
	}
	for i, c := range rep.Cases {
		if c.Name != caseDefs[i].name || len(c.Samples) != 1 {
			t.Errorf("case %q with %d samples, want %q with 1", c.Name, len(c.Samples), caseDefs[i].name)
			continue
		}
		if s := c.Samples[0]; s.P50us <= 0 || s.P99us < s.P50us || s.QPS <= 0 {
			t.Errorf("%s: sample %+v", c.Name, s)
		}
		if !c.P50Ratio.Median.Valid() || !c.QPSRatio.Median.Valid() {
			t.Errorf("%s: ratios %+v %+v", c.Name, c.P50Ratio, c.QPSRatio)
		}
	}
	if len(rep.Learn.Stages) != 2 || len(rep.Learn.Curve) == 0 {
		t.Fatalf("learn: %d stages and %d curve points, want 2 and some", len(rep.Learn.Stages), len(rep.Learn.Curve))
	}
	for i, st := range rep.Learn.Stages {
		for _, s := range []LearnStats{st.Learning, st.Baseline} {
			if s.Names != rep.Learn.NamesPerBlock || s.NoAnswer != 0 || s.FirstPacketDropped != 0 || s.ResolveP50us <= 0 || s.ConnectP50us <= 0 {
				t.Errorf("stage %d: %+v, want every name answered and its first packet passed", i+1, s)
			}
		}
	}
	if st := rep.Learn.Stages[1]; st.LearntAtStart < 100 {
		t.Errorf("second stage starts at %d learnt addresses, want 100", st.LearntAtStart)
	}
	if d := rep.DNS; d.State != "running" || d.Queries == 0 || d.Refused == 0 || d.LearnErrors != 0 {
		t.Errorf("DNS status %+v, want running, queries and refused counted, no learn errors", d)
	}
	// Nothing left: namespaces, the agent's pins.
	benchkit.CheckLeftBehindForTest(t, []string{prefix}, "/sys/fs/bpf/rampart/"+prefix)
}
