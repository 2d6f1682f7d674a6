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
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// RequireQuickRun readies the test of a benchmark command's quick run: it needs root, is
// skipped in short mode (short says what the run does), and is skipped for a tool missing
// from PATH (failed under CI=true).
func RequireQuickRun(t testing.TB, short string, tools ...string) {
	t.Helper()
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip(short)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			SkipOrFail(t, tool+" not found (scripts/setup.sh installs it): "+err.Error())
		}
	}
}

// QuickRun is what BuildQuickRun made for a quick run of a benchmark command.
type QuickRun struct {
	Ctx context.Context // ends after the run's time, or with the test
	Dir string          // the binaries: rampartd, rampart, the extra packages' and the command
	Out string          // Dir/results, for the command's --out
	Bin string          // the benchmark command
}

// BuildQuickRun builds rampartd, rampart and the product's extra packages, and the bench
// module's cmd/command, into a temporary directory for a quick run of at most timeout. From
// a benchmark's package the product module is at ../.. and the bench module at ...
func BuildQuickRun(t testing.TB, timeout time.Duration, command string, extra ...string) *QuickRun {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	BuildForTest(t, ctx, "../..", dir, append([]string{"./cmd/rampartd", "./cmd/rampart"}, extra...)...)
	BuildForTest(t, ctx, "..", dir, "./cmd/"+command)
	return &QuickRun{Ctx: ctx, Dir: dir, Out: filepath.Join(dir, "results"), Bin: filepath.Join(dir, command)}
}

// CheckLeftBehindForTest fails t for every path (a glob pattern) that exists and every
// network namespace whose name holds one of names: what a run removes at its end.
func CheckLeftBehindForTest(t testing.TB, names []string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		for _, n := range names {
			if n != "" && strings.Contains(e.Name(), n) {
				t.Errorf("left behind: /run/netns/%s", e.Name())
			}
		}
	}
}

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

// FortioForTest finds fortio (FindFortio), skipping t without it.
func FortioForTest(t testing.TB) string {
	t.Helper()
	p, err := FindFortio()
	if err != nil {
		SkipOrFail(t, "fortio not found (scripts/setup.sh installs it)")
	}
	return p
}

// ReadReportTableForTest is ReadReportForTest for a run that also writes a markdown table
// (<name>-*.md).
func ReadReportTableForTest(t testing.TB, dir, name string, report any) {
	t.Helper()
	if mds, _ := filepath.Glob(filepath.Join(dir, name+"-*.md")); len(mds) != 1 {
		t.Fatalf("want one markdown table, got %v", mds)
	}
	ReadReportForTest(t, dir, name, report)
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
