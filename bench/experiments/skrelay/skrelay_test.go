package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestQuickRun builds the experiment, runs every path once for a second, and checks that
// each path answered every request and that the client-side verdict saw them all. It
// checks that the experiment works, not what it measures.
func TestQuickRun(t *testing.T) {
	testenv.RequireRoot(t)
	fortio := benchkit.FortioForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, out := t.TempDir(), t.TempDir()
	benchkit.BuildForTest(t, ctx, "../../..", dir, "./bench/experiments/skrelay")
	for _, o := range []string{"relay", "msg"} {
		compileBPF(t, o, dir)
	}
	benchkit.RunForTest(t, ctx, filepath.Join(dir, "skrelay"), "bench", "--rounds", "1", "--seconds", "1",
		"--bpf", dir, "--fortio", fortio, "--out", out)
	files, _ := filepath.Glob(filepath.Join(out, "skrelay-*.json"))
	if len(files) != 1 {
		t.Fatalf("results: %v", files)
	}
	b, _ := os.ReadFile(files[0])
	var res struct{ Samples []sample }
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range res.Samples {
		seen[s.Path] = true
		if s.Rate <= 0 || s.Requests == 0 || s.OK != s.Requests || len(s.CPUus) != 2 {
			t.Errorf("%s: %+v", s.Path, s)
		}
		if strings.HasPrefix(s.Path, "skmsg") && s.Verdicts < uint64(s.Requests) {
			t.Errorf("skmsg: the verdict saw %d sends for %d requests", s.Verdicts, s.Requests)
		}
	}
	for _, p := range []string{"direct", "user", "splice", "sockmap", "skmsg", "skmsg-parse"} {
		if !seen[p] {
			t.Errorf("no sample of %s", p)
		}
	}
}

// compileBPF compiles bpf/NAME.bpf.c into dir (with extra clang flags) and returns the
// object's path.
func compileBPF(t *testing.T, name, dir string, extra ...string) string {
	t.Helper()
	if _, err := exec.LookPath("clang"); err != nil {
		benchkit.SkipOrFail(t, "clang not found (scripts/setup.sh installs it)")
	}
	obj := filepath.Join(dir, name+".bpf.o")
	args := append([]string{"-O2", "-g", "-target", "bpf", "-I/usr/include/" + archDir()}, extra...)
	cc := exec.Command("clang", append(args, "-c", "bpf/"+name+".bpf.c", "-o", obj)...)
	if b, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("clang %s: %v\n%s", name, err, b)
	}
	return obj
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// archDir is where Debian keeps this architecture's kernel headers (asm/).
func archDir() string {
	if runtime.GOARCH == "arm64" {
		return "aarch64-linux-gnu"
	}
	return "x86_64-linux-gnu"
}
