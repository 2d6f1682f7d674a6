package nodetest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// cgroupBase is where this host mounts the cgroup hierarchies (v1, and cgroup2 at
// unified).
const cgroupBase = "/sys/fs/cgroup"

// hierarchies are the mounted cgroup hierarchies' directories.
func hierarchies() ([]string, error) {
	ents, err := os.ReadDir(cgroupBase)
	if err != nil {
		return nil, err
	}
	var hs []string
	for _, e := range ents {
		if e.IsDir() {
			hs = append(hs, filepath.Join(cgroupBase, e.Name()))
		}
	}
	return hs, nil
}

// makeCgroupRoot creates the node's cgroupRoot in every hierarchy: the kubelet refuses a
// cgroupRoot that does not exist. A new v1 cpuset cgroup has no CPUs or memory nodes until
// given its parent's.
func makeCgroupRoot(root string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		d := filepath.Join(h, root)
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroupRoot kills every process left in the node's cgroups (containers, whose
// shims are gone) and removes the cgroups, deepest first.
func removeCgroupRoot(root string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		top := filepath.Join(h, root)
		var dirs []string
		filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			ok := testenv.Eventually(10*time.Second, func() bool {
				killProcs(filepath.Join(d, "cgroup.procs"))
				err := os.Remove(d)
				return err == nil || os.IsNotExist(err)
			})
			if !ok {
				errs = append(errs, fmt.Errorf("removing cgroup %s: still busy", d))
			}
		}
	}
	return errors.Join(errs...)
}

// killProcs sends SIGKILL to every pid in a cgroup.procs file.
func killProcs(procsFile string) {
	b, err := os.ReadFile(procsFile)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
