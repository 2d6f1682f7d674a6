package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// trafficEndpoint is a network namespace joined to the node namespace by a veth pair.
type trafficEndpoint struct {
	ns      string // netns path
	hostIf  string // host-side veth in the node namespace
	ifindex uint32 // of hostIf, in the node namespace
	ip      netip.Addr
	gw      netip.Addr
}

// addEndpoint creates an endpoint namespace with eth0 (ip/24, default route via gw) and the
// host side hostIf (gw/24) in the node namespace.
func addEndpoint(t testing.TB, node, name, hostIf string, ip, gw netip.Addr) *trafficEndpoint {
	t.Helper()
	ep := &trafficEndpoint{ns: testenv.NewNetns(t, name), hostIf: hostIf, ip: ip, gw: gw}
	disableIPv6(t, ep.ns)
	hn := nlHandle(t, node)
	he := nlHandle(t, ep.ns)
	epFd, err := os.Open(ep.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer epFd.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostIf},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(epFd.Fd())),
	}
	if err := hn.LinkAdd(veth); err != nil {
		t.Fatalf("adding veth %s: %v", hostIf, err)
	}
	host, err := hn.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	ep.ifindex = uint32(host.Attrs().Index)
	if err := hn.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(gw, 24))}); err != nil {
		t.Fatal(err)
	}
	if err := hn.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	eth0, err := he.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := he.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ip, 24))}); err != nil {
		t.Fatal(err)
	}
	if err := he.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	if err := he.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.IP(gw.AsSlice())}); err != nil {
		t.Fatalf("default route: %v", err)
	}
	for h, name := range map[*netlink.Handle]string{hn: hostIf, he: "eth0"} {
		if err := endpoint.WaitOperUp(h, name, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return ep
}

// newNode makes the node namespace of a traffic test (forwarding on, IPv6 off) and
// returns it with the random suffix for the test's other names.
func newNode(t testing.TB, prefix string) (node, suffix string) {
	t.Helper()
	testenv.RequireRoot(t)
	suffix = testenv.Suffix(8)
	node = testenv.NewNetns(t, prefix+"-"+suffix+"-node")
	if err := writeSysctl(node, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	disableIPv6(t, node)
	return node, suffix
}

// attachAll attaches the programs to the endpoints' host-side veths, detached at cleanup.
func attachAll(t *testing.T, d *Datapath, node string, eps ...*trafficEndpoint) {
	t.Helper()
	for _, ep := range eps {
		idx, err := d.Endpoints.Attach(node, ep.hostIf)
		if err != nil {
			t.Fatal(err)
		}
		if idx != ep.ifindex {
			t.Fatalf("Attach(%s) returned ifindex %d, the interface has %d", ep.hostIf, idx, ep.ifindex)
		}
		hostIf := ep.hostIf
		t.Cleanup(func() {
			if err := Detach(node, hostIf); err != nil {
				t.Errorf("detach: %v", err)
			}
		})
	}
}

// disableIPv6 keeps IPv6 neighbour discovery off the veths: the dataplane drops IPv6
// (unsupported-l3), and those drops would only add noise to the events.
func disableIPv6(t testing.TB, ns string) {
	t.Helper()
	for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
		if err := writeSysctl(ns, k, "1"); err != nil {
			t.Fatal(err)
		}
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// dial connects from inside ns, bounded by timeout.
func dial(ns string, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := testenv.InNetns(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", to.String(), timeout)
		return err
	})
	return c, err
}

// roundTrip writes msg and expects the echo server to send it back.
func roundTrip(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return errors.New("echo mismatch: " + string(buf))
	}
	return nil
}

// waitEvent reads events until match returns true or the deadline passes.
func waitEvent(t *testing.T, r *EventReader, what string, match func(flow.Event) bool) flow.Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	r.SetDeadline(deadline)
	for {
		e, err := r.Read()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if match(e) {
			return e
		}
	}
}

// TestRealTraffic runs TCP between two endpoint namespaces through a node namespace with
// the programs attached on the node-side veths, in each attach mode: allowed, then denied
// for new connections after a policy change while the established one keeps working, and
// enforced while the agent is stopped and after its restart replaced the programs.
func TestRealTraffic(t *testing.T) {
	for _, mode := range []AttachMode{AttachTC, AttachTCX} {
		t.Run(string(mode), func(t *testing.T) { testRealTraffic(t, mode) })
	}
}

func testRealTraffic(t *testing.T, mode AttachMode) {
	testenv.RequireRoot(t)
	suffix := testenv.Suffix(8)
	node := testenv.NewNetns(t, "rpt-"+suffix+"-node")
	if err := writeSysctl(node, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	disableIPv6(t, node)
	a := addEndpoint(t, node, "rpt-"+suffix+"-a", "rpa"+suffix, addr("198.18.10.2"), addr("198.18.10.1"))
	b := addEndpoint(t, node, "rpt-"+suffix+"-b", "rpb"+suffix, addr("198.18.20.2"), addr("198.18.20.1"))

	pinDir := "/sys/fs/bpf/rampart-test-" + suffix
	d, err := Open(Config{PinDir: pinDir, Attach: mode})
	if err != nil {
		t.Fatal(err)
	}
	// The agent is "restarted" below: clean up through whichever Datapath is current.
	current := d
	t.Cleanup(func() {
		if err := current.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	// a has the programs as the other mode attaches them (an agent that ran with the other
	// --attach, or an earlier version's filters): Attach replaces them (checkFilters below
	// finds them in mode only).
	attachOther(t, d, node, a.hostIf, mode)
	attachAll(t, d, node, a, b)
	// Attaching again replaces the programs in place (what a restarted agent does).
	if _, err := d.Endpoints.Attach(node, a.hostIf); err != nil {
		t.Fatalf("re-attach: %v", err)
	}
	checkFilters(t, node, a.hostIf, mode, 1)

	const idEpA, idEpB = identity.Identity(1001), identity.Identity(1002)
	twoEndpointIPCache(t, d, a, b, idEpA, idEpB)
	const port = 8080
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(e(allow(idEpB, out, tcp, port, 16, 1)))}
	polB := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(idEpA, in, tcp, port, 16, 2)))}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: 1, Identity: idEpA, Addr: a.ip}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: 2, Identity: idEpB, Addr: b.ip}, polB); err != nil {
		t.Fatal(err)
	}
	ev := eventsOf(t, d)

	server := netip.AddrPortFrom(b.ip, port)
	echoServer(t, b.ns, server)
	c1, err := dial(a.ns, server, 5*time.Second)
	if err != nil {
		t.Fatalf("allowed connection: %v", err)
	}
	defer c1.Close()
	if err := roundTrip(c1, "hello"); err != nil {
		t.Fatalf("allowed connection: %v", err)
	}
	nf := waitEvent(t, ev, "new flow at b", func(e flow.Event) bool { return e.Type == flow.EventNew && e.EpID == 2 })
	if nf.Source != a.ip || nf.Destination != b.ip || nf.DestinationPort != port || nf.SrcIdentity != idEpA ||
		nf.DstIdentity != idEpB || nf.RuleID != 2 || nf.IfIndex != b.ifindex {
		t.Errorf("new flow event at b: %+v", nf)
	}

	// Remove the allow at b: new connections are dropped, the established one continues.
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: 2, Identity: idEpB, Addr: b.ip}, mapstate.EndpointPolicy{EnforceIngress: true}); err != nil {
		t.Fatal(err)
	}
	if c2, err := dial(a.ns, server, time.Second); err == nil {
		c2.Close()
		t.Fatal("connection allowed after the allow was removed")
	}
	drop := waitEvent(t, ev, "drop at b", func(e flow.Event) bool { return e.Type == flow.EventDrop && e.EpID == 2 })
	if drop.Reason != flow.ReasonPolicyDefaultDeny || drop.Source != a.ip || drop.DestinationPort != port || drop.Direction != in {
		t.Errorf("drop event: %+v", drop)
	}
	if err := roundTrip(c1, "still there"); err != nil {
		t.Fatalf("established connection after policy change: %v", err)
	}

	// "Restart" the agent: with no process holding the maps, the attached filters keep
	// enforcing (established flow passes, new ones are dropped).
	ev.Close()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(c1, "agent stopped"); err != nil {
		t.Fatalf("established connection while the agent is stopped: %v", err)
	}
	if c2, err := dial(a.ns, server, time.Second); err == nil {
		c2.Close()
		t.Fatal("new connection allowed while the agent is stopped")
	}
	d, err = Open(Config{PinDir: pinDir, Attach: mode})
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	current = d
	if got := d.Endpoints.InstalledEndpoints(); len(got) != 2 || got[b.ifindex].EpID != 2 || !got[b.ifindex].EnforceIngress {
		t.Fatalf("reopened endpoints: %+v", got)
	}
	for _, ep := range []*trafficEndpoint{a, b} {
		if _, err := d.Endpoints.Attach(node, ep.hostIf); err != nil {
			t.Fatalf("re-attaching after restart: %v", err)
		}
		checkFilters(t, node, ep.hostIf, mode, 1)
	}
	ev = eventsOf(t, d)
	if err := roundTrip(c1, "new programs"); err != nil {
		t.Fatalf("established connection after restart: %v", err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: 2, Identity: idEpB, Addr: b.ip}, polB); err != nil {
		t.Fatal(err)
	}
	c3, err := dial(a.ns, server, 5*time.Second)
	if err != nil {
		t.Fatalf("allowed again after restart: %v", err)
	}
	if err := roundTrip(c3, "again"); err != nil {
		t.Fatal(err)
	}
	c3.Close()

	// A frame with a truncated IPv4 header from a is dropped as malformed at its veth.
	sendRaw(t, a.ns, "eth0", 0x0800, make([]byte, 10))
	mal := waitEvent(t, ev, "malformed drop at a", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.EpID == 1 && e.Direction == out
	})
	if mal.Reason != flow.ReasonMalformed || mal.Direction != out {
		t.Errorf("malformed drop event: %+v", mal)
	}

	ca, err := d.Endpoints.Counters(node, a.ifindex, 1)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := d.Endpoints.Counters(node, b.ifindex, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ca.EgressPackets == 0 || ca.EgressBytes == 0 || ca.IngressPackets == 0 || ca.EgressDrops == 0 {
		t.Errorf("counters of a: %+v", ca)
	}
	if cb.IngressPackets == 0 || cb.EgressPackets == 0 || cb.IngressDrops == 0 {
		t.Errorf("counters of b: %+v", cb)
	}

	// Detach removes the programs, and the link pins.
	if err := d.Endpoints.Detach(node, a.hostIf); err != nil {
		t.Fatal(err)
	}
	checkFilters(t, node, a.hostIf, mode, 0)
	if pins, _ := filepath.Glob(filepath.Join(pinDir, tcxPinDir, fmt.Sprintf("%d-*", a.ifindex))); len(pins) != 0 {
		t.Errorf("link pins left after Detach: %v", pins)
	}
	if err := d.Endpoints.Detach(node, a.hostIf); err != nil {
		t.Errorf("second detach: %v", err)
	}
}

// attachOther attaches d's programs to ifname as the attach mode other than mode does.
func attachOther(t *testing.T, d *Datapath, ns, ifname string, mode AttachMode) {
	t.Helper()
	if mode == AttachTCX {
		attachClsBPF(t, ns, ifname, d.objs.RampartFromEp, d.objs.RampartToEp)
		return
	}
	h := nlHandle(t, ns)
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.attachTCXLinks(ns, h, lnk); err != nil {
		t.Fatal(err)
	}
	checkFilters(t, ns, ifname, AttachTCX, 1)
}

// attachClsBPF attaches fromEp and toEp as AttachTC does (and earlier versions did): a
// clsact qdisc and direct-action cls_bpf filters.
func attachClsBPF(t *testing.T, ns, ifname string, fromEp, toEp *ebpf.Program) {
	t.Helper()
	h := nlHandle(t, ns)
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	idx := lnk.Attrs().Index
	if err := h.QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
		t.Fatal(err)
	}
	for _, f := range []*netlink.BpfFilter{
		bpfFilter(idx, netlink.HANDLE_MIN_EGRESS, filterToEp, toEp),
		bpfFilter(idx, netlink.HANDLE_MIN_INGRESS, filterFromEp, fromEp),
	} {
		if err := h.FilterReplace(f); err != nil {
			t.Fatal(err)
		}
	}
}

// checkFilters checks that ifname has want Rampart programs on each of its hooks as mode
// attaches them (tc filters or TCX links), and none attached the other way.
func checkFilters(t *testing.T, ns, ifname string, mode AttachMode, want int) {
	t.Helper()
	h := nlHandle(t, ns)
	lnk, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	wantTC, wantTCX := want, 0
	if mode == AttachTCX {
		wantTC, wantTCX = 0, want
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(lnk, parent)
		if err != nil {
			fs = nil // no clsact qdisc
		}
		n := 0
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && rampartProgram(ebpf.ProgramID(bf.Id)) {
				n++
			}
		}
		if n != wantTC || len(fs) != n {
			t.Errorf("%s parent %x: %d tc filters, %d of them Rampart's, want %d", ifname, parent, len(fs), n, wantTC)
		}
	}
	err = testenv.InNetns(ns, func() error {
		for _, a := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: lnk.Attrs().Index, Attach: a})
			if err != nil {
				return err
			}
			n := 0
			for _, ap := range res.Programs {
				if rampartProgram(ap.ID) {
					n++
				}
			}
			if n != wantTCX {
				t.Errorf("%s %v: %d Rampart programs, want %d", ifname, a, n, wantTCX)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sendRaw sends an Ethernet frame with the given ethertype and payload out of ifname in ns.
func sendRaw(t *testing.T, ns, ifname string, ethType uint16, payload []byte) {
	t.Helper()
	err := testenv.InNetns(ns, func() error {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		proto := htons(unix.ETH_P_ALL)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		frame := make([]byte, 14, 14+len(payload))
		copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(frame[6:12], link.Attrs().HardwareAddr)
		binary.BigEndian.PutUint16(frame[12:], ethType)
		frame = append(frame, payload...)
		sa := &unix.SockaddrLinklayer{Ifindex: link.Attrs().Index, Protocol: proto, Halen: 6}
		copy(sa.Addr[:], frame[0:6])
		return unix.Sendto(fd, frame, 0, sa)
	})
	if err != nil {
		t.Fatalf("sending raw frame: %v", err)
	}
}
