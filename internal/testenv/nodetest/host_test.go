package nodetest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/simcluster"
)

// The slots' addresses and ranges do not overlap one another's, slot 0 is what labs used
// before there were slots (older code knows only it), and the other slots stay clear of
// what simulated clusters and test/e2e use beside the labs.
func TestSlotRanges(t *testing.T) {
	s0 := SlotAt(lockDir, 0)
	if s0.LockFile != "/run/rampart-nodetest.lock" || s0.Fabric != simcluster.FabricPrefix ||
		s0.HostAddress != netip.MustParseAddr("198.19.254.254") || s0.ClusterCIDR != netip.MustParsePrefix("198.18.0.0/16") ||
		s0.NodeCIDRBits != 20 || s0.ServiceCIDR != netip.MustParsePrefix("198.19.255.0/24") || s0.DNSServiceIP != netip.MustParseAddr("198.19.255.10") {
		t.Errorf("slot 0 is not what labs used before slots: %+v", s0)
	}
	testRange := netip.MustParsePrefix("198.18.0.0/15")
	// What other tests use beside the labs: simulated clusters' pod CIDRs (nodes 15 to
	// 200 in 198.19.14.0-198.19.199.255: the /20s are inside slot 0's range), test/e2e's
	// Service address and world network, overlay tests' fabrics.
	var others []netip.Prefix
	for i := 14; i < simcluster.MaxNodes; i++ {
		others = append(others, simcluster.NodePodCIDR(i))
	}
	others = append(others, netip.MustParsePrefix("198.19.200.0/24"), netip.MustParsePrefix("198.19.250.0/23"))
	type named struct {
		name string
		p    netip.Prefix
	}
	var all []named
	for _, s := range Slots() {
		if !s.Fabric.Contains(s.HostAddress) || s.HostAddress.As4()[3] != 254 || s.Fabric.Bits() != 24 {
			t.Errorf("slot %d: host address %v not the .254 of the /24 fabric %v", s.Index, s.HostAddress, s.Fabric)
		}
		if low := netip.PrefixFrom(s.ServiceCIDR.Addr(), s.ServiceCIDR.Bits()+4); !low.Contains(s.DNSServiceIP) || s.DNSServiceIP == controlplane.KubernetesServiceIP(s.ServiceCIDR) {
			t.Errorf("slot %d: DNS address %v outside %v or the kubernetes Service's", s.Index, s.DNSServiceIP, low)
		}
		if s.MaxNodes() < 8 {
			t.Errorf("slot %d: room for %d nodes, want at least 8", s.Index, s.MaxNodes())
		}
		for _, p := range []netip.Prefix{s.Fabric, s.ClusterCIDR, s.ServiceCIDR} {
			if !testRange.Contains(p.Addr()) || p.Bits() < testRange.Bits() || p != p.Masked() {
				t.Errorf("slot %d: %v not a prefix inside %v", s.Index, p, testRange)
			}
			all = append(all, named{fmt.Sprintf("slot %d's %v", s.Index, p), p})
			if s.Index > 0 {
				for _, o := range others {
					if p.Overlaps(o) {
						t.Errorf("slot %d's %v overlaps %v, used beside the labs", s.Index, p, o)
					}
				}
			}
		}
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.p.Overlaps(b.p) {
				t.Errorf("%s overlaps %s", a.name, b.name)
			}
		}
	}
}

// logBuffer collects a host's log lines, for tests to wait for one.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) has(s string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// testHost is a host whose locks and record are in a temporary directory and whose
// sysctls are files there, each holding "orig".
func testHost(t *testing.T) (*host, *logBuffer) {
	t.Helper()
	dir := t.TempDir()
	log := &logBuffer{}
	h := &host{dir: dir, sysctlDir: filepath.Join(dir, "sys"), poll: 10 * time.Millisecond, logf: func(f string, args ...any) {
		t.Logf(f, args...)
		log.mu.Lock()
		log.lines = append(log.lines, fmt.Sprintf(f, args...))
		log.mu.Unlock()
	}}
	for _, s := range Sysctls {
		p := h.sysctlPath(s)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("orig\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return h, log
}

// setSysctls writes v to every sysctl, as a kubelet sets its values.
func setSysctls(t *testing.T, h *host, v string) {
	t.Helper()
	for _, s := range Sysctls {
		if err := os.WriteFile(h.sysctlPath(s), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// wantSysctls checks that every sysctl holds v.
func wantSysctls(t *testing.T, h *host, v, when string) {
	t.Helper()
	vals, err := h.readSysctls()
	if err != nil {
		t.Fatal(err)
	}
	for s, got := range vals {
		if got != v {
			t.Errorf("%s: sysctl %s is %q, want %q", when, s, got, v)
		}
	}
}

func mustAcquire(t *testing.T, h *host, slotted bool) *lease {
	t.Helper()
	l, err := h.acquire(slotted)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustRelease(t *testing.T, l *lease) {
	t.Helper()
	if err := l.release(); err != nil {
		t.Fatal(err)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Labs take the first free slot; with every slot taken, the next waits (and says so) and
// takes the first slot freed.
func TestSlotChoice(t *testing.T) {
	h, log := testHost(t)
	var ls []*lease
	for i := range MaxSlots {
		l := mustAcquire(t, h, true)
		if l.slot.Index != i {
			t.Fatalf("lab %d took slot %d, want %d", i, l.slot.Index, i)
		}
		ls = append(ls, l)
	}
	got := make(chan *lease, 1)
	go func() {
		l, err := h.acquire(true)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	if !testenv.Eventually(10*time.Second, func() bool { return log.has("busy: waiting") }) {
		t.Fatal("a fifth lab did not say it waits for a slot")
	}
	select {
	case l := <-got:
		t.Fatalf("a fifth lab took slot %d while all were busy", l.slot.Index)
	default:
	}
	mustRelease(t, ls[2])
	var fifth *lease
	select {
	case fifth = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the fifth lab did not take the slot freed")
	}
	if fifth == nil || fifth.slot.Index != 2 {
		t.Fatalf("the fifth lab took %+v, want slot 2", fifth)
	}
	for _, l := range []*lease{ls[0], ls[1], ls[3], fifth} {
		mustRelease(t, l)
	}
	// Slot 0 is first again.
	l := mustAcquire(t, h, true)
	if l.slot.Index != 0 {
		t.Errorf("after all ended, a lab took slot %d, want 0", l.slot.Index)
	}
	mustRelease(t, l)
	wantNoRecord(t, h)
}

// Two labs overlapping: the first records the sysctls before its kubelets change them; the
// second, starting later, does not record the first's kubelets' values; the first to end
// restores nothing, the last restores the first's record, and removes the mount points
// the labs created (and not the host's own).
func TestHostRecordOverlap(t *testing.T) {
	h, _ := testHost(t)
	root := t.TempDir()
	own := filepath.Join(root, "host-own")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	mk := filepath.Join(root, "var", "lib", "kubelet")
	cni := filepath.Join(root, "opt", "cni", "bin")

	a := mustAcquire(t, h, true)
	if err := a.ensureMountPoints([]string{mk, own}); err != nil {
		t.Fatal(err)
	}
	setSysctls(t, h, "kubelet") // a's kubelets start
	// Another user of a path (an agent that made /run/rampart) removes it once empty: not
	// while a lab mounts over it.
	if err := os.Remove(mk); err == nil {
		t.Fatalf("%s, a live lab's mount point, could be removed", mk)
	}
	b := mustAcquire(t, h, true)
	if a.slot.Index == b.slot.Index {
		t.Fatalf("both labs in slot %d", a.slot.Index)
	}
	if err := b.ensureMountPoints([]string{mk, cni, own}); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, a)
	wantSysctls(t, h, "kubelet", "after the first lab ended, the second still running")
	for _, d := range []string{mk, cni, own} {
		if !exists(d) {
			t.Errorf("mount point %s removed while a lab runs", d)
		}
	}
	// Something else writes into a mount point's directory on the host (the nodes write
	// into their own): the directory becomes its, and stays.
	other := filepath.Join(cni, "other")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, b)
	wantSysctls(t, h, "orig", "after the last lab ended")
	if !exists(other) {
		t.Errorf("%s, another program's file in a mount point, removed", other)
	}
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(cni); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Dir(cni)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Dir(filepath.Dir(cni))); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{mk, filepath.Join(root, "var"), cni, filepath.Join(root, "opt")} {
		if exists(d) {
			t.Errorf("mount point %s (or its ancestor the labs created) left after the last lab", d)
		}
	}
	if !exists(own) {
		t.Errorf("the host's own %s removed", own)
	}
	wantNoRecord(t, h)
}

// A lab whose process was killed (here a process holding slot 0's lock, registered in the
// record with the sysctls it read) is gone once its process is: its slot is free again,
// what it recorded is kept (the sysctls are the kubelets' now, not the host's), and the
// last live lab restores the killed lab's record.
func TestHostRecordKilledLab(t *testing.T) {
	h, log := testHost(t)
	slot0 := SlotAt(h.dir, 0)
	cmd := exec.Command("flock", "-o", slot0.LockFile, "sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	kill := func() {
		if !killed {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
			killed = true
		}
	}
	t.Cleanup(kill)
	if !testenv.Eventually(10*time.Second, func() bool {
		f, free, err := tryLock(slot0.LockFile)
		if free {
			f.Close()
		}
		return err == nil && !free
	}) {
		t.Fatal("the stand-in lab does not hold slot 0")
	}
	start, err := procStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Its record: the host's values, read before its kubelets changed them.
	vals, err := h.readSysctls()
	if err != nil {
		t.Fatal(err)
	}
	// And a mount point it pinned.
	pin := filepath.Join(t.TempDir(), pinName("killed"))
	if err := os.WriteFile(pin, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.write(&hostRecord{Labs: []hostLab{{ID: "killed", Slot: 0, PID: cmd.Process.Pid, Start: start, Pins: []string{pin}}}, Sysctls: vals}); err != nil {
		t.Fatal(err)
	}
	var live int
	if err := h.locked(func(r *hostRecord) (bool, error) { live = len(r.Labs); return false, nil }); err != nil {
		t.Fatal(err)
	}
	if live != 1 {
		t.Fatalf("the stand-in lab, alive, is not in the record (%d labs)", live)
	}
	setSysctls(t, h, "kubelet")

	a := mustAcquire(t, h, true)
	if a.slot.Index != 1 {
		t.Errorf("with slot 0 held, a lab took slot %d, want 1", a.slot.Index)
	}
	kill()
	b := mustAcquire(t, h, true)
	if b.slot.Index != 0 {
		t.Errorf("after slot 0's lab was killed, a lab took slot %d, want 0", b.slot.Index)
	}
	if !log.has("lab killed (slot 0") {
		t.Error("the killed lab's entry was not dropped as gone")
	}
	if exists(pin) {
		t.Errorf("the killed lab's pin %s is left", pin)
	}
	mustRelease(t, a)
	wantSysctls(t, h, "kubelet", "with a lab still running")
	mustRelease(t, b)
	wantSysctls(t, h, "orig", "after the last live lab ended")
	wantNoRecord(t, h)
}

// A lab of older code holds slot 0's lock with no entry in the record. A new lab then takes
// slot 1, leaves the sysctls to it (it restores what it read itself), waits for it to end
// rather than use a mount point it may have made (its removal would take the new lab's
// node mounts with it), and as the last lab keeps the mount points while one runs.
func TestHostRecordOlderLab(t *testing.T) {
	h, log := testHost(t)
	root := t.TempDir()
	mk := filepath.Join(root, "kubelet")
	slot0 := SlotAt(h.dir, 0)
	older, free, err := tryLock(slot0.LockFile)
	if err != nil || !free {
		t.Fatalf("locking slot 0 as an older lab: %v, %v", free, err)
	}
	if err := os.Mkdir(mk, 0o755); err != nil { // the older lab's mount point
		t.Fatal(err)
	}
	setSysctls(t, h, "kubelet") // its kubelets

	a := mustAcquire(t, h, true)
	if a.slot.Index != 1 {
		t.Fatalf("beside an older lab, a lab took slot %d, want 1", a.slot.Index)
	}
	done := make(chan error, 1)
	go func() { done <- a.ensureMountPoints([]string{mk}) }()
	if !testenv.Eventually(10*time.Second, func() bool { return log.has("waiting for the lab of older code") }) {
		t.Fatal("the lab did not wait for the older lab's mount point")
	}
	// The older lab ends: it removes its mount point and restores its sysctls.
	os.Remove(mk)
	setSysctls(t, h, "orig")
	older.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lab still waits after the older lab ended")
	}
	if !exists(mk) {
		t.Fatalf("mount point %s not made again", mk)
	}
	setSysctls(t, h, "kubelet") // a's kubelets

	// An older lab starts again while a runs, in slot 0, and outlives it.
	older, free, err = tryLock(slot0.LockFile)
	if err != nil || !free {
		t.Fatalf("locking slot 0 as an older lab: %v, %v", free, err)
	}
	mustRelease(t, a)
	if !exists(mk) {
		t.Errorf("mount point %s removed while the older lab runs", mk)
	}
	// Not read by the new labs (an older lab ran then): the older lab restores what it read.
	wantSysctls(t, h, "kubelet", "after the last new lab ended, beside an older lab")
	older.Close()
	b := mustAcquire(t, h, true)
	mustRelease(t, b)
	if exists(mk) {
		t.Errorf("mount point %s left after the last lab, the older one gone", mk)
	}
	wantNoRecord(t, h)
}

// wantNoRecord fails the test if the host record is left: the last lab removes it.
func wantNoRecord(t *testing.T, h *host) {
	t.Helper()
	if exists(h.recordPath()) {
		t.Errorf("the host record %s is left after the last lab", h.recordPath())
	}
}
