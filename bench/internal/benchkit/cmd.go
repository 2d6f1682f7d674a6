package benchkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// productModule is the product's module path: bench/go.mod replaces it with the checkout
// the bench module sits in (../), so the benchmarks always measure this tree.
const productModule = "github.com/rampartnet/rampart"

// AgentBinDir returns binDir, the directory holding rampartd and rampart (and the extra
// commands' binaries), or when it is empty a temporary directory with them built into it
// by BuildAgent; cleanup removes what it made.
func AgentBinDir(ctx context.Context, binDir string, extra ...string) (dir string, cleanup func(), err error) {
	if binDir != "" {
		return binDir, func() {}, nil
	}
	if dir, err = os.MkdirTemp("", "rp-bench-bin-"); err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	if err := BuildAgent(ctx, dir, extra...); err != nil {
		cleanup()
		return "", nil, err
	}
	return dir, cleanup, nil
}

// BuildAgent builds rampartd, rampart and the extra commands (package paths such as
// ./cmd/rampart-cni) into dir from the product module of this checkout:
// the bench module's replacement of it when run inside bench/, the main module when run in
// the repository root.
func BuildAgent(ctx context.Context, dir string, extra ...string) error {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", productModule).Output()
	root := strings.TrimSpace(string(out))
	if err != nil || root == "" {
		return errors.New("not inside the rampart repository: run from it or pass --bin-dir")
	}
	args := append([]string{"build", "-o", dir + "/", "./cmd/rampartd", "./cmd/rampart"}, extra...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building rampartd, rampart %v: %w", extra, err)
	}
	return nil
}

// SplitList splits a comma-separated flag value, dropping empty items and blanks.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// CutUnit cuts a unit suffix (one of units' keys) off the number s: it returns the number's
// text and the unit's multiplier, or s and 1 without one.
func CutUnit(s string, units map[string]float64) (string, float64) {
	for suf, m := range units {
		if strings.HasSuffix(s, suf) {
			return strings.TrimSuffix(s, suf), m
		}
	}
	return s, 1
}

// Ints parses a comma-separated flag value of whole numbers (SplitList).
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range SplitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// FindFortio returns fortio on PATH, else the one `go install` puts in $(go env GOPATH)/bin
// (scripts/setup.sh installs it there).
func FindFortio() (string, error) {
	if p, err := exec.LookPath("fortio"); err == nil {
		return p, nil
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", "fortio")
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return "", errors.New("fortio not found: run scripts/setup.sh (or go install fortio.org/fortio@v1.68.2), or pass --fortio")
}

// K8sBinDir is where scripts/build-k8s.sh of this checkout keeps etcd and kube-apiserver
// (it builds them if missing: about ten minutes once per machine).
func K8sBinDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", productModule).Output()
	root := strings.TrimSpace(string(out))
	if err != nil || root == "" {
		return "", errors.New("not inside the rampart repository: run from it or pass --k8s-bin-dir")
	}
	script := filepath.Join(root, "scripts", "build-k8s.sh")
	build := exec.CommandContext(ctx, "bash", script)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the control plane (%s): %w", script, err)
	}
	dir, err := exec.CommandContext(ctx, "bash", script, "--dir").Output()
	if err != nil {
		return "", fmt.Errorf("%s --dir: %w", script, err)
	}
	return strings.TrimSpace(string(dir)), nil
}
