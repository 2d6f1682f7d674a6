package benchkit

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Suffix returns 8 random hex digits for the names of everything a run creates.
func Suffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// PodCIDRs picks n different random /24s of 198.18.0.0/16 (n <= 254). Each topology lives
// in its own namespaces, so even a clash with a concurrent test would be harmless.
func PodCIDRs(n int) []netip.Prefix {
	seen := map[int]bool{}
	var out []netip.Prefix
	for len(out) < n {
		x, _ := rand.Int(rand.Reader, big.NewInt(254))
		v := int(x.Int64()) + 1
		if seen[v] {
			continue
		}
		seen[v] = true
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(v), 0}), 24))
	}
	return out
}

// HostAddr returns the n-th address of p.
func HostAddr(p netip.Prefix, n uint32) netip.Addr { return AddAddr(p.Masked().Addr(), n) }

// PodCIDR6Of is the IPv6 pod range paired with the benchmark's IPv4 range p (198.18.N.0/24
// -> 2001:2:0:N::/64), for a dual-stack agent or topology.
func PodCIDR6Of(p netip.Prefix) netip.Prefix {
	b := p.Masked().Addr().As4()
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0, 2, 0, 0, 0, b[2]}), 64)
}

// AddAddr returns the IPv4 address off addresses after a.
func AddAddr(a netip.Addr, off uint32) netip.Addr {
	b := a.As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+off)
	return netip.AddrFrom4(b)
}

// EnsureBPFFS mounts bpffs on /sys/fs/bpf if it is not (a fresh machine has none): the
// agent pins its maps there.
func EnsureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
		return fmt.Errorf("mounting bpffs on /sys/fs/bpf: %w", err)
	}
	return nil
}

// LoadAverage returns the 1-minute load average (0 if unknown).
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

// Kernel returns the running kernel's release.
func Kernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Taskset prefixes argv with `taskset -c cpus` (cpus like "1" or "0,1"); "" leaves argv
// unpinned.
func Taskset(cpus string, argv ...string) []string {
	if cpus == "" {
		return argv
	}
	return append([]string{"taskset", "-c", cpus}, argv...)
}

// Descendants returns the process ids of every live descendant of pid whose command name
// (/proc/PID/comm) is comm, or of every descendant if comm is "".
func Descendants(pid int, comm string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			queue = append(queue, c)
			if comm == "" {
				out = append(out, c)
				continue
			}
			if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(c), "comm")); err == nil && strings.TrimSpace(string(b)) == comm {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// PinProcess sets the CPU mask of every thread of process pid to cpus (threads started
// later inherit the mask of the thread that starts them).
func PinProcess(pid int, cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return fmt.Errorf("listing threads of %d: %w", pid, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pinning thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}

// CPUTimes is a snapshot of /proc/stat's per-CPU counters (in clock ticks).
type CPUTimes map[int]struct{ Busy, Total uint64 }

// ReadCPUTimes reads the per-CPU counters.
func ReadCPUTimes() (CPUTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, fmt.Errorf("reading /proc/stat: %w", err)
	}
	out := CPUTimes{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil {
			continue
		}
		var busy, total uint64
		for i, v := range f[1:] {
			x, _ := strconv.ParseUint(v, 10, 64)
			total += x
			// user nice system idle iowait irq softirq steal guest guest_nice: idle and
			// iowait are not busy; guest time is already counted in user.
			if i == 3 || i == 4 || i >= 8 {
				if i >= 8 {
					total -= x
				}
				continue
			}
			busy += x
		}
		out[n] = struct{ Busy, Total uint64 }{busy, total}
	}
	return out, nil
}

// BusyPercent returns how busy each CPU was between two snapshots, in percent, indexed
// by CPU number (NaN-free: a CPU with no elapsed ticks reports 0).
func BusyPercent(before, after CPUTimes) []float64 {
	n := 0
	for c := range after {
		n = max(n, c+1)
	}
	out := make([]float64, n)
	for c, a := range after {
		b := before[c]
		if a.Total > b.Total {
			out[c] = 100 * float64(a.Busy-b.Busy) / float64(a.Total-b.Total)
		}
	}
	return out
}
