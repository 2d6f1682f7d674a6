package datapath

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// newNetns creates a named network namespace (bind-mounted under /run/netns) and deletes it
// at cleanup, which also destroys the interfaces inside it. It returns the path.
func newNetns(t *testing.T, name string) string {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		// NewNamed switches the calling thread into the new namespace: do it on a thread
		// of our own and never give that thread back to the scheduler unless restored.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name)
		if err != nil {
			errc <- err
			return
		}
		ns.Close()
		if err := netns.Set(orig); err != nil {
			errc <- err // thread stays locked and exits with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("creating netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	return filepath.Join("/run/netns", name)
}

// inNetns runs fn on an OS thread switched into the network namespace at path. Sockets
// created by fn stay in that namespace after it returns.
func inNetns(path string, fn func() error) error {
	return rnetns.Do(path, fn)
}

// nlHandle opens a netlink handle in the namespace at path, closed at cleanup.
func nlHandle(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	h, err := netlinkHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// writeSysctl writes a /proc/sys file inside the namespace at path.
func writeSysctl(path, key, value string) error {
	return inNetns(path, func() error {
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	})
}
