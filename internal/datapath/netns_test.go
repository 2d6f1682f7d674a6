package datapath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/testenv"
)

// nlHandle opens a netlink handle in the namespace at path, closed at cleanup.
func nlHandle(t testing.TB, path string) *netlink.Handle {
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
	return testenv.InNetns(path, func() error {
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	})
}
