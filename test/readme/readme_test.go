package readme

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// shBlock returns the lines of the first ```sh block of a Markdown file after the line
// heading (a "## " or "### " heading of its own), or of the whole file when heading is "".
func shBlock(t *testing.T, path, heading string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var block []string
	level := strings.SplitAfter(heading, " ")[0] // "## ", "### " or ""
	state := 0                                   // 0: before the section, 1: in it, 2: in its block
	if heading == "" {
		state = 1
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case state == 0 && line == heading:
			state = 1
		case state == 1 && heading != "" && strings.HasPrefix(line, level):
			t.Fatalf("%s: the section %q has no sh block", path, heading)
		case state == 1 && line == "```sh":
			state = 2
		case state == 2 && line == "```":
			return block
		case state == 2:
			block = append(block, line)
		}
	}
	t.Fatalf("%s: no section %q with a closed sh block", path, heading)
	return nil
}

func TestUsingItRunsAsWritten(t *testing.T) {
	testenv.RequireRoot(t)
	text, inst := runBlock(t, "README.md", "## Using it", "quickstart", "qs")
	// The visitor's probe after the policy is the one expected to fail.
	if n := strings.Count(text, "\ndenied\n"); n != 1 {
		t.Errorf("want exactly one denied probe (the visitor's, after the policy), got %d", n)
	}
	for _, want := range []string{
		"guests/visitor", // trace and flows name the endpoints
		"shop/db",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output does not mention %q", want)
		}
	}
	if !strings.Contains(strings.ToLower(text), "drop") {
		t.Errorf("neither the trace nor the flows show a drop")
	}
	if left := testenv.InstanceLeftovers(inst); len(left) > 0 {
		t.Errorf("the block's uninstall left: %s", strings.Join(left, ", "))
	}
}

// runBlock runs the first sh block of the section heading of doc (a path under the
// module root) as a user who pastes it would, with bash -e (a line of the block that
// fails ends the run), in a network namespace of its own, with its instance name name
// (and every other occurrence of name, such as its files in /tmp) renamed to prefix and a
// suffix, so that it can run beside anything else. It fails the test when the block
// fails and returns the block's output and the instance name.
func runBlock(t *testing.T, doc, heading, name, prefix string) (output, inst string) {
	t.Helper()
	root := testenv.ModuleRoot(t)
	block := strings.Join(shBlock(t, filepath.Join(root, doc), heading), "\n") + "\n"
	if !strings.Contains(block, "--instance "+name) {
		t.Fatalf("%s: the block no longer names its instance %s; this test renames it:\n%s", doc, name, block)
	}
	inst = prefix + testenv.Suffix(6)
	script := strings.ReplaceAll(block, name, inst)

	// A network namespace of its own stands in for the host: the agent puts its router
	// address, routes and sysctls there, not in the machine's root namespace. nsenter
	// enters only the network namespace, so /sys/fs/bpf stays visible.
	ns := "rd-" + testenv.Suffix(8)
	testenv.NewNetns(t, ns)
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// bash -e: a line of the block that fails ends the run (the block itself says where a
	// failure is expected, with "|| echo denied").
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+ns, "bash", "-e", "-c", script)
	cmd.Dir = root
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RAMPART_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "PATH="+os.Getenv("PATH")+":/usr/local/go/bin")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	t.Cleanup(func() {
		safetyNet(t, root, ns, inst, cmd)
		for _, f := range []string{"/tmp/rampartd-" + inst + ".log", "/tmp/" + inst + "-rampartd.log", "/tmp/" + inst + "-web.rules", "/tmp/" + inst + "-alerts.txt"} {
			os.Remove(f)
		}
	})
	runErr := cmd.Run()
	output = out.String()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("script:\n%s", script)
		}
		t.Logf("output:\n%s", output) // shown on failure and with -v
	})
	if runErr != nil {
		t.Fatalf("the %s block failed: %v", doc, runErr)
	}
	return output, inst
}

// The walk-through of docs/taps.md (a mirror tap, Suricata in a monitor endpoint through
// monitor run, an alert joined to Rampart's view, monitor alerts, uninstall) runs as
// written; the alert is printed once by each command, and the uninstall leaves nothing of
// the instance, the monitor's files included.
func TestTapsWalkthroughRunsAsWritten(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("suricata"); err != nil {
		testenv.SkipOrFail(t, "suricata not installed (scripts/install-suricata.sh): %v", err)
	}
	text, inst := runBlock(t, "docs/taps.md", "## Running a monitor and reading its alerts", "tapdemo", "tw")
	// monitor run's line (cat) and monitor alerts' line: one alert each.
	if n := strings.Count(text, `alert allowed [1:1000001:1] "probe seen" shop/client (id `); n != 2 {
		t.Errorf("the probe's alert printed %d times, want twice (monitor run, then monitor alerts)", n)
	}
	if !strings.Contains(text, "contract=web-mirror (mirror, ingress at shop/web)") {
		t.Errorf("the alert does not name the mirror contract at shop/web")
	}
	if left := testenv.InstanceLeftovers(inst); len(left) > 0 {
		t.Errorf("the block's uninstall left: %s", strings.Join(left, ", "))
	}
}

// safetyNet removes what a failed run left: the agent (by its instance's uninstall, run in
// the same namespace) and then anything still there.
func safetyNet(t *testing.T, root, ns, inst string, cmd *exec.Cmd) {
	if cmd.Process != nil {
		// The block's background jobs (agent, server) share its process group: a block
		// that failed half way leaves them running. Stop them and wait until they are gone.
		pg := -cmd.Process.Pid
		if syscall.Kill(pg, syscall.SIGTERM) == nil {
			deadline := time.Now().Add(15 * time.Second)
			for syscall.Kill(pg, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			syscall.Kill(pg, syscall.SIGKILL)
		}
	}
	if len(testenv.InstanceLeftovers(inst)) == 0 {
		return
	}
	u := exec.Command("nsenter", "--net=/run/netns/"+ns, filepath.Join(root, "bin", "rampartd"), "--instance", inst, "--uninstall")
	if out, err := u.CombinedOutput(); err != nil {
		t.Logf("uninstall: %v\n%s", err, out)
	}
	testenv.RemoveInstanceLeftovers(inst)
	os.RemoveAll("/tmp/rampartd-" + inst + ".log")
}
