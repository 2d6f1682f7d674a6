package testenv

import (
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a test ended. Its Skip and Fatalf end the
// calling goroutine, as the real ones do; the embedded TB is nil, as the rule calls nothing
// else.
type recorder struct {
	testing.TB
	ended string // "skip: msg", "fail: msg", or "went on"
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) {
	r.ended = "skip: " + fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.ended = "fail: " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder on a goroutine of its own, so that ending it ends only f.
func run(f func(testing.TB)) string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
		r.ended = "went on"
	}()
	<-done
	return r.ended
}

func TestRequireRootRule(t *testing.T) {
	for _, c := range []struct {
		euid int
		ci   bool
		want string
	}{
		{0, false, "went on"},
		{0, true, "went on"},
		{1000, false, "skip: test needs root"},
		{1000, true, "fail: test needs root (CI=true: not skipping)"},
	} {
		got := run(func(tb testing.TB) { requireRoot(tb, c.euid, c.ci) })
		if got != c.want {
			t.Errorf("euid %d, CI %v: got %q, want %q", c.euid, c.ci, got, c.want)
		}
	}
}

func TestSkipOrFailRule(t *testing.T) {
	if got, want := run(func(tb testing.TB) { skipOrFail(tb, false, "no envoy") }), "skip: no envoy"; got != want {
		t.Errorf("outside CI: got %q, want %q", got, want)
	}
	if got, want := run(func(tb testing.TB) { skipOrFail(tb, true, "no envoy") }), "fail: no envoy (CI=true: not skipping)"; got != want {
		t.Errorf("under CI: got %q, want %q", got, want)
	}
}

// TestImportsNoRampartPackage keeps testenv at the bottom: the tests of every package,
// datapath and endpoint included, must be able to import it without a cycle. The one
// product package it uses is the namespace helper internal/netns, which imports none.
func TestImportsNoRampartPackage(t *testing.T) {
	out, err := exec.Command(GoTool(), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/rampartnet/rampart/") && p != "github.com/rampartnet/rampart/internal/testenv" &&
			p != "github.com/rampartnet/rampart/internal/netns" {
			t.Errorf("testenv imports %s", p)
		}
	}
}
