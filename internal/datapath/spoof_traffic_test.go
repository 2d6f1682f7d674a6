package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// checksum is the Internet checksum of b (RFC 1071) added to sum.
func checksum(sum uint32, b []byte) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// forgedDatagram is p's IPv4 datagram with a correct TCP or UDP checksum, so that a
// receiver that got it would take it.
func forgedDatagram(p packet) []byte {
	b := p.ipv4()
	l4 := b[20:]
	s, d := p.src.As4(), p.dst.As4()
	pseudo := uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:])) +
		uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:])) +
		uint32(p.proto) + uint32(len(l4))
	off := 16 // TCP
	if p.proto == uint8(udp) {
		off = 6
	}
	binary.BigEndian.PutUint16(l4[off:], checksum(pseudo, l4))
	return b
}

// sendIPRaw sends the IPv4 datagram b (its own header, any source) from a raw socket in ns,
// as a process with CAP_NET_RAW inside an endpoint can.
func sendIPRaw(t *testing.T, ns string, b []byte, dst netip.Addr) {
	t.Helper()
	err := testenv.InNetns(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, b, 0, &unix.SockaddrInet4{Addr: dst.As4()})
	})
	if err != nil {
		t.Fatalf("sending from a raw socket: %v", err)
	}
}

// fromAddr says whether frame is an IPv4 packet from src or an ARP frame with sender src.
func fromAddr(frame []byte, src netip.Addr) bool {
	if len(frame) < 14 {
		return false
	}
	a := src.As4()
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		return len(frame) >= 34 && [4]byte(frame[26:30]) == a
	case 0x0806:
		return len(frame) >= 42 && [4]byte(frame[28:32]) == a
	}
	return false
}

// findEvent reads events until match returns true (ok) or timeout passes (not ok).
func findEvent(r *EventReader, timeout time.Duration, match func(flow.Event) bool) (flow.Event, bool) {
	r.SetDeadline(time.Now().Add(timeout))
	for {
		e, err := r.Read()
		if err != nil {
			return flow.Event{}, false
		}
		if match(e) {
			return e, true
		}
	}
}

// TestSpoofedSourceTraffic: with real packets between namespaces, an endpoint (a) sends
// with another local endpoint's (b's) address to a server endpoint (c) whose ingress
// policy admits only b: a forged TCP SYN and a forged UDP datagram from a raw socket, a UDP
// datagram from b's address added inside a's namespace, and a forged ARP frame. None gets
// past a's veth: the server's namespace sees none of them, the node learns no neighbour
// from the ARP, and each drop is counted and reported as a's (its endpoint and identity,
// reason spoofed-source). a's own packets still pass.
func TestSpoofedSourceTraffic(t *testing.T) {
	node, suffix := newNode(t, "rps")
	a := addEndpoint(t, node, "rps-"+suffix+"-a", "rsa"+suffix, addr("198.18.60.2"), addr("198.18.60.1"))
	b := addEndpoint(t, node, "rps-"+suffix+"-b", "rsb"+suffix, addr("198.18.61.2"), addr("198.18.61.1"))
	c := addEndpoint(t, node, "rps-"+suffix+"-c", "rsc"+suffix, addr("198.18.62.2"), addr("198.18.62.1"))
	// No ARP of their own crosses the veths: every ARP frame below is the test's.
	pinNeighbours(t, node, a, b, c)

	d := openTest(t, Config{})
	attachAll(t, d, node, a, b, c)
	const idA, idB, idC = identity.Identity(1001), identity.Identity(1002), identity.Identity(1003)
	applyEndpointIPCache(t, d, []*trafficEndpoint{a, b, c}, []identity.Identity{idA, idB, idC})
	const tcpPort, udpPort, ownPort = 8080, 5353, 7000
	polC := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(
		e(allow(idB, in, tcp, tcpPort, 16, 1)),
		e(allow(idB, in, udp, udpPort, 16, 2)),
		e(allow(idA, in, udp, ownPort, 16, 3)), // a's own traffic, to show it passes
	)}
	for _, x := range []struct {
		ep  *trafficEndpoint
		id  uint32
		ide identity.Identity
		pol mapstate.EndpointPolicy
	}{{a, 1, idA, mapstate.EndpointPolicy{}}, {b, 2, idB, mapstate.EndpointPolicy{}}, {c, 3, idC, polC}} {
		if err := d.Endpoints.ApplyEndpoint(x.ep.ifindex, EndpointInfo{EpID: x.id, Identity: x.ide, Addr: x.ep.ip}, x.pol); err != nil {
			t.Fatal(err)
		}
	}
	ev := eventsOf(t, d)

	// The server: a TCP listener, the UDP service that admits only b, a UDP port for a's
	// own datagrams, and a capture of everything that reaches its eth0.
	var ln net.Listener
	if err := testenv.InNetns(c.ns, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(c.ip, tcpPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	svc := listenUDP(t, c.ns, netip.AddrPortFrom(c.ip, udpPort))
	ownSrv := listenUDP(t, c.ns, netip.AddrPortFrom(c.ip, ownPort))
	capture := testenv.NewSniffer(t, c.ns, "eth0")
	ownCli := listenUDP(t, a.ns, netip.AddrPortFrom(a.ip, 0))

	// The policy works as meant: b itself reaches the UDP service.
	bCli := listenUDP(t, b.ns, netip.AddrPortFrom(b.ip, 0))
	sendUDP(t, bCli, netip.AddrPortFrom(c.ip, udpPort), 1, 8)
	recvUDP(t, svc, 1)

	sport := uint16(41000)
	check := func(name string, arp bool, send func()) {
		t.Helper()
		capture.Frames(t)
		before, err := d.Endpoints.drops(1)
		if err != nil {
			t.Fatal(err)
		}
		send()
		// a's own datagram passes; it travels the same path after the forged packet, so
		// once it is in, the forged one would be in too.
		sendUDP(t, ownCli, netip.AddrPortFrom(c.ip, ownPort), 1, 8)
		recvUDP(t, ownSrv, 1)
		for _, f := range capture.Frames(t) {
			if fromAddr(f, b.ip) {
				t.Errorf("%s: the server's namespace received a frame from %v: % x", name, b.ip, f)
			}
		}
		// Already queued if it came (before a's own datagram): a short wait is enough. (A
		// deadline in the past would not even look.)
		if err := svc.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if n, from, err := svc.ReadFromUDPAddrPort(make([]byte, 64)); err == nil {
			t.Errorf("%s: the UDP service received %d bytes from %v", name, n, from)
		}
		drop, ok := findEvent(ev, 2*time.Second, func(e flow.Event) bool {
			return e.Type == flow.EventDrop && e.Reason == flow.ReasonSpoofedSource
		})
		if !ok {
			t.Errorf("%s: no spoofed-source drop event", name)
		} else if drop.EpID != 1 || drop.SrcIdentity != idA || drop.Source != b.ip || drop.Direction != out ||
			drop.IfIndex != a.ifindex || drop.Flags.Has(flow.FlagARP) != arp {
			t.Errorf("%s: drop event %+v, want a's (endpoint 1, identity %d) from %v", name, drop, idA, b.ip)
		}
		after, err := d.Endpoints.drops(1)
		if err != nil {
			t.Fatal(err)
		}
		if after.egress <= before.egress {
			t.Errorf("%s: a's egress drops %d -> %d, want the drop counted", name, before.egress, after.egress)
		}
	}

	check("raw TCP SYN", false, func() {
		sport++
		syn := packet{src: b.ip, dst: c.ip, proto: uint8(tcp), sport: sport, dport: tcpPort, tcpFlags: 0x02}
		sendIPRaw(t, a.ns, forgedDatagram(syn), c.ip)
	})
	check("raw UDP", false, func() {
		sport++
		dg := packet{src: b.ip, dst: c.ip, proto: uint8(udp), sport: sport, dport: udpPort, payload: []byte("forged")}
		sendIPRaw(t, a.ns, forgedDatagram(dg), c.ip)
	})
	check("UDP from b's address added in a's namespace", false, func() {
		he := nlHandle(t, a.ns)
		eth0, err := he.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		if err := he.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(b.ip, 32))}); err != nil {
			t.Fatalf("ip addr add %v/32 dev eth0: %v", b.ip, err)
		}
		forger := listenUDP(t, a.ns, netip.AddrPortFrom(b.ip, 0))
		sendUDP(t, forger, netip.AddrPortFrom(c.ip, udpPort), 1, 8)
	})
	check("ARP request with b's address", true, func() {
		arp := arpFrame(1, b.ip, a.gw).payload
		sendRaw(t, a.ns, "eth0", 0x0806, arp)
	})
	// Had the node taken the ARP frame, it would have learnt b's address on a's veth.
	neighs, err := nlHandle(t, node).NeighList(int(a.ifindex), netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == b.ip {
			t.Errorf("the node learnt %v on a's veth from a forged ARP frame (state %#x)", b.ip, n.State)
		}
	}
}
