package services

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestQuickRun runs the benchmark at 1 and 20 Services for one round and checks that a
// request through every Service answered through both Rampart and kube-proxy (and that a
// client with no translation got no answer), that every sample and programming time was
// measured, and that the run left nothing behind.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "starts an API server, kube-proxy and an agent")
	k8s, err := exec.Command("bash", "../../scripts/build-k8s.sh", "--dir").Output()
	if err != nil {
		t.Fatalf("scripts/build-k8s.sh --dir: %v", err)
	}
	node, err := exec.Command("bash", "../../scripts/build-node.sh", "--dir").Output()
	if err != nil {
		t.Fatalf("scripts/build-node.sh --dir: %v", err)
	}
	kubeProxy := filepath.Join(strings.TrimSpace(string(node)), "kube-proxy")
	k8sDir := strings.TrimSpace(string(k8s))
	for _, f := range []string{kubeProxy, filepath.Join(k8sDir, "kube-apiserver"), filepath.Join(k8sDir, "etcd")} {
		if _, err := os.Stat(f); err != nil {
			benchkit.SkipOrFail(t, "missing "+f+" (scripts/build-k8s.sh, scripts/build-node.sh build it)")
		}
	}
	q := benchkit.BuildQuickRun(t, 4*time.Minute, "svcbench")
	prefix := "svbq" + testenv.Suffix(4)
	benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--bin-dir", q.Dir, "--k8s-bin-dir", k8sDir,
		"--kube-proxy", kubeProxy, "--prefix", prefix, "--out", q.Out)
	var rep Report
	benchkit.ReadReportForTest(t, q.Out, "services", &rep)
	if len(rep.Stages) != 2 || rep.Stages[0].Services != 1 || rep.Stages[1].Services != 20 {
		t.Fatalf("stages %+v, want 1 and 20 Services", rep.Stages)
	}
	for _, st := range rep.Stages {
		if st.Checked != st.Services {
			t.Errorf("%d Services: %d answered through both, want every one", st.Services, st.Checked)
		}
		if len(st.Programming) != 2 {
			t.Errorf("%d Services: programming %+v, want kube-proxy and rampart", st.Services, st.Programming)
		}
		for _, p := range st.Programming {
			if p.Seconds <= 0 || p.RSSBytes <= 0 || (p.Name == Rampart) != (p.MapBytes > 0) ||
				(p.Name == Rampart) != (p.ServingSeconds > 0) || p.ServingSeconds > p.Seconds {
				t.Errorf("%d Services: %+v, want a time, memory, and a start-up and map memory for rampart only", st.Services, p)
			}
		}
		if len(st.Cases) != len(caseNames) {
			t.Fatalf("%d Services: %d cases, want %d", st.Services, len(st.Cases), len(caseNames))
		}
		for i, c := range st.Cases {
			if c.Name != caseNames[i] || len(c.Samples) != 1 {
				t.Errorf("%d Services: case %q with %d samples, want %q with 1", st.Services, c.Name, len(c.Samples), caseNames[i])
				continue
			}
			if s := c.Samples[0]; s.ConnectP50us <= 0 || s.ConnectP99us < s.ConnectP50us || s.RPS <= 0 {
				t.Errorf("%d Services, %s: sample %+v", st.Services, c.Name, s)
			}
		}
	}
	// Nothing left: namespaces, cgroups, the host link, the agent's pins.
	benchkit.CheckLeftBehindForTest(t, []string{prefix},
		"/sys/fs/bpf/rampart/"+prefix, "/sys/class/net/"+prefix+"-h", filepath.Join(cgroup2Root(), prefix+"-rp"))
}
