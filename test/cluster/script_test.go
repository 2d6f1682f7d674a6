package cluster

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// scripts/cluster.sh, for people, with the control plane alone (--nodes 0; the cluster
// demo in test/demo starts real nodes with it): start prints a kubeconfig that the built
// kubectl uses to reach a server with the CRDs installed, while a clusterctl process holds
// the cluster; stop ends that process and its etcd and kube-apiserver and removes the state.
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

	out, err := script("start", "--nodes", "0")
	if err != nil {
		t.Fatalf("cluster.sh start: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if kc := lines[len(lines)-1]; kc != filepath.Join(dir, "kubeconfig") {
		t.Errorf("cluster.sh start printed %q last, want the kubeconfig path", kc)
	}
	var st struct{ PID int }
	if b, err := os.ReadFile(filepath.Join(dir, "cluster.json")); err != nil || json.Unmarshal(b, &st) != nil || st.PID == 0 {
		t.Fatalf("cluster.json: %v %s", err, b)
	}
	pids = append(pids, st.PID)
	for _, name := range []string{"etcd", "kube-apiserver"} {
		pid := child(st.PID, name)
		if pid == 0 {
			t.Fatalf("no %s under the cluster's holder (pid %d)", name, st.PID)
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

// child is the pid of parent's child process named comm, 0 if there is none.
func child(parent int, comm string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if lp < 0 || rp < lp || s[lp+1:rp] != comm {
			continue
		}
		f := strings.Fields(s[rp+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(parent) {
			return pid
		}
	}
	return 0
}
