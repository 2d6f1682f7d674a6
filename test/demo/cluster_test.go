package demo

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// startClusterDemo runs scripts/demo-cluster.sh: a cluster whose state directory is
// /run/rampart-demo-dc<suffix>, held by a clusterctl process whose command line names it.
func startClusterDemo(t *testing.T) *demo {
	requireCluster(t, false)
	inst := "dc" + testenv.Suffix(6)
	// Real nodes: a few minutes, plus the wait for another real-node test's cluster.
	d := startScript(t, "scripts/demo-cluster.sh", inst, 20*time.Minute)
	heldCluster(d, "/run/rampart-demo-"+inst)
	return d
}

// requireCluster skips (or fails) the test unless it can run a cluster of real nodes:
// root, the control plane's binaries, and the nodes' (with the store's image if
// storeImage).
func requireCluster(t *testing.T, storeImage bool) {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(k8stest.BinDir(t), "kube-apiserver")); err != nil {
		testenv.SkipOrFail(t, "control plane binaries missing (scripts/build-k8s.sh): %v", err)
	}
	nodetest.FindBins(t, storeImage)
}

// heldCluster makes demo d's leftovers and removal those of the cluster of state
// directory dir: the directory and the clusterctl processes holding it.
func heldCluster(d *demo, dir string) {
	d.leftovers = func() []string {
		var left []string
		if _, err := os.Stat(dir); err == nil {
			left = append(left, dir)
		}
		for _, pid := range holders(dir) {
			left = append(left, "process "+strconv.Itoa(pid))
		}
		return left
	}
	d.remove = func() {
		// The holder removes the cluster on SIGTERM, as scripts/cluster.sh stop asks.
		for _, pid := range holders(dir) {
			syscall.Kill(pid, syscall.SIGTERM)
		}
		testenv.Eventually(3*time.Minute, func() bool { return len(holders(dir)) == 0 })
		os.RemoveAll(dir)
	}
}

// holders are the running clusterctl processes holding the cluster of state directory dir.
func holders(dir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "clusterctl\x00hold") && strings.Contains(string(b), dir+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestClusterDemoRunsToTheEnd(t *testing.T) {
	d := startClusterDemo(t)
	err := d.cmd.Wait()
	out := d.out.String()
	if err != nil {
		t.Fatalf("cluster demo failed: %v\n%s", err, out)
	}
	if strings.Contains(out, "WRONG") || !strings.Contains(out, "demo-cluster: every pair of every scenario as expected") {
		t.Fatalf("the cluster demo did not report every pair as expected:\n%s", out)
	}
	// The baseline and the four scenarios, each with every ordered pair of the six pods.
	if n := strings.Count(out, "all 30 pairs as expected (12 same-node, 18 cross-node)"); n != 5 {
		t.Errorf("the cluster demo checked %d matrices of 30 pairs, want 5:\n%s", n, out)
	}
	// The explanation of a denied cross-node pair: traced on the destination's node, and
	// its flows name the source with its node.
	for _, want := range []string{"8080/TCP: DENIED", "ingress at org-a/", "@node-1 (id "} {
		if !strings.Contains(out, want) {
			t.Errorf("the cluster demo's output lacks %q:\n%s", want, out)
		}
	}
	checkExplanation(t, out)
}

// checkExplanation checks that the demo's explanation of a pair it announces as denied
// shows what it says: the first trace under the announcement denies it, each trace says
// which sides it judged, and a trace that allows says where the pair is denied instead.
func checkExplanation(t *testing.T, out string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return strings.HasSuffix(l, ", 8080/TCP: denied") })
	if at < 0 {
		t.Errorf("the cluster demo announces no denied pair:\n%s", out)
		return
	}
	verdicts, judges, conclusions := 0, 0, 0
	for _, l := range lines[at+1:] {
		switch {
		case strings.HasPrefix(l, "$ rampart policy trace "):
			judges++
			if !strings.Contains(l, ", which judges the ") {
				t.Errorf("a trace that does not say which side it judges: %q", l)
			}
		case strings.Contains(l, " 8080/TCP: ALLOWED") || strings.Contains(l, " 8080/TCP: DENIED"):
			if verdicts == 0 && !strings.Contains(l, "DENIED") {
				t.Errorf("the pair is announced as denied, and the first trace under it reads %q", l)
			}
			verdicts++
		case strings.HasPrefix(l, "=> "):
			conclusions++
			if strings.Contains(l, " allows ") && !strings.Contains(l, "the pair is denied on ") {
				t.Errorf("a trace that allows, with no word on where the pair is denied: %q", l)
			}
		}
	}
	if verdicts != 2 || judges != 2 || conclusions != 2 {
		t.Errorf("the explanation shows %d traces (%d saying what they judge, %d concluded), want 2 of each:\n%s",
			verdicts, judges, conclusions, strings.Join(lines[at:], "\n"))
	}
}

// TestClusterDemoInterrupted presses Ctrl-C while the demo checks the first scenario: it
// must stop, say so, exit 130 and remove the whole cluster.
func TestClusterDemoInterrupted(t *testing.T) {
	d := startClusterDemo(t)
	out := d.interrupt(t, "== scenario b-to-a", 15*time.Minute, "demo-cluster: interrupted; cleaning up")
	if strings.Contains(out, "== scenario a-to-b") {
		t.Errorf("the cluster demo went on after Ctrl-C")
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", out)
	}
}
