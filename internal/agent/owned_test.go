package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestUninstallEarlierVersionsState: a state directory an earlier version made (state,
// no ownership record) is still uninstalled, its files and the directory, which that
// version made; a user's file keeps the directory. A state file of another instance is
// refused.
func TestUninstallEarlierVersionsState(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", map[string]string{"app": "a"})
	h.a.Close()
	h.a = nil
	if err := os.Remove(ownedPath(h.cfg.StateDir)); err != nil {
		t.Fatal(err)
	}
	other := h.cfg
	other.Instance = "other"
	if err := Uninstall(other); err == nil || !strings.Contains(err.Error(), `holds Rampart instance "unit", not "other"`) {
		t.Fatalf("uninstall of another instance's state: %v, want a refusal", err)
	}
	if err := os.WriteFile(filepath.Join(h.cfg.StateDir, "mine.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(h.cfg); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if h.net.count() != 0 {
		t.Errorf("%d endpoints left", h.net.count())
	}
	ents, _ := os.ReadDir(h.cfg.StateDir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"mine.txt"}) {
		t.Errorf("state directory holds %v, want only the user's mine.txt", names)
	}
	os.Remove(filepath.Join(h.cfg.StateDir, "mine.txt"))
	if err := os.WriteFile(statePath(h.cfg.StateDir), []byte(`{"version":1,"instance":"unit"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(h.cfg); err != nil {
		t.Fatalf("uninstall of a bare earlier state: %v", err)
	}
	if _, err := os.Stat(h.cfg.StateDir); !os.IsNotExist(err) {
		t.Errorf("the state directory an earlier version made is left (%v)", err)
	}
}

// TestAgentStaysWhereItsRecordSays: an agent restarted with another pin directory or
// node namespace is refused (its pins and endpoints are where the record says), and
// the record is not changed.
func TestAgentStaysWhereItsRecordSays(t *testing.T) {
	h := newHarness(t)
	h.a.Close()
	h.a = nil
	before, err := os.ReadFile(ownedPath(h.cfg.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		change func(*Config)
		want   string
	}{
		{func(c *Config) { c.BPFDir = "/sys/fs/bpf" }, "--bpf-dir /sys/fs/bpf: instance \"unit\" pins its dataplane in /nonexistent"},
		{func(c *Config) { c.NodeNetns = "elsewhere" }, "--node-netns \"elsewhere\": instance \"unit\" runs in node namespace \"\""},
	} {
		cfg := h.cfg
		c.change(&cfg)
		cfg.OpenKernel = func(Config) (Kernel, error) { return h.dp.kernel(), nil }
		if a, err := New(cfg); err == nil {
			a.Close()
			t.Fatalf("agent started with a changed place; want %q", c.want)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Fatalf("agent refused with %q, want %q", err, c.want)
		}
	}
	if after, _ := os.ReadFile(ownedPath(h.cfg.StateDir)); string(after) != string(before) {
		t.Fatalf("refused agents changed the record:\n%s\n%s", before, after)
	}
}
