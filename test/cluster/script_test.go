package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rampartnet/rampart/internal/k8s/controlplane"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// scripts/cluster.sh, for people: start prints a kubeconfig that the built kubectl uses to
// reach a server with the CRDs installed; stop ends both processes and removes the state.
func TestClusterScript(t *testing.T) {
	bin := k8stest.BinDir(t)
	if _, err := os.Stat(filepath.Join(bin, "kube-apiserver")); err != nil {
		testenv.SkipOrFail(t, "control plane binaries missing (scripts/build-k8s.sh): %v", err)
	}
	root := testenv.ModuleRoot(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	script := func(args ...string) (string, error) {
		cmd := exec.Command("bash", append([]string{filepath.Join(root, "scripts/cluster.sh")}, args...)...)
		cmd.Env = append(os.Environ(), "RAMPART_CLUSTER_DIR="+dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	var pids []int
	t.Cleanup(func() {
		script("stop")
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL) // only if stop failed
		}
	})

	out, err := script("start")
	if err != nil {
		t.Fatalf("cluster.sh start: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if kc := lines[len(lines)-1]; kc != filepath.Join(dir, "kubeconfig") {
		t.Errorf("cluster.sh start printed %q last, want the kubeconfig path", kc)
	}
	for _, name := range []string{"etcd", "kube-apiserver"} {
		b, err := os.ReadFile(filepath.Join(dir, name+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if out, err := script("kubectl", "get", "crd", "-o", "name"); err != nil || strings.Count(out, ".cilium.io") != 3 || strings.Count(out, ".rampart.io") != 4 ||
		!strings.Contains(out, "trafficcontrols.crd.antrea.io") {
		t.Errorf("cluster.sh kubectl get crd: %v\n%s", err, out)
	}

	if out, err := script("stop"); err != nil {
		t.Fatalf("cluster.sh stop: %v\n%s", err, out)
	}
	for _, pid := range pids {
		if controlplane.Alive(pid) {
			t.Errorf("pid %d still runs after stop", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state directory after stop: %v", err)
	}
}
