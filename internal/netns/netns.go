package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// own names the network namespace this process started in. /proc/self/ns/net does not:
// it is the main thread's namespace, and the main thread runs goroutines like any other,
// so while one of them holds it inside a pod's namespace (Do), /proc/self/ns/net names the
// pod's. The descriptor is opened during package initialisation, which runs on the main
// thread before any goroutine can have switched it.
var own = func() string {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		// Without /proc nothing here works; Own's users then fail on the path.
		return "/proc/thread-self/ns/net"
	}
	return fmt.Sprintf("/proc/self/fd/%d", fd)
}()

// Own returns a path naming the network namespace this process started in, from any
// thread: where the process's own namespace is meant, use it instead of /proc/self/ns/net.
func Own() string { return own }

// Do runs fn on a dedicated OS thread switched into the network namespace at path ("" =
// the caller's: fn runs directly). Sockets fn creates stay in that namespace after it
// returns; the calling goroutine never changes namespace. If the thread cannot be switched
// back it stays locked, so the runtime ends it with its goroutine instead of reusing a
// thread in the wrong namespace.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	defer target.Close()
	return onThread(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("entering network namespace %s: %w", path, err)
		}
		return nil
	}, fn)
}

// Create makes a new network namespace and bind-mounts it at path, which must not exist
// (os.ErrExist otherwise); the file is removed again on failure. Loopback is left down.
// The mount makes the namespace outlive the thread that created it, as `ip netns add`
// does; delete it by unmounting path (unix.MNT_DETACH) and removing the file.
func Create(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	f.Close()
	err = onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unsharing network namespace: %w", err)
		}
		return nil
	}, func() error {
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting network namespace to %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// onThread runs enter and then fn on a new goroutine locked to its OS thread, and switches
// the thread back to the namespace it started in. If enter fails the thread has not
// changed namespace and is given back; if switching back fails it stays locked and dies
// with the goroutine.
func onThread(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening the current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("restoring network namespace: %w", err))
			return // the thread stays locked: Go ends it with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// ID identifies a network namespace: the device and inode of its nsfs file, the same for
// every path that names it (a bind mount under /run/netns, /proc/PID/ns/net).
type ID struct{ Dev, Ino uint64 }

// Identify returns the identity of the network namespace at path.
func Identify(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ID{}, fmt.Errorf("network namespace %s: %w", path, err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Reserved names the network namespaces that are never a pod's: the caller's own (Own)
// and the host's, which PID 1 lives in (/proc/1/ns/net). It returns
// which of them path is, or "" when it is neither. A namespace
// that cannot be read (PID 1 hidden by hidepid) is skipped: it cannot be compared.
func Reserved(path string) (string, error) {
	id, err := Identify(path)
	if err != nil {
		return "", err
	}
	for _, r := range []struct{ path, what string }{
		{Own(), "this process's own network namespace"},
		{"/proc/1/ns/net", "the host's network namespace (PID 1's)"},
	} {
		if rid, err := Identify(r.path); err == nil && rid == id {
			return r.what, nil
		}
	}
	return "", nil
}
