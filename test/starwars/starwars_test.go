package starwars

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// steps lists every outcome the demo must check, by step. A check that the demo did not
// report at all fails the test as surely as one it reported wrong.
var steps = []struct {
	name string
	ids  []string
	// maySkip: the demo may skip these checks, saying why (L7 needs Envoy, which
	// scripts/setup.sh installs); the subtest is then skipped with that reason, never
	// passed, and with CI=true it fails instead.
	maySkip bool
}{
	{"1-no-policy", []string{
		"1.xwing-lands", "1.api-hides-exhaust-port", "1.legacy-leaks", "1.secure-refuses-anonymous",
		"1.exhaust-port-hit", "1.deathstar-destroyed", "1.deathstar-unreachable",
	}, false},
	{"2-l3-l4-ingress", []string{
		"2.xwing-refused", "2.tiefighter-lands", "2.flow-xwing-dropped", "2.flow-tiefighter-allowed-by-rule1",
		"2.l4-cannot-stop-exhaust-port", "2.deathstar-destroyed-again",
	}, false},
	{"3-l3-l4-egress", []string{
		"3.tiefighter-lands", "3.upload-secure-ok", "3.upload-legacy-fails", "3.secure-has-new-log",
		"3.legacy-gets-nothing-new", "3.flow-legacy-dropped", "3.flow-secure-allowed",
	}, false},
	{"4-l7", []string{
		"4.get-v1-allowed", "4.tiefighter-lands", "4.source-address-kept", "4.exhaust-port-denied",
		"4.exhaust-port-never-reaches-deathstar", "4.deathstar-stays-up", "4.xwing-still-refused",
		"4.flow-exhaust-port-denied",
	}, true},
}

var (
	resultRE = regexp.MustCompile(`^  (ok|WRONG|SKIP) +\[([^\]]+)\] (.*)$`)
	skipRE   = regexp.MustCompile(`^demo-starwars: step 4 \(L7\) was NOT run: (.*)$`)
)

type result struct{ status, detail string }

func TestStarWarsDemo(t *testing.T) {
	testenv.RequireRoot(t)
	if err := exec.Command("python3", "-c", "import pyftpdlib").Run(); err != nil {
		testenv.SkipOrFail(t, "pyftpdlib is not importable by python3 (scripts/setup.sh installs it): %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	bin := t.TempDir()
	if err := testenv.GoBuild(root, bin, nil, "./cmd/rampart", "./cmd/rampartd", "./examples/starwars/cmd/starwars"); err != nil {
		t.Fatal(err)
	}

	inst := "sw" + testenv.Suffix(6)
	// The agent's socket lives in the work directory: keep its path short.
	work, err := os.MkdirTemp("", "sw-")
	if err != nil {
		t.Fatal(err)
	}
	work = filepath.Join(work, "w")
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(work)) })

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// By its path, as the README writes it (a script that is not executable fails here).
	cmd := exec.CommandContext(ctx, "scripts/demo-starwars.sh")
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"RAMPART_BIN="+bin, "STARWARS_SKIP_SETUP=1", "STARWARS_INSTANCE="+inst, "STARWARS_WORK="+work)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, so that whatever it started can be found and stopped should
	// its own cleanup not run. On timeout it gets SIGTERM first, which runs that cleanup.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	t.Cleanup(func() { safetyNet(t, cmd, bin, inst, work) })

	start := time.Now()
	runErr := cmd.Run()
	t.Logf("demo ran for %s", time.Since(start).Round(time.Millisecond))
	if ctx.Err() != nil {
		t.Errorf("the demo did not finish within the time limit")
	}

	results := map[string]result{}
	skipReason := ""
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		line := sc.Text()
		if m := resultRE.FindStringSubmatch(line); m != nil {
			if _, dup := results[m[2]]; dup {
				t.Errorf("check %s reported twice", m[2])
			}
			results[m[2]] = result{m[1], m[3]}
		}
		if m := skipRE.FindStringSubmatch(line); m != nil {
			skipReason = m[1]
		}
	}

	wrong := 0
	for _, r := range results {
		if r.status == "WRONG" {
			wrong++
		}
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			skipped := 0
			for _, id := range st.ids {
				r, ok := results[id]
				switch {
				case !ok:
					t.Errorf("%s: not reported by the demo", id)
				case r.status == "WRONG":
					t.Errorf("%s: %s", id, r.detail)
				case r.status == "SKIP" && !st.maySkip:
					t.Errorf("%s: skipped, which this step must never be: %s", id, r.detail)
				case r.status == "SKIP":
					skipped++
				}
			}
			if skipped > 0 && !t.Failed() {
				if skipped != len(st.ids) {
					t.Fatalf("only %d of %d checks skipped: a step is run whole or not at all", skipped, len(st.ids))
				}
				if skipReason == "" {
					t.Fatal("checks skipped but the demo gave no reason")
				}
				testenv.SkipOrFail(t, "the demo did not run this step: %s", skipReason)
			}
		})
	}
	// Checks the demo reported that this test does not know are a sign that the two have
	// drifted apart.
	known := map[string]bool{}
	for _, st := range steps {
		for _, id := range st.ids {
			known[id] = true
		}
	}
	for id, r := range results {
		if !known[id] {
			t.Errorf("the demo reported an unknown check %s (%s %s)", id, r.status, r.detail)
		}
	}

	// The exit status must agree with the checks: non-zero exactly when one is wrong.
	var ee *exec.ExitError
	switch {
	case runErr == nil && wrong > 0:
		t.Errorf("the demo exited 0 with %d wrong outcome(s)", wrong)
	case runErr != nil && !errors.As(runErr, &ee):
		t.Errorf("running the demo: %v", runErr)
	case runErr != nil && wrong == 0:
		t.Errorf("the demo failed (%v) without a wrong outcome", runErr)
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", out.String())
	}
}

// safetyNet checks that the demo removed everything it created, and removes what it left:
// its processes (by process group), the agent's endpoints, namespaces and pins.
func safetyNet(t *testing.T, cmd *exec.Cmd, bin, inst, work string) {
	if cmd.Process != nil {
		// Only our own process group; ESRCH when the demo left nothing running.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err == nil {
			t.Errorf("the demo left processes running (killed)")
		}
	}
	left := testenv.InstanceLeftovers(inst)
	if _, err := os.Stat(work); err == nil {
		left = append(left, work)
	}
	if len(left) == 0 {
		return
	}
	t.Errorf("the demo did not clean up: %s", strings.Join(left, ", "))
	u := exec.Command(filepath.Join(bin, "rampartd"), "--instance", inst, "--state-dir", filepath.Join(work, "state"),
		"--socket", filepath.Join(work, "rampart.sock"), "--node-netns", "rp-"+inst+"-node", "--uninstall")
	if out, err := u.CombinedOutput(); err != nil {
		t.Logf("uninstall: %v\n%s", err, out)
	}
	testenv.RemoveInstanceLeftovers(inst)
}
