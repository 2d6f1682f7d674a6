package benchkit

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
)

// BuildForTest builds the packages pkgs of the module at root into dir, for the tests that
// run a benchmark command in quick mode; a build failure fails t. From a benchmark's package
// the product module (rampartd, rampart) is at ../.. and the bench module at ..: each binary
// is built by its own module, as bench/run-*.sh do.
func BuildForTest(t testing.TB, ctx context.Context, root, dir string, pkgs ...string) {
	t.Helper()
	build := exec.CommandContext(ctx, "go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
}

// RunForTest runs the benchmark command bin with args, logs what it printed, fails t if it
// fails, and returns its standard output and the finished command.
func RunForTest(t testing.TB, ctx context.Context, bin string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("quick run failed: %v", err)
	}
	return stdout.String(), cmd
}

// SkipOrFail skips t for a missing tool or privilege, except under CI=true (CI installs
// and runs everything), where it fails.
func SkipOrFail(t testing.TB, msg string) {
	t.Helper()
	testenv.SkipOrFail(t, "%s", msg)
}

// FortioForTest finds fortio on PATH or where scripts/setup.sh installs it (GOPATH/bin).
func FortioForTest(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("fortio"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, d := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(d, "bin", "fortio")
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	SkipOrFail(t, "fortio not found (scripts/setup.sh installs it)")
	return ""
}
