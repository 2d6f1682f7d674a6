package endpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces are bind-mounted, as iproute2 does.
const NetnsDir = "/run/netns"

// NetnsPath returns the path of the named network namespace.
func NetnsPath(name string) string { return filepath.Join(NetnsDir, name) }

// Do runs fn on a dedicated OS thread switched into the network namespace at nsPath. The
// calling goroutine never changes namespace. If the thread cannot be switched back it is
// left locked, so the runtime destroys it when the goroutine exits instead of reusing a
// thread in the wrong namespace.
func Do(nsPath string, fn func() error) error {
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer target.Close()
	return doIn(target, fn)
}

func doIn(target netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("getting current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Thread stays locked: it dies with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("restoring network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// ensureNetnsDir creates /run/netns as a shared mount point, as `ip netns add` does, so
// namespaces mounted there are visible in mount namespaces created later.
func ensureNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", NetnsDir, err)
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("making %s shared: %w", NetnsDir, err)
	}
	// Not a mount point yet: bind it onto itself first.
	if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s: %w", NetnsDir, err)
	}
	if err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s shared: %w", NetnsDir, err)
	}
	return nil
}

// ErrNetnsExists is returned by CreateNetns when the name is taken.
var ErrNetnsExists = errors.New("network namespace already exists")

// CreateNetns creates a new network namespace bind-mounted at /run/netns/name and returns
// its path. Loopback is left down; callers configure it through a netlink handle.
func CreateNetns(name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return "", fmt.Errorf("invalid network namespace name %q", name)
	}
	if err := ensureNetnsDir(); err != nil {
		return "", err
	}
	path := NetnsPath(name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("%s: %w", path, ErrNetnsExists)
		}
		return "", fmt.Errorf("creating %s: %w", path, err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("getting current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unsharing network namespace: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		merr := unix.Mount(self, path, "none", unix.MS_BIND, "")
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(merr, fmt.Errorf("restoring network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		if merr != nil {
			merr = fmt.Errorf("bind-mounting network namespace to %s: %w", path, merr)
		}
		errc <- merr
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return "", err
	}
	return path, nil
}

// DeleteNetns unmounts and removes a named network namespace. A missing one is not an error.
func DeleteNetns(name string) error {
	path := NetnsPath(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// NetnsExists reports whether /run/netns/name is a mounted network namespace.
func NetnsExists(name string) bool {
	h, err := netns.GetFromPath(NetnsPath(name))
	if err != nil {
		return false
	}
	defer h.Close()
	// An unmounted leftover file is not a namespace: compare with our own namespace's type.
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// writeSysctl writes /proc/sys/key (key written with slashes, e.g. net/ipv4/ip_forward);
// call it inside Do so it hits that namespace.
func writeSysctl(key, value string) error {
	p := filepath.Join("/proc/sys", key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s: %w", key, err)
	}
	return nil
}
