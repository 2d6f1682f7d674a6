package benchkit

import (
	"bytes"
	"context"
	"encoding/json"
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

// ReadReportForTest checks that a quick run wrote exactly one <name>-*.json report and one
// <name>-*.png plot into dir, that the plot is a PNG, and decodes the report into report,
// refusing fields report does not have (a renamed or misspelt field fails the test).
func ReadReportForTest(t testing.TB, dir, name string, report any) {
	t.Helper()
	jsons, _ := filepath.Glob(filepath.Join(dir, name+"-*.json"))
	pngs, _ := filepath.Glob(filepath.Join(dir, name+"-*.png"))
	if len(jsons) != 1 || len(pngs) != 1 {
		t.Fatalf("want one JSON report and one plot, got %v and %v", jsons, pngs)
	}
	if png, err := os.ReadFile(pngs[0]); err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("plot is not a PNG (err %v)", err)
	}
	b, err := os.ReadFile(jsons[0])
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(report); err != nil {
		t.Fatalf("report is not well-formed: %v", err)
	}
}
