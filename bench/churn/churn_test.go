package churn

import (
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

func TestParsers(t *testing.T) {
	ticks, err := parseStatTicks([]byte("1234 (rampart d) S 1 1234 1234 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 9 0 100 0 0"))
	if err != nil || ticks != 22 {
		t.Fatalf("parseStatTicks = %d, %v; want 17+5", ticks, err)
	}
	rss, err := parseStatusKB([]byte("Name:\trampartd\nRssAnon:\t   20480 kB\nRssFile:\t1 kB\n"), "RssAnon:")
	if err != nil || rss != 20480*1024 {
		t.Fatalf("parseStatusKB = %d, %v", rss, err)
	}
	if _, err := parseStatusKB([]byte("Name:\tx\n"), "RssAnon:"); err == nil {
		t.Fatal("parseStatusKB: no error for a missing field")
	}
	id, memlock, ok := parseMapFdinfo([]byte("pos:\t0\nflags:\t02000002\nmap_type:\t1\nkey_size:\t4\nmemlock:\t8192\nmap_id:\t42\n"))
	if !ok || id != "42" || memlock != 8192 {
		t.Fatalf("parseMapFdinfo = %q %d %v", id, memlock, ok)
	}
	if _, _, ok := parseMapFdinfo([]byte("pos:\t0\nflags:\t02\nprog_type:\t3\nprog_id:\t7\n")); ok {
		t.Fatal("parseMapFdinfo: a program taken for a map")
	}
}

func TestEvaluate(t *testing.T) {
	rep := &Report{Sizes: []int{1}, Series: []Series{
		{Size: 1, Method: MethodAPI, Op: OpAdd, P50: 19},
		{Size: 1, Method: MethodAPI, Op: OpDelete, P50: 40},
		{Size: 1, Method: MethodCLI, Op: OpAdd, P50: 25},
		{Size: 1, Method: MethodCLI, Op: OpDelete, P50: 50},
		{Size: 1, Method: MethodBaseline, Op: OpDelete, P50: 30},
	}}
	got := map[string]bool{}
	for _, c := range Evaluate(rep) {
		got[c.Method+" "+c.What] = c.Pass
	}
	want := map[string]bool{
		"api add p50 ms": true, "api delete p50 / baseline delete p50": true,
		"cli add p50 ms": false, "cli delete p50 / baseline delete p50": false,
	}
	for k, v := range want {
		if pass, ok := got[k]; !ok || pass != v {
			t.Errorf("%s: pass %v (present %v), want %v", k, pass, ok, v)
		}
	}
	if p := percentile([]float64{5, 1, 3, 2, 4}, 50); p != 3 {
		t.Errorf("p50 = %v, want 3", p)
	}
}

// TestQuickRun runs the benchmark at small sizes and checks its outputs and that it left
// nothing behind.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and makes a few dozen endpoints")
	q := benchkit.BuildQuickRun(t, 5*time.Minute, "churn")
	instance := "chq" + testenv.Suffix(5)
	benchkit.RunForTest(t, q.Ctx, q.Bin, "--bin-dir", q.Dir, "--sizes", "1,3", "--rounds", "2",
		"--idle", "1s", "--instance", instance, "--pod-cidr", "198.19.96.0/24", "--baseline-cidr", "198.19.97.0/24", "--out", q.Out)
	var rep Report
	benchkit.ReadReportTableForTest(t, q.Out, "churn", &rep)
	for _, size := range []int{1, 3} {
		for _, m := range Methods {
			for _, op := range []string{OpAdd, OpDelete} {
				if s := rep.Find(size, m, op); s == nil || len(s.Samples) != 2 || s.P50 <= 0 {
					t.Errorf("size %d %s %s: %+v, want 2 samples", size, m, op, s)
				}
			}
		}
	}
	if rep.Idle == nil || rep.Idle.Endpoints != 3 || rep.Idle.RssAnon <= 0 || rep.Idle.MapMemlock <= 0 || rep.Idle.Maps == 0 {
		t.Errorf("idle: %+v", rep.Idle)
	}
	if len(rep.Checks) != 8 {
		t.Errorf("%d checks, want 2 sizes x 2 methods x 2 targets", len(rep.Checks))
	}
	// Nothing left: the agent's instance and the baseline's namespaces.
	benchkit.CheckLeftBehindForTest(t, []string{instance}, "/sys/fs/bpf/rampart/"+instance)
}
