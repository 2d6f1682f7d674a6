package demo

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

func startDVDRental(t *testing.T) *demo {
	for _, tool := range []string{"mosquitto", "/usr/lib/postgresql/15/bin/postgres", "runuser", "suricata"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.SkipOrFail(t, "%s not installed (scripts/setup.sh installs it): %v", tool, err)
		}
	}
	inst := "dv" + testenv.Suffix(6)
	d := startScript(t, "scripts/demo-dvdrental.sh", inst, 4*time.Minute)
	d.leftovers = func() []string {
		left := testenv.InstanceLeftovers(inst)
		// The store's servers run in the demo's work directory, named in their command lines.
		if out, err := exec.Command("pgrep", "-af", "rampart-dvd.*").Output(); err == nil && len(out) > 0 {
			left = append(left, "processes: "+strings.TrimSpace(string(out)))
		}
		return left
	}
	d.remove = func() {
		testenv.RemoveInstanceLeftovers(inst)
		exec.Command("pkill", "-f", "rampart-dvd.*").Run()
	}
	return d
}

// The DVD rental demo plays the rental and the attacks with real services, PostgreSQL and
// mosquitto, and every outcome is the one the policies say.
func TestDVDRentalDemoRunsToTheEnd(t *testing.T) {
	d := startDVDRental(t)
	err := d.cmd.Wait()
	out := d.out.String()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	if strings.Contains(out, "FAIL") || !strings.Contains(out, "every outcome as expected") {
		t.Fatalf("demo did not report every outcome as expected:\n%s", out)
	}
	if n := strings.Count(out, "  ok "); n != 23 {
		t.Errorf("demo reported %d ok outcomes, want 23:\n%s", n, out)
	}
}
