package netns_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/netns"
	"github.com/rampartnet/rampart/internal/testenv"
)

// threadNetns returns the inode of the calling thread's network namespace.
func threadNetns(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// newNetns creates a namespace at a fresh path under a temporary directory and deletes it
// at cleanup.
func newNetns(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	path := filepath.Join(t.TempDir(), "ns-"+hex.EncodeToString(b))
	if err := netns.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", path, err)
		}
	})
	return path
}

func TestDoEntersAndReturns(t *testing.T) {
	testenv.RequireRoot(t)
	path := newNetns(t)
	var target unix.Stat_t
	if err := unix.Stat(path, &target); err != nil {
		t.Fatal(err)
	}
	own := threadNetns(t)
	if target.Ino == own {
		t.Fatal("Create made no new namespace")
	}
	var inside uint64
	if err := netns.Do(path, func() error { inside = threadNetns(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != target.Ino {
		t.Errorf("fn ran in namespace %d, want %d", inside, target.Ino)
	}
	if got := threadNetns(t); got != own {
		t.Errorf("caller's namespace changed from %d to %d", own, got)
	}
	want := errors.New("from fn")
	if err := netns.Do(path, func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
}

func TestDoCallersNamespace(t *testing.T) {
	own := threadNetns(t)
	ran := false
	if err := netns.Do("", func() error { ran = threadNetns(t) == own; return nil }); err != nil || !ran {
		t.Fatalf("netns.Do(\"\") ran=%v err=%v, want fn run in the caller's namespace", ran, err)
	}
}

func TestDoMissing(t *testing.T) {
	ran := false
	err := netns.Do(filepath.Join(t.TempDir(), "none"), func() error { ran = true; return nil })
	if err == nil || ran {
		t.Fatalf("Do on a missing namespace: err=%v ran=%v, want an error and fn not run", err, ran)
	}
}

func TestCreateExisting(t *testing.T) {
	testenv.RequireRoot(t)
	path := newNetns(t)
	if err := netns.Create(path); !errors.Is(err, os.ErrExist) {
		t.Fatalf("Create on an existing path: %v, want os.ErrExist", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the existing namespace's file went away: %v", err)
	}
}
