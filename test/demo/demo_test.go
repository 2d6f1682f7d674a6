package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// bins are the binaries of the demos: the cluster demo's driver and cluster holder (its
// nodes run Rampart's image) and the DVD rental store besides the agent, the CLI and the
// test server.
var bins = testenv.Binaries{Packages: []string{"./cmd/rampart", "./cmd/rampartd",
	"./test/rampart-testserver", "./test/cluster/clusterctl", "./examples/marketplace/cmd/marketplace",
	"./examples/dvdrental/cmd/dvdrental"}}

func TestMain(m *testing.M) { bins.Main(m) }

// demo is one run of a demo script in its own process group.
type demo struct {
	cmd  *exec.Cmd
	inst string
	bin  string
	out  *lockedBuffer
	// leftovers lists what the run left behind of its instance; remove removes it.
	leftovers func() []string
	remove    func()
}

func startDemo(t *testing.T) *demo {
	inst := "dm" + testenv.Suffix(6)
	d := startScript(t, "scripts/demo.sh", inst, 3*time.Minute)
	d.leftovers = func() []string { return testenv.InstanceLeftovers(inst) }
	d.remove = func() { testenv.RemoveInstanceLeftovers(inst) }
	return d
}

// startScript runs script with DEMO_INSTANCE=inst; the caller sets leftovers and remove,
// which the test's end checks and runs.
func startScript(t *testing.T, script, inst string, timeout time.Duration) *demo {
	testenv.RequireRoot(t)
	root := testenv.ModuleRoot(t)
	bin := bins.Dir(t)
	d := &demo{inst: inst, bin: bin, out: &lockedBuffer{}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	// By its path, as the README writes it (a script that is not executable fails here),
	// relative to the repository.
	d.cmd = exec.CommandContext(ctx, script)
	d.cmd.Dir = root
	d.cmd.Env = append(os.Environ(), "RAMPART_BIN="+bin, "DEMO_SKIP_SETUP=1", "DEMO_INSTANCE="+d.inst)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	// Its own process group, as a shell gives a foreground job: Ctrl-C reaches the
	// script and everything it started. On timeout SIGTERM runs the demo's cleanup.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	d.cmd.Cancel = func() error { return d.cmd.Process.Signal(syscall.SIGTERM) }
	d.cmd.WaitDelay = 30 * time.Second
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.safetyNet(t) })
	return d
}

func TestDemoRunsToTheEnd(t *testing.T) {
	d := startDemo(t)
	err := d.cmd.Wait()
	out := d.out.String()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	if strings.Contains(out, "WRONG") || !strings.Contains(out, "demo: every outcome as expected") {
		t.Fatalf("demo did not report every outcome as expected:\n%s", out)
	}
	if n := strings.Count(out, "  ok "); n != 10 {
		t.Errorf("demo reported %d ok outcomes, want 10:\n%s", n, out)
	}
}

// TestDemoInterrupted presses Ctrl-C (SIGINT to the process group) while the demo probes
// with policy in place: it must stop there, say it was interrupted, report no outcome as
// WRONG (an interrupted probe is not a denied connection), exit 130 and clean up.
func TestDemoInterrupted(t *testing.T) {
	d := startDemo(t)
	out := d.interrupt(t, "== with policy", 2*time.Minute, "demo: interrupted; cleaning up")
	if strings.Contains(out, "WRONG") {
		t.Errorf("the interrupted demo reported a WRONG outcome")
	}
	if strings.Contains(out, "== why can't the visitor") {
		t.Errorf("the demo went on after Ctrl-C")
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", out)
	}
}

// interrupt waits for a line starting with at, then presses Ctrl-C (SIGINT to the process
// group); the demo must exit 130 and say said. It returns the demo's output.
func (d *demo) interrupt(t *testing.T, at string, timeout time.Duration, said string) string {
	t.Helper()
	if !d.out.waitFor(at, timeout) {
		d.cmd.Process.Signal(syscall.SIGTERM)
		d.cmd.Wait()
		t.Fatalf("the demo never reached %q:\n%s", at, d.out.String())
	}
	if err := syscall.Kill(-d.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := d.cmd.Wait()
	out := d.out.String()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("interrupted demo: exit %v, want status 130", err)
	}
	if !strings.Contains(out, said) {
		t.Errorf("the demo did not say it was interrupted (%q)", said)
	}
	return out
}

// safetyNet fails the test when the demo left anything of its instance behind, and
// removes it.
func (d *demo) safetyNet(t *testing.T) {
	if d.cmd.Process != nil {
		if err := syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL); err == nil {
			t.Errorf("the demo left processes running (killed)")
		}
	}
	if left := d.leftovers(); len(left) > 0 {
		t.Errorf("the demo did not clean up: %s", strings.Join(left, ", "))
		d.remove()
	}
}

// lockedBuffer collects a process's output and lets a test wait for a line.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan struct{}
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until a line of the output starts with prefix.
func (b *lockedBuffer) waitFor(prefix string, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		b.mu.Lock()
		found := hasLine(b.buf.Bytes(), prefix)
		if !found && b.ch == nil {
			b.ch = make(chan struct{})
		}
		ch := b.ch
		b.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-ch:
		case <-deadline:
			return false
		}
	}
}

func hasLine(out []byte, prefix string) bool {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return true
		}
	}
	return false
}

var _ io.Writer = (*lockedBuffer)(nil)
