package taps

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampart", "./cmd/rampartd"}}

func TestMain(m *testing.M) { bins.Main(m) }

// monitor run --steer-copies, started under taskset as its help says, hands the copies
// arriving on the monitor's tap-rx to the command's CPU while it runs and back when it
// stops; started on every CPU it refuses.
func TestMonitorRunSteersCopies(t *testing.T) {
	s := newShop(t)
	if _, errs, code := s.e.CLI("monitor", "run", "sec/ids", "--mode", "passive", "--steer-copies"); code == 0 || !strings.Contains(errs, "start it under taskset") {
		t.Errorf("--steer-copies on every CPU: exit %d, %s", code, errs)
	}
	netnsName := filepath.Base(s.e.Endpoint("sec/ids").Netns)
	rps := func() string {
		out, err := exec.Command("ip", "netns", "exec", netnsName, "cat", "/sys/class/net/"+endpoint.MonitorRxIfName+"/queues/rx-0/rps_cpus").CombinedOutput()
		if err != nil {
			t.Fatalf("reading rps_cpus: %v: %s", err, out)
		}
		return strings.TrimLeft(strings.TrimSpace(string(out)), "0,")
	}
	cmd := exec.Command("taskset", "-c", "0", filepath.Join(bins.Dir(t), "rampart"), "--socket", s.e.Config.Socket,
		"monitor", "run", "sec/ids", "--mode", "passive", "--steer-copies")
	var stderr testenv.SyncBuffer // and stdout, where the status lines go
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if !testenv.Eventually(30*time.Second, func() bool { return strings.Contains(stderr.String(), "running") }) {
		t.Fatalf("monitor run did not start:\n%s", stderr.String())
	}
	if got := rps(); got != "1" || !strings.Contains(stderr.String(), "copies handed to CPUs [0]") {
		t.Errorf("while monitor run --steer-copies runs on CPU 0: rps_cpus %q, output:\n%s", got, stderr.String())
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Errorf("monitor run after its interrupt: %v\n%s", err, stderr.String())
	}
	if got := rps(); got != "" {
		t.Errorf("rps_cpus after monitor run stopped: %q, want none", got)
	}
}
