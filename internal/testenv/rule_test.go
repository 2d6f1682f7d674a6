package testenv

import (
	"os/exec"
	"strings"
	"testing"
)

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
		got := Ending(t, func(tb testing.TB) { requireRoot(tb, c.euid, c.ci) })
		if got != c.want {
			t.Errorf("euid %d, CI %v: got %q, want %q", c.euid, c.ci, got, c.want)
		}
	}
}

func TestSkipOrFailRule(t *testing.T) {
	if got, want := Ending(t, func(tb testing.TB) { skipOrFail(tb, false, "no envoy") }), "skip: no envoy"; got != want {
		t.Errorf("outside CI: got %q, want %q", got, want)
	}
	if got, want := Ending(t, func(tb testing.TB) { skipOrFail(tb, true, "no envoy") }), "fail: no envoy (CI=true: not skipping)"; got != want {
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
