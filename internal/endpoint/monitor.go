package endpoint

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The interfaces of a monitor endpoint (flow taps) in its namespace, besides its own
// PodIfName: copies and diverted packets arrive on MonitorRxIfName; a monitor that sits
// inline (redirect) sends what it lets through out of MonitorTxIfName.
const (
	MonitorRxIfName = "tap-rx"
	MonitorTxIfName = "tap-tx"
)

// MonitorLinks are a monitor endpoint's receive and return veth pairs.
type MonitorLinks struct {
	// HostRx and HostTx are the host sides in the node namespace, with their indexes.
	HostRx, HostTx           string
	HostRxIndex, HostTxIndex int
}

// MonitorHostIfNames returns the host-side names of a monitor endpoint's receive and
// return veths: its HostIfName with "r" or "t" (11 characters, within IFNAMSIZ).
func (n Node) MonitorHostIfNames(namespace, name string) (rx, tx string) {
	h := n.HostIfName(namespace, name)
	return h + "r", h + "t"
}

// CreateMonitorLinks gives the monitor endpoint ep (made by Create or CreateIn) its
// receive and return veth pairs: MonitorRxIfName and MonitorTxIfName in its namespace, no
// addresses on either side (no one can address them), no IPv6. attach, when not nil, runs
// with the host sides' names while both ends are still down, so that the dataplane's
// return program (datapath.Taps.AttachMonitor) is on them before the monitor can send anything.
// The return side's host end does no reverse-path check: it carries packets whose
// sources are reached through other interfaces. On error what was made is removed.
func (n Node) CreateMonitorLinks(ep Endpoint, attach func(rx, tx string) error) (ml MonitorLinks, err error) {
	ml.HostRx, ml.HostTx = n.MonitorHostIfNames(ep.Namespace, ep.Name)
	node, err := n.handle()
	if err != nil {
		return ml, err
	}
	defer node.Close()
	podNs, err := netns.GetFromPath(ep.NetnsPath)
	if err != nil {
		return ml, fmt.Errorf("opening monitor network namespace %s: %w", ep.NetnsPath, err)
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs, unix.NETLINK_ROUTE)
	if err != nil {
		return ml, fmt.Errorf("netlink handle in monitor network namespace: %w", err)
	}
	defer pod.Close()
	// A restarted agent finds the links of a monitor it made before: it keeps them (the
	// monitor may be reading them) and attaches again. One of the two alone is a
	// leftover of an interrupted creation: it goes, and both are made anew.
	rxLink, rxErr := node.LinkByName(ml.HostRx)
	txLink, txErr := node.LinkByName(ml.HostTx)
	if rxErr == nil && txErr == nil {
		if attach != nil {
			if err := attach(ml.HostRx, ml.HostTx); err != nil {
				return ml, fmt.Errorf("attaching to %s and %s: %w", ml.HostRx, ml.HostTx, err)
			}
		}
		ml.HostRxIndex, ml.HostTxIndex = rxLink.Attrs().Index, txLink.Attrs().Index
		return ml, nil
	}
	for _, l := range []netlink.Link{rxLink, txLink} {
		if l != nil {
			if err := node.LinkDel(l); err != nil {
				return ml, fmt.Errorf("deleting leftover %s: %w", l.Attrs().Name, err)
			}
		}
	}
	var created []string // only these are removed on error, never links that were there
	defer func() {
		if err != nil {
			for _, name := range created {
				if l, lerr := node.LinkByName(name); lerr == nil {
					node.LinkDel(l)
				}
			}
		}
	}()
	pairs := []vethPair{{ml.HostRx, MonitorRxIfName}, {ml.HostTx, MonitorTxIfName}}
	for _, p := range pairs {
		if _, err := node.LinkByName(p.host); err == nil {
			return ml, fmt.Errorf("host interface %s already exists", p.host)
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: p.host, MTU: n.MTU},
			PeerName:      p.pod,
			PeerNamespace: netlink.NsFd(int(podNs)),
		}
		if err := node.LinkAdd(veth); err != nil {
			return ml, fmt.Errorf("creating veth %s: %w", p.host, err)
		}
		created = append(created, p.host)
	}
	if attach != nil {
		if err := attach(ml.HostRx, ml.HostTx); err != nil {
			return ml, fmt.Errorf("attaching to %s and %s: %w", ml.HostRx, ml.HostTx, err)
		}
	}
	if err := n.monitorLinksUp(node, pod, pairs, &ml); err != nil {
		return ml, err
	}
	return ml, nil
}

// vethPair names a veth's two ends.
type vethPair struct{ host, pod string }

// monitorLinksUp configures the monitor's veth pairs, attached: IPv6 as the node's
// family needs, no reverse-path check on the return side, both ends up (their host
// sides' indexes recorded in ml).
func (n Node) monitorLinksUp(node, pod *netlink.Handle, pairs []vethPair, ml *MonitorLinks) error {
	// On a dual-stack node the monitor sends IPv6 packets of diverted flows back on its
	// return veth, which the node must take in and forward: IPv6 stays on there, with no
	// address of the kernel's making.
	txIPv6Off := "1"
	if n.DualStack() {
		l, err := node.LinkByName(ml.HostTx)
		if err != nil {
			return fmt.Errorf("finding %s: %w", ml.HostTx, err)
		}
		_ = node.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone)
		txIPv6Off = "0"
	}
	err := Do(n.NetnsPath(), func() error {
		_ = writeSysctl("net/ipv6/conf/"+ml.HostRx+"/disable_ipv6", "1") // a kernel without IPv6 has nothing to quiet
		if err := writeSysctl("net/ipv6/conf/"+ml.HostTx+"/disable_ipv6", txIPv6Off); err != nil && n.DualStack() {
			return err
		}
		return writeSysctl("net/ipv4/conf/"+ml.HostTx+"/rp_filter", "0")
	})
	if err != nil {
		return err
	}
	for _, p := range pairs {
		l, err := pod.LinkByName(p.pod)
		if err != nil {
			return fmt.Errorf("finding monitor %s: %w", p.pod, err)
		}
		_ = pod.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone)
		if err := pod.LinkSetUp(l); err != nil {
			return fmt.Errorf("setting monitor %s up: %w", p.pod, err)
		}
		h, err := node.LinkByName(p.host)
		if err != nil {
			return fmt.Errorf("finding %s: %w", p.host, err)
		}
		if err := node.LinkSetUp(h); err != nil {
			return fmt.Errorf("setting %s up: %w", p.host, err)
		}
		if p.host == ml.HostRx {
			ml.HostRxIndex = h.Attrs().Index
		} else {
			ml.HostTxIndex = h.Attrs().Index
		}
	}
	for _, p := range pairs {
		if err := WaitOperUp(node, p.host, linkUpTimeout); err != nil {
			return err
		}
		if err := WaitOperUp(pod, p.pod, linkUpTimeout); err != nil {
			return fmt.Errorf("monitor side: %w", err)
		}
	}
	return nil
}

// DeleteMonitorLinks removes a monitor endpoint's receive and return veth pairs. Missing
// ones are not an error (deleting the endpoint's namespace removes them too).
func (n Node) DeleteMonitorLinks(namespace, name string) error {
	node, err := n.handle()
	if err != nil {
		return err
	}
	defer node.Close()
	rx, tx := n.MonitorHostIfNames(namespace, name)
	var errs []error
	for _, ifname := range []string{rx, tx} {
		l, err := node.LinkByName(ifname)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				errs = append(errs, fmt.Errorf("finding %s: %w", ifname, err))
			}
			continue
		}
		if err := node.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", ifname, err))
		}
	}
	return errors.Join(errs...)
}

// SetMonitorInline prepares the receive veth of monitor endpoint namespace/name for an
// inline monitor, or back for copies only. An inline monitor (AF_PACKET IPS) writes out the
// frames it read as they are: a partial checksum (left for a NIC that a veth never
// reaches) or a GSO frame larger than the MTU would not arrive, so for it the node sends
// with checksums complete and in packets of the MTU (transmit checksum offload off, and
// with it segmentation offload). That costs the sender a checksum and a segmentation per
// packet, which copies alone do not need: a passive monitor reads large frames and does
// not check checksums.
func (n Node) SetMonitorInline(namespace, name string, inline bool) error {
	rx, _ := n.MonitorHostIfNames(namespace, name)
	return Do(n.NetnsPath(), func() error { return setTxChecksum(rx, !inline) })
}

// setTxChecksum turns transmit checksum offload of interface ifname (in the calling
// thread's network namespace) on or off, as `ethtool -K ifname tx on|off` does; turning it
// off also turns off the segmentation offloads that depend on it.
func setTxChecksum(ifname string, on bool) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	// struct ethtool_value {cmd, data}, ETHTOOL_STXCSUM, through struct ifreq's ifr_data.
	const ethtoolSTXCSUM = 0x17
	v := struct{ cmd, data uint32 }{cmd: ethtoolSTXCSUM}
	if on {
		v.data = 1
	}
	var ifr [unix.IFNAMSIZ + 24]byte
	copy(ifr[:unix.IFNAMSIZ-1], ifname)
	*(*unsafe.Pointer)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr[0])))
	runtime.KeepAlive(&v)
	if errno != 0 {
		return fmt.Errorf("turning transmit checksum offload of %s %s: %w", ifname, map[bool]string{true: "on", false: "off"}[on], errno)
	}
	return nil
}

// SteerMonitorCopies hands what arrives on the monitor's MonitorRxIfName (in the
// namespace at netnsPath) to cpus, the CPUs the monitor runs on (receive packet steering,
// the interface's rps_cpus): the copy of each packet into the monitor's capture ring is
// then made there, not on the CPU of the tapped application. It costs an
// inter-processor interrupt per batch of packets, which small-packet traffic feels (the
// flow tap benchmark measures both, docs/benchmarks.md). No cpus hands them back to the
// sending CPU.
func SteerMonitorCopies(netnsPath string, cpus []int) error {
	mask, err := cpuMask(cpus)
	if err != nil {
		return err
	}
	p := "/sys/class/net/" + MonitorRxIfName + "/queues/rx-0/rps_cpus"
	if err := writeSysfsOf(netnsPath, p, mask); err != nil {
		return fmt.Errorf("steering the monitor's copies to CPUs %v: %w", cpus, err)
	}
	return nil
}

// cpuMask is cpus as sysfs writes a CPU mask: hexadecimal words of 32 CPUs, the highest
// first, separated by commas.
func cpuMask(cpus []int) (string, error) {
	online, err := OnlineCPUs()
	if err != nil {
		return "", err
	}
	words := []uint32{0}
	for _, c := range cpus {
		if !slices.Contains(online, c) {
			return "", fmt.Errorf("CPU %d: not one of this machine's online CPUs %v", c, online)
		}
		for len(words) <= c/32 {
			words = append(words, 0)
		}
		words[c/32] |= 1 << (c % 32)
	}
	parts := make([]string, len(words))
	for i, w := range words {
		parts[len(words)-1-i] = fmt.Sprintf("%08x", w)
	}
	return strings.Join(parts, ","), nil
}

// OnlineCPUs lists the machine's online CPUs (/sys/devices/system/cpu/online), whatever
// this process's affinity (runtime.NumCPU counts only the CPUs it may use).
func OnlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("reading the online CPUs: %w", err)
	}
	var cpus []int
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		first, err1 := strconv.Atoi(lo)
		last := first
		var err2 error
		if isRange {
			last, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || last < first {
			return nil, fmt.Errorf("reading the online CPUs: %q is not a CPU list", b)
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// writeSysfsOf writes value to the sysfs file at path as the network namespace at
// netnsPath shows it, as `ip netns exec` would: in a child process (nsenter, unshare) with
// a mount namespace of its own and a sysfs mounted there. A child rather than a thread of
// this process: a thread that changed its mount namespace cannot be given back to the Go
// runtime and would have to end, and a thread's end sends their parent-death signal to
// the processes it started (Suricata, Envoy).
func writeSysfsOf(netnsPath, path, value string) error {
	out, err := exec.Command("nsenter", "--net="+netnsPath, "--", "unshare", "--mount", "--propagation", "slave", "--",
		"sh", "-c", `mount -t sysfs sysfs /sys && printf '%s' "$1" > "$2"`, "sh", value, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("writing %s in %s: %w: %s", path, netnsPath, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NotReadingProblem is why a monitor whose MonitorRxIfName nothing reads is down.
const NotReadingProblem = "not reading: no socket bound to " + MonitorRxIfName

// MonitorReading reports whether something in the monitor's namespace (at netnsPath)
// reads what arrives on its MonitorRxIfName: a packet socket bound to it, or to every
// interface, with a protocol (an IDS capturing, as Suricata's AF_PACKET does), or a tc
// filter on its ingress (a monitor that forwards in the kernel). Copies sent to an
// interface nothing reads are dropped there, so a monitor without either is down.
func MonitorReading(netnsPath string) (bool, error) {
	var reading bool
	err := Do(netnsPath, func() error {
		l, err := netlink.LinkByName(MonitorRxIfName)
		if err != nil {
			return fmt.Errorf("finding %s: %w", MonitorRxIfName, err)
		}
		// The thread is in the monitor's namespace: its view of /proc/net is that one's.
		b, err := os.ReadFile("/proc/thread-self/net/packet")
		if err != nil {
			return fmt.Errorf("reading the packet sockets: %w", err)
		}
		if reading = packetSocketOn(string(b), l.Attrs().Index); reading {
			return nil
		}
		filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			// No ingress qdisc: no filter.
			return nil
		}
		reading = len(filters) > 0
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("checking monitor %s in %s: %w", MonitorRxIfName, netnsPath, err)
	}
	return reading, nil
}

// packetSocketOn says whether /proc/net/packet's table (sk RefCnt Type Proto Iface R Rmem
// User Inode) has a socket that receives from interface ifindex: bound to it or to every
// interface (0), and running (R 1: hooked into receive; a socket of protocol 0 is not).
func packetSocketOn(table string, ifindex int) bool {
	lines := strings.Split(table, "\n")
	for _, line := range lines[min(1, len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		iface, err := strconv.Atoi(f[4])
		if err == nil && f[5] == "1" && (iface == ifindex || iface == 0) {
			return true
		}
	}
	return false
}

// MonitorReading is MonitorReading, for the agent's Network.
func (n Node) MonitorReading(netnsPath string) (bool, error) { return MonitorReading(netnsPath) }
