package endpoint_test

import (
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestMonitorLinks: a monitor endpoint gets its receive and return veths, up, with no
// address on either side, attach running while they are down; DeleteMonitorLinks removes
// them, and a second delete is no error.
func TestMonitorLinks(t *testing.T) {
	n := newNode(t)
	s, err := n.Create("mon", "ids", netip.MustParseAddr("198.18.0.40"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Delete("mon", "ids") })
	node := testenv.NetlinkHandle(t, n.NetnsPath())
	var attached []string
	ml, err := n.CreateMonitorLinks(s, func(rx, tx string) error {
		for _, name := range []string{rx, tx} {
			l, err := node.LinkByName(name)
			if err != nil {
				return err
			}
			if l.Attrs().Flags&unix.IFF_UP != 0 {
				t.Errorf("%s up when attach ran", name)
			}
		}
		attached = []string{rx, tx}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rx, tx := n.MonitorHostIfNames("mon", "ids")
	if ml.HostRx != rx || ml.HostTx != tx || len(attached) != 2 || attached[0] != rx || attached[1] != tx {
		t.Fatalf("links %+v, attach saw %v", ml, attached)
	}
	pod := testenv.NetlinkHandle(t, s.NetnsPath)
	for _, c := range []struct {
		h     *netlink.Handle
		name  string
		index int
	}{{node, ml.HostRx, ml.HostRxIndex}, {node, ml.HostTx, ml.HostTxIndex}, {pod, endpoint.MonitorRxIfName, 0}, {pod, endpoint.MonitorTxIfName, 0}} {
		l, err := c.h.LinkByName(c.name)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.index != 0 && l.Attrs().Index != c.index {
			t.Errorf("%s: index %d, reported %d", c.name, l.Attrs().Index, c.index)
		}
		if l.Attrs().OperState != netlink.OperUp {
			t.Errorf("%s: %v, want up", c.name, l.Attrs().OperState)
		}
		addrs, err := c.h.AddrList(l, unix.AF_UNSPEC)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) != 0 {
			t.Errorf("%s has addresses %v", c.name, addrs)
		}
	}
	// For an inline monitor the node completes checksums before frames enter it (it
	// writes them out as read); for copies only it leaves them to the offloads.
	txCsum := func() string {
		out, err := exec.Command("nsenter", "--net="+n.NetnsPath(), "ethtool", "-k", ml.HostRx).CombinedOutput()
		if err != nil {
			t.Fatalf("ethtool -k %s: %v: %s", ml.HostRx, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "tx-checksumming:") {
				return strings.TrimSpace(strings.TrimPrefix(l, "tx-checksumming:"))
			}
		}
		return "?"
	}
	for _, inline := range []bool{true, false} {
		if err := n.SetMonitorInline("mon", "ids", inline); err != nil {
			t.Fatal(err)
		}
		if got, want := txCsum(), map[bool]string{true: "off", false: "on"}[inline]; got != want {
			t.Errorf("inline %v: %s tx-checksumming %s, want %s", inline, ml.HostRx, got, want)
		}
	}
	// A restarted agent creates them again: the same links are kept and attached again.
	attached = nil
	// Copies steered to CPU 0 and back: the interface's rps_cpus as `ip netns exec` reads it.
	rps := func() string {
		out, err := exec.Command("ip", "netns", "exec", filepath.Base(s.NetnsPath), "cat", "/sys/class/net/"+endpoint.MonitorRxIfName+"/queues/rx-0/rps_cpus").CombinedOutput()
		if err != nil {
			t.Fatalf("reading rps_cpus: %v: %s", err, out)
		}
		return strings.TrimLeft(strings.TrimSpace(string(out)), "0,")
	}
	if err := endpoint.SteerMonitorCopies(s.NetnsPath, []int{0}); err != nil {
		t.Fatal(err)
	}
	if got := rps(); got != "1" {
		t.Errorf("rps_cpus after steering to CPU 0: %q, want 1", got)
	}
	if err := endpoint.SteerMonitorCopies(s.NetnsPath, nil); err != nil {
		t.Fatal(err)
	}
	if got := rps(); got != "" {
		t.Errorf("rps_cpus after steering back: %q, want 0", got)
	}
	if err := endpoint.SteerMonitorCopies(s.NetnsPath, []int{4096}); err == nil || !strings.Contains(err.Error(), "CPU 4096") {
		t.Errorf("steering to a CPU this machine lacks: %v", err)
	}
	again, err := n.CreateMonitorLinks(s, func(rx, tx string) error { attached = []string{rx, tx}; return nil })
	if err != nil || again != ml || len(attached) != 2 {
		t.Errorf("second CreateMonitorLinks: %+v, %v, attach saw %v; want %+v kept and attached", again, err, attached, ml)
	}
	if err := n.DeleteMonitorLinks("mon", "ids"); err != nil {
		t.Fatal(err)
	}
	if _, err := node.LinkByName(ml.HostRx); err == nil {
		t.Error("receive veth left")
	}
	if err := n.DeleteMonitorLinks("mon", "ids"); err != nil {
		t.Errorf("second delete: %v", err)
	}
}
