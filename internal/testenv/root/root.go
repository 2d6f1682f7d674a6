// Package root holds the one rule for privileged tests, with no dependencies, so that
// packages testenv itself imports (datapath, proxy) can follow it too: without root a test
// is skipped, except under CI=true (CI runs as root and must run every privileged test),
// where it fails.
package root

import (
	"os"
	"testing"
)

// Require skips the test when not running as root, or fails it when CI=true.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("test needs root (CI=true: not skipping)")
	}
	t.Skip("test needs root")
}
