package testenv

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// A session runs its function as a test runs: Fatal ends it and Run says it failed; the
// cleanups run at Close, last registered first, a Fatal in one ending only that one.
func TestSession(t *testing.T) {
	var log bytes.Buffer
	s := NewSession("lab", &log)
	var order []string
	err := s.Run(func(tb testing.TB) {
		tb.Cleanup(func() { order = append(order, "first") })
		tb.Cleanup(func() { order = append(order, "second"); tb.Fatalf("cleanup failed") })
		tb.Cleanup(func() { order = append(order, "third") })
		if tb.Name() != "lab" {
			t.Errorf("Name() = %q", tb.Name())
		}
		tb.Logf("started %d", 1)
	})
	if err != nil || s.Failed() {
		t.Fatalf("Run = %v, failed %v; want success", err, s.Failed())
	}
	if err := s.Close(); err == nil {
		t.Errorf("Close after a failing cleanup = nil, want an error")
	}
	if got := strings.Join(order, " "); got != "third second first" {
		t.Errorf("cleanups ran as %q, want third second first", got)
	}
	if !strings.Contains(log.String(), "started 1") || !strings.Contains(log.String(), "cleanup failed") {
		t.Errorf("log %q lacks the messages", log.String())
	}

	s = NewSession("lab", &log)
	went := false
	if err := s.Run(func(tb testing.TB) { tb.Fatal("no"); went = true }); err == nil || went {
		t.Errorf("Run of a function that calls Fatal = %v (went on: %v), want an error and no more", err, went)
	}
	s = NewSession("lab", &log)
	if err := s.Run(func(tb testing.TB) { tb.Skip("missing") }); err == nil || !s.Skipped() || !strings.Contains(err.Error(), "skipped") {
		t.Errorf("Run of a function that skips = %v, skipped %v", err, s.Skipped())
	}
	dir := NewSession("lab", &log)
	d := dir.TempDir()
	dir.Close()
	if _, err := os.Stat(d); !os.IsNotExist(err) {
		t.Errorf("TempDir %s after Close: %v", d, err)
	}
}
