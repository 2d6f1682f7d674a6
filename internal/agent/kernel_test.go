package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestFindPins: the instance's pins are the tc object's and the send-side verdict's (which
// shares the directory), so uninstall removes both; files of no object are not pins.
func TestFindPins(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"policy", "sv_conns", "sv_sockops_link", "not-a-pin"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := FindPins(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, filepath.Base(p))
	}
	slices.Sort(names)
	if want := []string{"policy", "sv_conns", "sv_sockops_link"}; !slices.Equal(names, want) {
		t.Errorf("FindPins found %v, want %v", names, want)
	}
}
