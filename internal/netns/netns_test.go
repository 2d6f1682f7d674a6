package netns_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/netns"
	"github.com/rampartnet/rampart/internal/testenv"
)

// mainAwayEnv, set, makes this test binary run with its main thread in a namespace of its
// own (TestMain), as the main thread is while a goroutine of Do holds it.
const mainAwayEnv = "RAMPART_NETNS_TEST_MAIN_AWAY"

func init() {
	if os.Getenv(mainAwayEnv) != "" {
		// Called in init, it keeps the main goroutine (TestMain) on the main thread.
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(mainAwayEnv) != "" {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			fmt.Fprintln(os.Stderr, "moving the main thread to a new network namespace:", err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// While the main thread is in another namespace, /proc/self/ns/net names that one; Own
// still names the namespace the process started in, and Reserved still knows it.
func TestOwnWhileMainThreadAway(t *testing.T) {
	if os.Getenv(mainAwayEnv) == "" {
		testenv.RequireRoot(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestOwnWhileMainThreadAway$", "-test.v")
		cmd.Env = append(os.Environ(), mainAwayEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestOwnWhileMainThreadAway") {
			t.Fatalf("with the main thread away: %v\n%s", err, out)
		}
		return
	}
	// This goroutine's thread is not the main thread: it is in the start namespace.
	start, err := netns.Identify("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	self, err := netns.Identify("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if self == start {
		t.Fatal("the main thread is in the start namespace: the test set nothing up")
	}
	own, err := netns.Identify(netns.Own())
	if err != nil {
		t.Fatal(err)
	}
	if own != start {
		t.Errorf("Own names namespace %v, want the start namespace %v (the main thread's is %v)", own, start, self)
	}
	if what, err := netns.Reserved("/proc/thread-self/ns/net"); err != nil || !strings.Contains(what, "own") {
		t.Errorf("Reserved(start namespace) = %q, %v; want this process's own", what, err)
	}
}

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
