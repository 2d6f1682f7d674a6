package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

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
