package testenv

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cgroup2Root is where this project's machines mount cgroup v2 (a hybrid host: v1
// controllers under /sys/fs/cgroup, the unified hierarchy here).
const Cgroup2Root = "/sys/fs/cgroup/unified"

// cgroupMu serialises the tests of one process that move it into a cgroup of their own.
var cgroupMu sync.Mutex

// NewCgroup creates an empty cgroup v2 directory of the test's own, removed when the test
// ends: where programs a test (or the agents it starts) attach to cgroups touch no other
// process of the host. It returns the directory.
func NewCgroup(t testing.TB) string {
	t.Helper()
	return NewCgroupIn(t, Cgroup2Root)
}

// NewCgroupIn is NewCgroup for a cgroup inside parent, a cgroup v2 directory: one that
// programs attached to parent apply to.
func NewCgroupIn(t testing.TB, parent string) string {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat(filepath.Join(Cgroup2Root, "cgroup.procs")); err != nil {
		SkipOrFail(t, "cgroup v2 is not mounted at %s: %v", Cgroup2Root, err)
	}
	dir := filepath.Join(parent, "rampart-test-"+Suffix(8))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("creating cgroup %s: %v", dir, err)
	}
	t.Cleanup(func() {
		// The kernel may take a moment to see the directory empty after a move.
		var err error
		if !Eventually(5*time.Second, func() bool { err = os.Remove(dir); return err == nil }) {
			t.Errorf("removing cgroup %s: %v", dir, err)
		}
	})
	return dir
}

// JoinNewCgroup creates a cgroup as NewCgroup does and moves the test process into it;
// sockets created from then on belong to it. At cleanup the process goes back to the
// cgroup it was in, and the directory is removed. Tests that use it in one process run one
// at a time (a process is in one cgroup at a time).
func JoinNewCgroup(t testing.TB) string {
	t.Helper()
	return JoinNewCgroupIn(t, Cgroup2Root)
}

// JoinNewCgroupIn is JoinNewCgroup for a cgroup inside parent (NewCgroupIn).
func JoinNewCgroupIn(t testing.TB, parent string) string {
	t.Helper()
	dir := NewCgroupIn(t, parent)
	cgroupMu.Lock()
	from, err := ownCgroup2()
	if err != nil {
		cgroupMu.Unlock()
		t.Fatal(err)
	}
	// Registered after NewCgroup's: runs before it, so the directory is empty by then.
	t.Cleanup(func() {
		defer cgroupMu.Unlock()
		if err := moveSelf(filepath.Join(Cgroup2Root, from)); err != nil {
			t.Errorf("leaving cgroup %s: %v", dir, err)
		}
	})
	if err := moveSelf(dir); err != nil {
		t.Fatalf("joining cgroup %s: %v", dir, err)
	}
	return dir
}

func moveSelf(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// ownCgroup2 returns the process's cgroup v2 path (the "0::" line of /proc/self/cgroup).
func ownCgroup2() (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("reading own cgroup: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if p, ok := strings.CutPrefix(s.Text(), "0::"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("reading own cgroup: no cgroup v2 line in /proc/self/cgroup")
}
