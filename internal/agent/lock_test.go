package agent

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestInstanceLock: a second agent for the same state directory is refused even on
// another socket, and so is an uninstall, while the first runs; both work once it stops.
func TestInstanceLock(t *testing.T) {
	h := newHarness(t)
	h.add("x", "a", map[string]string{"app": "a"})

	second := h.cfg
	second.Socket = filepath.Join(t.TempDir(), "other.sock")
	if a, err := New(second); err == nil {
		a.Close()
		t.Fatal("a second agent started on a state directory in use")
	} else if !strings.Contains(err.Error(), "another agent runs this instance") {
		t.Fatalf("second agent refused with %q, want it to say another agent runs the instance", err)
	}
	if err := Uninstall(second); err == nil || !strings.Contains(err.Error(), "another agent runs this instance") {
		t.Fatalf("uninstall beside a running agent: %v, want a refusal", err)
	}
	h.net.mu.Lock()
	left := len(h.net.eps)
	h.net.mu.Unlock()
	if left != 1 {
		t.Fatalf("the refused uninstall touched the running agent's endpoints: %d left, want 1", left)
	}

	// The refused agent released nothing of the first: it still serves, and after it
	// stops, a new agent on the other socket takes the instance over.
	h.add("x", "b", map[string]string{"app": "b"})
	h.a.Close()
	h.a = nil
	a, err := New(second)
	if err != nil {
		t.Fatalf("agent after the first stopped: %v", err)
	}
	a.Close()
}
