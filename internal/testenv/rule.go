package testenv

import (
	"fmt"
	"os"
	"testing"
)

// The one rule for tests that need something of the machine (root, a tool, a terminal):
// without it a test is skipped, except under CI=true, where it fails. CI runs as root with
// everything scripts/setup.sh installs and must run every test, so a skip there would hide
// a test that no longer runs.

// RequireRoot skips the test when not running as root, or fails it when CI=true.
func RequireRoot(t testing.TB) {
	t.Helper()
	requireRoot(t, os.Geteuid(), inCI())
}

// SkipOrFail skips t because something it needs is missing (the message says what), or
// fails it when CI=true.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	skipOrFail(t, inCI(), fmt.Sprintf(format, args...))
}

// inCI reports whether the tests run under CI (CI=true), where nothing may be skipped.
func inCI() bool { return os.Getenv("CI") == "true" }

func requireRoot(t testing.TB, euid int, ci bool) {
	t.Helper()
	if euid == 0 {
		return
	}
	skipOrFail(t, ci, "test needs root")
}

func skipOrFail(t testing.TB, ci bool, msg string) {
	t.Helper()
	if ci {
		t.Fatalf("%s (CI=true: not skipping)", msg)
	}
	t.Skip(msg)
}
