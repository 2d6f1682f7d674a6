package benchkit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBPFStatsOff runs against a file standing in for the sysctl: off stays off, on is
// switched off and put back, a missing sysctl is reported, not an error.
func TestBPFStatsOff(t *testing.T) {
	saved := bpfStatsSysctl
	t.Cleanup(func() { bpfStatsSysctl = saved })
	bpfStatsSysctl = filepath.Join(t.TempDir(), "bpf_stats_enabled")

	read := func() string {
		b, err := os.ReadFile(bpfStatsSysctl)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, c := range []struct{ before, state, during string }{
		{"0\n", "off", "0"},
		{"1\n", "switched off for the run (kernel.bpf_stats_enabled was on)", "0"},
	} {
		if err := os.WriteFile(bpfStatsSysctl, []byte(c.before), 0o644); err != nil {
			t.Fatal(err)
		}
		state, restore, err := BPFStatsOff()
		if err != nil {
			t.Fatalf("before %q: %v", c.before, err)
		}
		if state != c.state || read() != c.during {
			t.Errorf("before %q: state %q, sysctl %q during the run; want %q, %q", c.before, state, read(), c.state, c.during)
		}
		if err := restore(); err != nil {
			t.Fatal(err)
		}
		if got := read(); got != strings.TrimSpace(c.before) {
			t.Errorf("before %q: %q after restore", c.before, got)
		}
	}

	bpfStatsSysctl = filepath.Join(t.TempDir(), "missing")
	state, restore, err := BPFStatsOff()
	if err != nil || !strings.HasPrefix(state, "unknown") || restore() != nil {
		t.Errorf("missing sysctl: %q, %v", state, err)
	}
}
