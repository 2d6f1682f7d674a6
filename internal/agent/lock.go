package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// lockName is the lock file in an instance's state directory.
const lockName = "agent.lock"

// lockInstance takes the instance's lock in its state directory and returns a function
// that releases it. The API socket already keeps a second agent off the same socket; the
// lock also stops one started with another socket (or an uninstall run beside a live
// agent) from reattaching, rewriting or removing the endpoints, pins and state that the
// running agent owns. The kernel releases it when the process dies, so a crash leaves
// nothing stale.
func lockInstance(stateDir string) (func(), error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	path := filepath.Join(stateDir, lockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening instance lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another agent runs this instance: %s is locked", path)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
