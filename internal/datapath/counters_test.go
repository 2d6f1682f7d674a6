package datapath

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestCountersFromInterface: an endpoint's forwarded packets and bytes are what its
// host-side interface counted since the endpoint was installed, less the programs' drops,
// to the packet and byte: traffic from before the install is not counted, datagrams the
// egress policy denies count as drops and not as forwarded, and packets into the endpoint
// count as ingress.
func TestCountersFromInterface(t *testing.T) {
	node, suffix := newNode(t, "rpc")
	a := addEndpoint(t, node, "rpc-"+suffix+"-a", "rca"+suffix, addr("198.18.30.2"), addr("198.18.30.1"))
	b := addEndpoint(t, node, "rpc-"+suffix+"-b", "rcb"+suffix, addr("198.18.31.2"), addr("198.18.31.1"))
	// No ARP on the veths: every frame they carry is one of the test's datagrams.
	pinNeighbours(t, node, a, b)

	const (
		allowedPort, deniedPort, clientPort = 7001, 7003, 7002
		payload                             = 100
		frame                               = 14 + 20 + 8 + payload // Ethernet, IPv4, UDP
	)
	srv := listenUDP(t, b.ns, netip.AddrPortFrom(b.ip, allowedPort))
	cli := listenUDP(t, a.ns, netip.AddrPortFrom(a.ip, clientPort))
	toSrv := netip.AddrPortFrom(b.ip, allowedPort)
	toCli := netip.AddrPortFrom(a.ip, clientPort)

	// Before the datapath: these are in the interfaces' counts, not in the endpoint's.
	sendUDP(t, cli, toSrv, 5, payload)
	recvUDP(t, srv, 5)
	sendUDP(t, srv, toCli, 5, payload)
	recvUDP(t, cli, 5)

	d := openTest(t, Config{})
	attachAll(t, d, node, a, b)
	const idA, idB = identity.Identity(1101), identity.Identity(1102)
	if err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.PrefixFrom(a.ip, 32):         {Identity: idA},
		netip.PrefixFrom(b.ip, 32):         {Identity: idB},
	}); err != nil {
		t.Fatal(err)
	}
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(
		e(allow(idB, out, udp, allowedPort, 16, 1)),
		e(deny(idB, out, udp, deniedPort, 16, 2)),
	)}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: 1, Identity: idA, Addr: a.ip}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: 2, Identity: idB, Addr: b.ip}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	counters := func() Counters {
		t.Helper()
		c, err := d.Endpoints.Counters(node, a.ifindex, 1)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := counters(); c != (Counters{}) {
		t.Fatalf("counters right after install %+v, want zero", c)
	}

	const sent, denied, replies = 20, 7, 9
	sendUDP(t, cli, toSrv, sent, payload)
	recvUDP(t, srv, sent)
	sendUDP(t, cli, netip.AddrPortFrom(b.ip, deniedPort), denied, payload)
	// The drops happen in the receive path of a's host-side veth, after the sends return.
	deadline := time.Now().Add(5 * time.Second)
	for counters().EgressDrops < denied {
		if time.Now().After(deadline) {
			t.Fatalf("denied datagrams not all dropped: %+v", counters())
		}
		time.Sleep(5 * time.Millisecond)
	}
	sendUDP(t, srv, toCli, replies, payload)
	recvUDP(t, cli, replies)

	want := Counters{
		EgressPackets: sent, EgressBytes: sent * frame, EgressDrops: denied,
		IngressPackets: replies, IngressBytes: replies * frame,
	}
	if c := counters(); c != want {
		t.Errorf("counters %+v, want %+v", c, want)
	}
	if dr, err := d.Endpoints.drops(1); err != nil || dr.egressBytes != denied*frame {
		t.Errorf("dropped bytes %d (%v), want %d", dr.egressBytes, err, denied*frame)
	}

	// A restarted agent (a second Open on the same pins, no Attach) counts from the same
	// base.
	d2, err := Open(Config{PinDir: d.Pins.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if c, err := d2.Endpoints.Counters(node, a.ifindex, 1); err != nil || c != want {
		t.Errorf("after reopening: counters %+v (%v), want %+v", c, err, want)
	}

	// Removing the endpoint drops its base and resets its drops.
	if err := d.Endpoints.RemoveEndpoint(a.ifindex, 1); err != nil {
		t.Fatal(err)
	}
	var base rampartIfaceStats
	if err := d.objs.IfaceBase.Lookup(&a.ifindex, &base); err == nil {
		t.Errorf("interface base of a removed endpoint still there: %+v", base)
	}
	if dr, _ := d.Endpoints.drops(1); dr != (drops{}) {
		t.Errorf("drops after remove %+v, want zero", dr)
	}
}

// TestMigrateEarlierCounters: the drop and proxy counts of an earlier version's counters
// map (which also counted forwarded packets) move into endpoint_counters when the datapath
// opens, and its pin is removed.
func TestMigrateEarlierCounters(t *testing.T) {
	pin := newPinDir(t)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: legacyCountersPin, Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 64, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Pin(filepath.Join(pin, legacyCountersPin)); err != nil {
		t.Fatal(err)
	}
	per := make([]legacyCounters, ebpf.MustPossibleCPU())
	per[0] = legacyCounters{IngressPackets: 100, IngressBytes: 9000, IngressDrops: 2, EgressPackets: 50, EgressDrops: 3, ToProxy: 4, FromProxy: 5}
	per[len(per)-1].EgressDrops += 10
	ep := uint32(3)
	if err := old.Update(&ep, per, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}

	d := openTest(t, Config{PinDir: pin})
	got, err := d.Endpoints.drops(3)
	if err != nil {
		t.Fatal(err)
	}
	want := drops{ingress: 2, egress: 13, proxy: ProxyCounters{ToProxy: 4, FromProxy: 5}}
	if got != want {
		t.Errorf("migrated counters %+v, want %+v", got, want)
	}
	if other, _ := d.Endpoints.drops(4); other != (drops{}) {
		t.Errorf("endpoint 4 got counters %+v", other)
	}
	if _, err := os.Stat(filepath.Join(pin, legacyCountersPin)); !os.IsNotExist(err) {
		t.Errorf("legacy counters pin still there (%v)", err)
	}
}

// pinNeighbours gives the endpoints and the node permanent neighbour entries for each
// other, so that no ARP crosses the veths.
func pinNeighbours(t *testing.T, node string, eps ...*trafficEndpoint) {
	t.Helper()
	hn := nlHandle(t, node)
	for _, ep := range eps {
		he := nlHandle(t, ep.ns)
		host, err := hn.LinkByName(ep.hostIf)
		if err != nil {
			t.Fatal(err)
		}
		eth0, err := he.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []struct {
			h   *netlink.Handle
			on  netlink.Link
			ip  netip.Addr
			mac net.HardwareAddr
		}{
			{he, eth0, ep.gw, host.Attrs().HardwareAddr},
			{hn, host, ep.ip, eth0.Attrs().HardwareAddr},
		} {
			err := n.h.NeighSet(&netlink.Neigh{
				LinkIndex: n.on.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: net.IP(n.ip.AsSlice()), HardwareAddr: n.mac,
			})
			if err != nil {
				t.Fatalf("neighbour %v: %v", n.ip, err)
			}
		}
	}
}

// listenUDP opens a UDP socket on addr in the network namespace ns, closed at cleanup.
func listenUDP(t *testing.T, ns string, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := testenv.InNetns(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendUDP sends n datagrams of size bytes from c to to.
func sendUDP(t *testing.T, c *net.UDPConn, to netip.AddrPort, n, size int) {
	t.Helper()
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		if _, err := c.WriteToUDPAddrPort(buf, to); err != nil {
			t.Fatalf("sending to %v: %v", to, err)
		}
	}
}

// recvUDP reads n datagrams from c, failing after 5 s without one.
func recvUDP(t *testing.T, c *net.UDPConn, n int) {
	t.Helper()
	buf := make([]byte, 2048)
	for i := 0; i < n; i++ {
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("datagram %d of %d: %v", i+1, n, err)
		}
	}
}
