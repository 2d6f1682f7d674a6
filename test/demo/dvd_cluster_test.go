package demo

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// startDVDClusterDemo runs scripts/demo-dvdrental.sh --cluster: a cluster whose state
// directory is /run/rampart-demo-dvc<suffix>, held by a clusterctl process whose command
// line names it.
func startDVDClusterDemo(t *testing.T) *demo {
	requireCluster(t, true)
	for _, f := range []string{"/usr/lib/postgresql/15/bin/postgres", "/usr/sbin/mosquitto", "/usr/bin/suricata"} {
		if _, err := os.Stat(f); err != nil {
			testenv.SkipOrFail(t, "the store's image needs %s (scripts/setup.sh, scripts/install-suricata.sh): %v", f, err)
		}
	}
	inst := "dvc" + testenv.Suffix(6)
	// DEMO_CLUSTER=1 is --cluster: startScript runs the script with no arguments.
	t.Setenv("DEMO_CLUSTER", "1")
	// Real nodes: a few minutes, plus the wait for another real-node test's cluster.
	d := startScript(t, "scripts/demo-dvdrental.sh", inst, 20*time.Minute)
	heldCluster(d, "/run/rampart-demo-"+inst)
	return d
}

// The DVD rental demo's cluster form (scripts/demo-dvdrental.sh --cluster) plays the
// one-node story on two real nodes, every part a pod of the store's image, and every
// outcome is the one the policies say; the cluster is gone afterwards.
func TestDVDRentalClusterDemoRunsToTheEnd(t *testing.T) {
	d := startDVDClusterDemo(t)
	err := d.cmd.Wait()
	out := d.out.String()
	if err != nil {
		t.Fatalf("the DVD rental cluster demo failed: %v\n%s", err, out)
	}
	if strings.Contains(out, "FAIL") || !strings.Contains(out, "every outcome as expected") {
		t.Fatalf("the DVD rental cluster demo did not report every outcome as expected:\n%s", out)
	}
	// The one-node demo's 23 outcomes, and the connection policy found in force first.
	if n := strings.Count(out, "  ok "); n != 24 {
		t.Errorf("the demo reported %d ok outcomes, want 24:\n%s", n, out)
	}
	for _, want := range []string{"ready in ", "the story played in "} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("the demo's times:\n%s", grepLines(out, " ready in ", "played in "))
}

// grepLines returns the lines of out that contain one of subs.
func grepLines(out string, subs ...string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				keep = append(keep, l)
				break
			}
		}
	}
	return strings.Join(keep, "\n")
}

// TestDVDRentalClusterDemoInterrupted presses Ctrl-C while the driver plays the story: the
// demo must stop, say so, exit 130 and remove the whole cluster.
func TestDVDRentalClusterDemoInterrupted(t *testing.T) {
	d := startDVDClusterDemo(t)
	out := d.interrupt(t, "== request integrity, no monitor", 15*time.Minute, "demo-dvdrental: interrupted; cleaning up")
	if strings.Contains(out, "== request-specific connection policy, no monitor") {
		t.Errorf("the demo went on after Ctrl-C")
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", out)
	}
}
