package simcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampartd", "./cmd/rampart-cni", "./test/rampart-podrunner"}}

func TestMain(m *testing.M) { bins.Main(m) }

func config(t *testing.T, nodes int, tunnel string) Config {
	testenv.RequireRoot(t)
	k8s := k8stest.BinDir(t)
	if _, err := os.Stat(filepath.Join(k8s, "kube-apiserver")); err != nil {
		testenv.SkipOrFail(t, "control plane binaries missing (scripts/build-k8s.sh): %v", err)
	}
	cfg := Config{
		Dir: filepath.Join(t.TempDir(), "cluster"), K8sBinDir: k8s, BinDir: bins.Dir(t),
		Name: "sc" + testenv.Suffix(6), Nodes: nodes, Tunnel: tunnel, Logf: t.Logf,
	}
	// Only if the test failed before its own Stop.
	t.Cleanup(func() {
		if _, err := os.Stat(StatePath(cfg.Dir)); err == nil {
			if err := Stop(cfg.Dir); err != nil {
				t.Errorf("stopping the cluster: %v", err)
			}
		}
	})
	return cfg
}

// leftovers lists what of cluster cfg still exists: its namespaces, pins, and processes
// whose command line names its directory or namespaces (etcd, kube-apiserver, rampartd,
// rampart-podrunner).
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func leftovers(cfg Config) []string {
	var left []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "rp-"+cfg.Name) {
			left = append(left, "netns "+e.Name())
		}
	}
	pins, _ := filepath.Glob("/sys/fs/bpf/rampart/" + cfg.Name + "*")
	left = append(left, pins...)
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && (strings.Contains(string(b), cfg.Dir) || strings.Contains(string(b), "rp-"+cfg.Name)) {
			left = append(left, "process "+e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if _, err := os.Stat(StatePath(cfg.Dir)); err == nil {
		left = append(left, StatePath(cfg.Dir))
	}
	if cg := filepath.Join(datapath.DefaultServiceCgroup(), "rampart-"+cfg.Name); fileExists(cg) {
		left = append(left, "cgroup "+cg)
	}
	return left
}

// Two nodes with native routing: both agents sync and see the other node as the pod
// runners registered it; Stop leaves nothing behind.
func TestStartStop(t *testing.T) {
	cfg := config(t, 2, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(cfg.Dir)
	if err != nil || len(loaded.Nodes) != 2 || loaded.Kubeconfig != s.Kubeconfig {
		t.Fatalf("the state file: %+v, %v", loaded, err)
	}
	for i, n := range s.Nodes {
		c := api.NewClient(n.Socket)
		st, err := c.Status(ctx)
		c.Close()
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		k := st.Kubernetes
		if k == nil || !k.Synced || k.NodeName != n.Name || k.NodeAddress != NodeAddress(i).String() || st.PodCIDR != NodePodCIDR(i).String() {
			t.Errorf("%s's agent: pod CIDR %s, Kubernetes %+v; want node %s at %s, pods %s", n.Name, st.PodCIDR, k, n.Name, NodeAddress(i), NodePodCIDR(i))
		}
		// The other node arrives with its Node object, which its runner may register
		// after this agent's first sync.
		if !testenv.Eventually(30*time.Second, func() bool {
			c := api.NewClient(n.Socket)
			defer c.Close()
			nodes, err := c.ListNodes(ctx)
			return err == nil && len(nodes) == 1
		}) {
			t.Errorf("%s's agent does not know the other node", n.Name)
		}
	}
	if _, err := Start(ctx, cfg); err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("a second Start in the same directory: %v, want refused", err)
	}
	// The pod runners (so the pods) run in the cluster's cgroup, the one its agents
	// translate Services for.
	for _, n := range s.Nodes {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", n.RunnerPID))
		if err != nil || !strings.Contains(string(b), "0::/rampart-"+cfg.Name+"\n") {
			t.Errorf("%s's pod runner's cgroups: %q, %v; want the cluster's (%s)", n.Name, b, err, s.Cgroup)
		}
	}
	// The check below finds a running cluster: 3 namespaces, 2 pin directories, 6
	// processes, the state file, the cgroup.
	if left := leftovers(cfg); len(left) != 13 {
		t.Errorf("a running cluster's parts: %d, want 13: %s", len(left), strings.Join(left, "; "))
	}
	if err := Stop(cfg.Dir); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(cfg); len(left) > 0 {
		t.Errorf("Stop left: %s", strings.Join(left, "; "))
	}
}

// A node that fails to start (its agent refuses the tunnel mode) fails Start, which
// removes everything it had started: control plane, namespaces, the other processes.
func TestStartFailureCleansUp(t *testing.T) {
	cfg := config(t, 2, "no-such-tunnel")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := Start(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "rampartd exited") {
		t.Fatalf("Start with a bad tunnel mode: %v, want the agent's exit", err)
	}
	if left := leftovers(cfg); len(left) > 0 {
		t.Errorf("a failed Start left: %s", strings.Join(left, "; "))
	}
}

// Start interrupted (its context cancelled, as clusterctl does on Ctrl-C) once both
// nodes' processes run: it returns the cancellation and leaves nothing behind.
func TestStartInterrupted(t *testing.T) {
	cfg := config(t, 2, "vxlan")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.Logf = func(format string, args ...any) {
		t.Logf(format, args...)
		if strings.HasPrefix(format, "starting %s") && args[0] == "node-2" {
			cancel()
		}
	}
	_, err := Start(ctx, cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted Start: %v, want context.Canceled", err)
	}
	if left := leftovers(cfg); len(left) > 0 {
		t.Errorf("an interrupted Start left: %s (Start returned: %v)", strings.Join(left, "; "), err)
	}
}
