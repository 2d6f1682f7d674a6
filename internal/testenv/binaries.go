package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Binaries builds the project's commands once per test binary for tests that run them as
// processes (demos, the README, the daemon's flags). Declare one per package, build with
// Dir, and call Main from TestMain (or Remove from one of the package's own).
type Binaries struct {
	// Packages are the import paths to build, e.g. "./cmd/rampartd" (relative to the
	// repository's root; those under ./examples/ are built in the examples module).
	Packages []string
	// LDFlags, if set, is passed to go build -ldflags.
	LDFlags string

	once sync.Once
	dir  string
	err  error
}

// Main is a test package's TestMain: it runs the tests, removes the built binaries and
// exits with the tests' code.
func (b *Binaries) Main(m *testing.M) {
	code := m.Run()
	b.Remove()
	os.Exit(code)
}

// Dir returns the directory holding the built binaries, building them on first use.
func (b *Binaries) Dir(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "rampart-test-bin-")
		if b.err != nil {
			return
		}
		var flags []string
		if b.LDFlags != "" {
			flags = []string{"-ldflags", b.LDFlags}
		}
		b.err = GoBuild(ModuleRoot(t), b.dir, flags, b.Packages...)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

// examplesDir is the examples module's directory (examples/go.mod, its own module: the
// product module does not build its commands).
const examplesDir = "examples"

// GoBuild builds pkgs (paths relative to the repository's root, e.g. "./cmd/rampartd" or
// "./examples/starwars/cmd/starwars") into the directory out with go build and flags: the
// product module's packages from root, those under examples/ from the examples module.
func GoBuild(root, out string, flags []string, pkgs ...string) error {
	var product, examples []string
	for _, p := range pkgs {
		if rest, ok := strings.CutPrefix(p, "./"+examplesDir+"/"); ok {
			examples = append(examples, "./"+rest)
		} else {
			product = append(product, p)
		}
	}
	for _, m := range []struct {
		dir  string
		pkgs []string
	}{{root, product}, {filepath.Join(root, examplesDir), examples}} {
		if len(m.pkgs) == 0 {
			continue
		}
		args := append(append([]string{"build", "-o", out + "/"}, flags...), m.pkgs...)
		cmd := exec.Command(GoTool(), args...)
		cmd.Dir = m.dir
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s (in %s): %v\n%s", strings.Join(m.pkgs, " "), m.dir, err, b)
		}
	}
	return nil
}

// Remove deletes the built binaries.
func (b *Binaries) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// GoTool is the go command: on PATH, else the one of the toolchain running the test.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// ModuleRoot is the repository's root: the nearest directory above the working directory
// whose go.mod is the product module's (not bench/'s, which is a module of its own).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(b) == "github.com/rampartnet/rampart" {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/rampartnet/rampart above the working directory")
		}
		dir = parent
	}
}

// modulePath is the module path a go.mod declares.
func modulePath(gomod []byte) string {
	for _, l := range strings.Split(string(gomod), "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`)
		}
	}
	return ""
}

// InstanceLeftovers lists what an agent instance inst may have left on this machine at
// its default places: endpoint and node network namespaces (rp-<inst>-*), the BPF pin
// directory, the state directory and the socket. Tests that run an agent as a process
// check it is empty after their uninstall.
func InstanceLeftovers(inst string) []string {
	var left []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "rp-"+inst+"-") {
			left = append(left, "netns "+e.Name())
		}
	}
	for _, p := range []string{
		filepath.Join("/sys/fs/bpf/rampart", inst),
		filepath.Join("/var/lib/rampart", inst),
		filepath.Join("/run/rampart", inst+".sock"),
	} {
		if _, err := os.Stat(p); err == nil {
			left = append(left, p)
		}
	}
	return left
}

// RemoveInstanceLeftovers removes what InstanceLeftovers lists, for a test's safety net
// after the instance's own uninstall failed.
func RemoveInstanceLeftovers(inst string) {
	for _, l := range InstanceLeftovers(inst) {
		if ns, ok := strings.CutPrefix(l, "netns "); ok {
			exec.Command("ip", "netns", "del", ns).Run()
		} else {
			os.RemoveAll(l)
		}
	}
}
