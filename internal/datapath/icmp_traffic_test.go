package datapath

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// sockFd runs fn on c's file descriptor.
func sockFd(t *testing.T, c *net.UDPConn, fn func(fd int) error) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		t.Fatal(err)
	}
	if ferr != nil {
		t.Fatal(ferr)
	}
}

// pendingError returns (and clears) c's pending socket error, waiting up to wait for one
// (poll: POLLERR), 0 for none. It empties the error queue (IP_RECVERR), so that the next
// call waits for a new error.
func pendingError(t *testing.T, c *net.UDPConn, wait time.Duration) unix.Errno {
	t.Helper()
	var got unix.Errno
	sockFd(t, c, func(fd int) error {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLERR}}
		for {
			_, err := unix.Poll(fds, int(wait.Milliseconds()))
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		got = unix.Errno(v)
		for err == nil {
			if _, _, _, _, rerr := unix.Recvmsg(fd, make([]byte, 2048), nil, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT); rerr != nil {
				break
			}
		}
		return err
	})
	return got
}

// applyEndpointIPCache gives the traffic endpoints eps identities ids and endpoint ids 1,
// 2, ... in d's ipcache, their gateways (the node) the host identity, everything else world.
func applyEndpointIPCache(t *testing.T, d *Datapath, eps []*trafficEndpoint, ids []identity.Identity) {
	t.Helper()
	ipc := map[netip.Prefix]mapstate.IPCacheEntry{netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World}}
	for i, ep := range eps {
		ipc[netip.PrefixFrom(ep.ip, 32)] = mapstate.IPCacheEntry{Identity: ids[i], EndpointID: uint32(i + 1)}
		ipc[netip.PrefixFrom(ep.gw, 32)] = mapstate.IPCacheEntry{Identity: identity.Host}
	}
	if err := d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
}

// TestICMPErrorTraffic: with real packets between namespaces, a victim endpoint (v) has a
// connected UDP flow to a server endpoint (s); a third endpoint (x), which v's ingress
// policy denies, sends v a port unreachable quoting that flow, with bytes after the quote,
// from a raw socket. v's veth drops it (the flow names x and the default deny), and v's
// socket gets no error and no error-queue entry. Genuine errors still arrive: the node's
// fragmentation needed (s's veth has a smaller MTU) gives v's socket EMSGSIZE, and s's
// port unreachable (its socket closed) gives it ECONNREFUSED.
func TestICMPErrorTraffic(t *testing.T) {
	node, suffix := newNode(t, "rpi")
	v := addEndpoint(t, node, "rpi-"+suffix+"-v", "riv"+suffix, addr("198.18.63.2"), addr("198.18.63.1"))
	s := addEndpoint(t, node, "rpi-"+suffix+"-s", "ris"+suffix, addr("198.18.64.2"), addr("198.18.64.1"))
	x := addEndpoint(t, node, "rpi-"+suffix+"-x", "rix"+suffix, addr("198.18.65.2"), addr("198.18.65.1"))
	d := openTest(t, Config{})
	attachAll(t, d, node, v, s, x)
	const idV, idS, idX = identity.Identity(1001), identity.Identity(1002), identity.Identity(1003)
	applyEndpointIPCache(t, d, []*trafficEndpoint{v, s, x}, []identity.Identity{idV, idS, idX})
	const port = 7000
	polV := mapstate.EndpointPolicy{EnforceIngress: true, EnforceEgress: true, Entries: entries(e(allow(idS, out, udp, port, 16, 1)))}
	polS := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(idV, in, udp, port, 16, 2)))}
	for _, ep := range []struct {
		ep  *trafficEndpoint
		id  uint32
		ide identity.Identity
		pol mapstate.EndpointPolicy
	}{{v, 1, idV, polV}, {s, 2, idS, polS}, {x, 3, idX, mapstate.EndpointPolicy{}}} {
		if err := d.Endpoints.ApplyEndpoint(ep.ep.ifindex, EndpointInfo{EpID: ep.id, Identity: ep.ide, Addr: ep.ep.ip}, ep.pol); err != nil {
			t.Fatal(err)
		}
	}
	ev := eventsOf(t, d)

	srv := listenUDP(t, s.ns, netip.AddrPortFrom(s.ip, port))
	var cli *net.UDPConn
	if err := testenv.InNetns(v.ns, func() error {
		var err error
		cli, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.ip, port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	sockFd(t, cli, func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1); err != nil {
			return err
		}
		return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	})
	if _, err := cli.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	recvUDP(t, srv, 1)
	local := cli.LocalAddr().(*net.UDPAddr).AddrPort()

	// The forged port unreachable: from x's own address (its veth lets no other out),
	// quoting v's datagram to s, with bytes after the quote.
	quoted := packet{src: v.ip, dst: s.ip, proto: uint8(udp), sport: local.Port(), dport: port, payload: []byte("hello")}
	forged := packet{src: x.ip, dst: v.ip, proto: uint8(icmp), icmpType: 3, quoted: quoted.ipv4()[:28], payload: []byte("smuggled bytes")}.ipv4()
	forged[21] = 3 // code: port unreachable
	ck := checksum(0, forged[20:])
	forged[22], forged[23] = byte(ck>>8), byte(ck)
	sendIPRaw(t, x.ns, forged, v.ip)
	drop, ok := findEvent(ev, 5*time.Second, func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.EpID == 1 && e.Source == x.ip && e.Protocol == icmp
	})
	if !ok {
		t.Errorf("no drop event at v's veth for the port unreachable forged by x")
	} else if drop.Reason != flow.ReasonPolicyDefaultDeny || drop.SrcIdentity != idX || drop.ICMPType != 3 {
		t.Errorf("forged port unreachable: drop event %+v, want x's ICMP type 3 denied by default", drop)
	}
	sockFd(t, cli, func(fd int) error {
		buf := make([]byte, 256)
		if n, _, _, _, err := unix.Recvmsg(fd, buf, nil, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT); !errors.Is(err, unix.EAGAIN) {
			t.Errorf("v's error queue after the forged error: %d bytes %q, %v; want empty", n, buf[:max(n, 0)], err)
		}
		return nil
	})
	if errno := pendingError(t, cli, 0); errno != 0 {
		t.Errorf("v's socket got %v from the error forged by x", errno)
	}
	// The flow goes on.
	if _, err := cli.Write([]byte("again")); err != nil {
		t.Fatalf("v's next datagram: %v", err)
	}
	recvUDP(t, srv, 1)

	// Fragmentation needed from the node: s's veth takes at most 1280 bytes.
	hn := nlHandle(t, node)
	sIf, err := hn.LinkByName(s.hostIf)
	if err != nil {
		t.Fatal(err)
	}
	if err := hn.LinkSetMTU(sIf, 1280); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write(make([]byte, 1400)); err != nil {
		t.Fatalf("v's large datagram: %v", err)
	}
	if errno := pendingError(t, cli, 5*time.Second); errno != unix.EMSGSIZE {
		t.Errorf("v's socket after a datagram larger than the path MTU: %v, want EMSGSIZE (fragmentation needed from the node)", errno)
	}

	// s's genuine port unreachable.
	srv.Close()
	if _, err := cli.Write([]byte("closed")); err != nil {
		t.Fatalf("v's datagram to the closed port: %v", err)
	}
	if errno := pendingError(t, cli, 5*time.Second); errno != unix.ECONNREFUSED {
		t.Errorf("v's socket after a datagram to s's closed port: %v, want ECONNREFUSED", errno)
	}
}
