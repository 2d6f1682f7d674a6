package datapath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/endpoint"
	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// newNetns creates a named network namespace (bind-mounted under /run/netns) and deletes it
// at cleanup, which also destroys the interfaces inside it. It returns the path.
func newNetns(t *testing.T, name string) string {
	t.Helper()
	path, err := endpoint.CreateNetns(name)
	if err != nil {
		t.Fatalf("creating netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := endpoint.DeleteNetns(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	return path
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
