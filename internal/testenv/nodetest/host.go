package nodetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
)

// host is what the labs of one host share, and how they share it: the slots' lock files,
// and a record of the host-wide state the labs change (the kubelets' sysctls, the mount
// points created on the host) kept in dir under a lock of its own. The first live lab
// records the sysctls' values; the last one to end restores them and removes the mount
// points. Labs are the record's entries whose process is alive: a lab whose process was
// killed is gone, and what it recorded stays for the others to undo.
type host struct {
	dir string
	// sysctlDir is /proc/sys (a directory of files named alike in unit tests).
	sysctlDir string
	logf      func(string, ...any)
	// poll is how often a lab waiting for a slot or for a lab of older code tries again.
	poll time.Duration
}

// theHost is the real host: locks and record in /run, the kernel's sysctls.
func theHost(logf func(string, ...any)) *host {
	return &host{dir: lockDir, sysctlDir: "/proc/sys", logf: logf, poll: time.Second}
}

// hostRecord is the host record's file.
type hostRecord struct {
	// Labs are the live labs (and, until pruned, the entries of killed ones).
	Labs []hostLab `json:"labs"`
	// Sysctls are Sysctls' values before the first live lab's kubelets, to be restored when
	// the last lab ends. SysctlsUnknown says that a lab of older code held slot 0 when they
	// would have been read: its kubelets may have set them, and it restores them itself.
	Sysctls        map[string]string `json:"sysctls,omitempty"`
	SysctlsUnknown bool              `json:"sysctlsUnknown,omitempty"`
	// MountPoints are the directories labs created on the host for their nodes' mount
	// namespaces, deepest first, removed when the last lab ends. HostDirs are those the host
	// had of its own (they existed while no lab of older code ran), never removed.
	MountPoints []string `json:"mountPoints,omitempty"`
	HostDirs    []string `json:"hostDirs,omitempty"`
}

// hostLab is one lab's entry.
type hostLab struct {
	ID   string `json:"id"`
	Slot int    `json:"slot"` // -1: none (a test of the nodes' mount namespaces)
	PID  int    `json:"pid"`
	// Start is the process's start time (clock ticks after boot, /proc/PID/stat), so a
	// reused process id is not taken for the lab's.
	Start uint64 `json:"start"`
	// Pins are the empty files the lab keeps in its mount points while it lives (pinName).
	Pins []string `json:"pins,omitempty"`
}

// pinName is the file a lab keeps in each of its mount points. Other tests share these
// paths: an agent that found /run/rampart missing created it and removes it, when empty, as
// it uninstalls; and removing a directory another mount namespace mounted over detaches
// that mount, so a live node would lose its directory (or the next node its mount point).
// The pin keeps the directory non-empty for as long as the lab lives.
func pinName(labID string) string { return ".rampart-nodetest-" + labID }

// removePins removes a lab's pins (gone already counts as removed).
func removePins(pins []string) error {
	var errs []error
	for _, p := range pins {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("removing mount point pin %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func (h *host) lockPath() string   { return filepath.Join(h.dir, "rampart-nodetest-host.lock") }
func (h *host) recordPath() string { return filepath.Join(h.dir, "rampart-nodetest-host.json") }

// locked runs f with the host record's lock held, and the record read (the entries of
// dead processes dropped); f's record is written back if f says so (a record with no lab
// and nothing to undo is removed).
func (h *host) locked(f func(*hostRecord) (write bool, err error)) error {
	lf, err := os.OpenFile(h.lockPath(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("opening the host record's lock: %w", err)
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", h.lockPath(), err)
	}
	rec := &hostRecord{}
	b, err := os.ReadFile(h.recordPath())
	switch {
	case err == nil:
		if err := json.Unmarshal(b, rec); err != nil {
			return fmt.Errorf("reading the host record %s: %w", h.recordPath(), err)
		}
	case !os.IsNotExist(err):
		return fmt.Errorf("reading the host record: %w", err)
	}
	rec.Labs = slices.DeleteFunc(rec.Labs, func(l hostLab) bool {
		if alive(l.PID, l.Start) {
			return false
		}
		h.logf("lab %s (slot %d, process %d) is gone: its process ended without it", l.ID, l.Slot, l.PID)
		if err := removePins(l.Pins); err != nil {
			h.logf("lab %s's pins: %v", l.ID, err)
		}
		return true
	})
	write, err := f(rec)
	if !write {
		return err
	}
	return errors.Join(err, h.write(rec))
}

// write writes the record in place (a new file renamed over the old), or removes it when
// it holds nothing.
func (h *host) write(rec *hostRecord) error {
	if len(rec.Labs) == 0 && rec.Sysctls == nil && !rec.SysctlsUnknown && len(rec.MountPoints) == 0 {
		if err := os.Remove(h.recordPath()); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing the host record: %w", err)
		}
		return nil
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := h.recordPath() + ".new"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the host record: %w", err)
	}
	if err := os.Rename(tmp, h.recordPath()); err != nil {
		return fmt.Errorf("writing the host record: %w", err)
	}
	return nil
}

// lease is a lab's hold on its slot and its entry in the host record, until release.
type lease struct {
	h    *host
	id   string
	slot Slot
	// lock is the slot's lock file, flocked (nil without a slot).
	lock *os.File
}

// acquire takes the first free slot (with slotted; without, only an entry in the record)
// and registers the lab in the host record: as the first live lab it records the
// sysctls. When every slot is busy it waits, polling, and logs the wait.
func (h *host) acquire(slotted bool) (*lease, error) {
	start, err := procStart(os.Getpid())
	if err != nil {
		return nil, err
	}
	l := &lease{h: h, id: testenv.Suffix(8), slot: Slot{Index: -1}}
	began, waiting := time.Now(), false
	for {
		err := h.locked(func(rec *hostRecord) (bool, error) {
			older := false
			if slotted {
				var err error
				if l.slot, l.lock, older, err = h.takeSlot(rec); err != nil || l.lock == nil {
					return false, err
				}
			} else if older, err = h.olderLab(rec); err != nil {
				return false, err
			}
			if len(rec.Labs) == 0 && rec.Sysctls == nil && !rec.SysctlsUnknown {
				if older {
					// Its kubelets may have set them already; it restores what it
					// read itself.
					rec.SysctlsUnknown = true
				} else {
					vals, err := h.readSysctls()
					if err != nil {
						l.releaseSlot()
						return false, err
					}
					rec.Sysctls = vals
				}
			}
			rec.Labs = append(rec.Labs, hostLab{ID: l.id, Slot: l.slot.Index, PID: os.Getpid(), Start: start})
			return true, nil
		})
		if err != nil {
			return nil, err
		}
		if !slotted || l.lock != nil {
			break
		}
		if !waiting {
			h.logf("all %d lab slots of this host are busy: waiting for one", MaxSlots)
			waiting = true
		}
		time.Sleep(h.poll)
	}
	if waiting {
		h.logf("took lab slot %d after waiting %v", l.slot.Index, time.Since(began).Round(time.Second))
	} else if slotted {
		h.logf("took lab slot %d (fabric %v, pods %v, services %v)", l.slot.Index, l.slot.Fabric, l.slot.ClusterCIDR, l.slot.ServiceCIDR)
	}
	return l, nil
}

// takeSlot locks the first free slot's lock file (nil if none is free) and says whether a
// lab of older code holds slot 0: its lock is held, yet no live lab in the record has it.
// Called with the record's lock held, so a new lab's slot lock and its entry come together.
func (h *host) takeSlot(rec *hostRecord) (Slot, *os.File, bool, error) {
	slot0Busy := false
	for i := range MaxSlots {
		s := SlotAt(h.dir, i)
		f, ok, err := tryLock(s.LockFile)
		if err != nil {
			return Slot{}, nil, false, err
		}
		if ok {
			return s, f, slot0Busy && !hasSlot(rec, 0), nil
		}
		if i == 0 {
			slot0Busy = true
		}
	}
	return Slot{}, nil, false, nil
}

// olderLab says whether a lab of older code holds slot 0.
func (h *host) olderLab(rec *hostRecord) (bool, error) {
	if hasSlot(rec, 0) {
		return false, nil
	}
	f, ok, err := tryLock(SlotAt(h.dir, 0).LockFile)
	if err != nil {
		return false, err
	}
	if ok {
		f.Close()
	}
	return !ok, nil
}

func hasSlot(rec *hostRecord, slot int) bool {
	return slices.ContainsFunc(rec.Labs, func(l hostLab) bool { return l.Slot == slot })
}

// tryLock takes path's flock without waiting: ok false when another holds it.
func tryLock(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("opening lab lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("locking %s: %w", path, err)
	}
	return f, true, nil
}

func (l *lease) releaseSlot() {
	if l.lock != nil {
		l.lock.Close()
		l.lock = nil
	}
}

// errOlderMountPoint is a mount point a lab of older code may have created: it removes
// it when it ends, and the removal would take the mounts of other labs' nodes with it
// (an rmdir detaches the mounts on a directory in every other mount namespace).
var errOlderMountPoint = errors.New("mount point of a lab of older code")

// ensureMountPoints makes sure dirs exist on the host, as mount points of the nodes'
// directories: those it creates (and their ancestors) are recorded, for the last lab to
// remove. A mount point that a lab of older code, running, may have created is waited for,
// polling, until that lab ends and removes it. (Its ancestors are not: the lab removes
// them only once empty, after the mount points themselves.)
func (l *lease) ensureMountPoints(dirs []string) error {
	h := l.h
	began, waiting := time.Now(), false
	for {
		err := h.locked(func(rec *hostRecord) (bool, error) {
			older, err := h.olderLab(rec)
			if err != nil {
				return false, err
			}
			if len(rec.Labs) == 1 && rec.Labs[0].ID == l.id && !older && len(rec.MountPoints) == 0 {
				// The only lab, and no older one: what exists is the host's own.
				rec.HostDirs = nil
				for _, d := range dirs {
					if _, err := os.Stat(d); err == nil {
						rec.HostDirs = append(rec.HostDirs, d)
					}
				}
			}
			var existed []string
			for _, d := range dirs {
				if _, err := os.Stat(d); err == nil {
					existed = append(existed, d)
				}
			}
			var errs []error
			for _, d := range mountPointPaths(dirs) {
				_, err := os.Stat(d)
				switch {
				case err == nil:
				case os.IsNotExist(err):
					if err := os.Mkdir(d, 0o755); err != nil {
						errs = append(errs, fmt.Errorf("mount point %s: %w", d, err))
						continue
					}
					rec.MountPoints = append(rec.MountPoints, d)
				default:
					errs = append(errs, fmt.Errorf("mount point %s: %w", d, err))
				}
			}
			// Deepest first, for removal in order.
			slices.SortStableFunc(rec.MountPoints, func(a, b string) int { return len(b) - len(a) })
			if older && len(errs) == 0 {
				for _, d := range existed {
					if !slices.Contains(rec.MountPoints, d) && !slices.Contains(rec.HostDirs, d) {
						errs = append(errs, fmt.Errorf("%w: %s", errOlderMountPoint, d))
					}
				}
			}
			// Only once the mount points are the new labs': not in one an older lab removes.
			if i := slices.IndexFunc(rec.Labs, func(e hostLab) bool { return e.ID == l.id }); i >= 0 && len(errs) == 0 {
				for _, d := range dirs {
					pin := filepath.Join(d, pinName(l.id))
					if err := os.WriteFile(pin, nil, 0o644); err != nil {
						errs = append(errs, fmt.Errorf("pinning mount point %s: %w", d, err))
						continue
					}
					if !slices.Contains(rec.Labs[i].Pins, pin) {
						rec.Labs[i].Pins = append(rec.Labs[i].Pins, pin)
					}
				}
			}
			return true, errors.Join(errs...)
		})
		if !errors.Is(err, errOlderMountPoint) {
			if waiting && err == nil {
				h.logf("the lab of older code ended after %v", time.Since(began).Round(time.Second))
			}
			return err
		}
		if !waiting {
			h.logf("waiting for the lab of older code in slot 0 to end: %v, which it removes when it ends", err)
			waiting = true
		}
		time.Sleep(h.poll)
	}
}

// mountPointPaths are dirs and their ancestors below /, shallowest first (the order to
// create them in).
func mountPointPaths(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		var chain []string
		for p := filepath.Clean(d); p != "/" && p != "."; p = filepath.Dir(p) {
			chain = append(chain, p)
		}
		slices.Reverse(chain)
		for _, p := range chain {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// release ends the lab's lease: its entry leaves the record and its slot is free. The last
// live lab restores the sysctls and removes the mount points labs created, unless a lab of
// older code runs, whose nodes may use them (they stay recorded for the next last lab).
func (l *lease) release() error {
	h := l.h
	return h.locked(func(rec *hostRecord) (bool, error) {
		var errs []error
		rec.Labs = slices.DeleteFunc(rec.Labs, func(e hostLab) bool {
			if e.ID != l.id {
				return false
			}
			if err := removePins(e.Pins); err != nil {
				errs = append(errs, err)
			}
			return true
		})
		// Free before looking for a lab of older code, which tries slot 0's lock.
		l.releaseSlot()
		if len(rec.Labs) > 0 {
			return true, errors.Join(errs...)
		}
		if rec.Sysctls != nil {
			if err := h.restoreSysctls(rec.Sysctls); err != nil {
				errs = append(errs, err)
			}
		}
		rec.Sysctls, rec.SysctlsUnknown = nil, false
		older, err := h.olderLab(rec)
		if err != nil {
			return true, errors.Join(append(errs, err)...)
		}
		if older {
			h.logf("a lab of older code holds slot 0: the mount points %v stay until a later lab ends", rec.MountPoints)
			return true, errors.Join(errs...)
		}
		var kept []string
		for _, d := range rec.MountPoints {
			err := os.Remove(d)
			switch {
			case err == nil || os.IsNotExist(err):
			case errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST):
				// The nodes write below their own directories, not the host's: what is
				// in it now is another program's, and so is the directory.
				h.logf("mount point %s left in place: something else has written into it since a lab made it", d)
			default:
				errs = append(errs, fmt.Errorf("removing mount point %s: %w", d, err))
				kept = append(kept, d)
			}
		}
		rec.MountPoints, rec.HostDirs = kept, nil
		return true, errors.Join(errs...)
	})
}

// readSysctls reads Sysctls' values.
func (h *host) readSysctls() (map[string]string, error) {
	vals := map[string]string{}
	for _, s := range Sysctls {
		b, err := os.ReadFile(h.sysctlPath(s))
		if err != nil {
			return nil, fmt.Errorf("reading sysctl %s: %w", s, err)
		}
		vals[s] = strings.TrimSpace(string(b))
	}
	return vals, nil
}

// restoreSysctls writes back what readSysctls read.
func (h *host) restoreSysctls(vals map[string]string) error {
	var errs []error
	for s, v := range vals {
		if err := os.WriteFile(h.sysctlPath(s), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s to %s: %w", s, v, err))
		}
	}
	return errors.Join(errs...)
}

func (h *host) sysctlPath(name string) string {
	return filepath.Join(h.sysctlDir, strings.ReplaceAll(name, ".", "/"))
}

// procStart is process pid's start time in clock ticks after boot (/proc/PID/stat's 22nd
// field).
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("reading process %d's start time: %w", pid, err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces:
	// state is the 3rd field, starttime the 22nd.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("process %d's stat %q: no command name", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("process %d's stat %q: too short", pid, b)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive says whether process pid runs and is the one that started at start (not a zombie,
// not another process given the same id later).
func alive(pid int, start uint64) bool {
	s, err := procStart(pid)
	return err == nil && s == start && controlplane.Alive(pid)
}
