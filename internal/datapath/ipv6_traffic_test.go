package datapath

import (
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

// addEndpoint6 gives a traffic endpoint IPv6 as the agent does: the endpoint's address
// (/128) and its link-local address on eth0 with no address of the kernel's making, the
// router's link-local fe80::1 on the host side, a default route via it, and the node's
// route to the address through the host side. It returns the link-local address.
func addEndpoint6(t *testing.T, node string, ep *trafficEndpoint, ip6 netip.Addr) netip.Addr {
	t.Helper()
	ll := netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 15: ip6.As16()[15]})
	for _, ns := range []string{ep.ns, node} {
		if err := writeSysctl(ns, "net/ipv6/conf/all/disable_ipv6", "0"); err != nil {
			t.Fatal(err)
		}
	}
	for ns, name := range map[string]string{ep.ns: "eth0", node: ep.hostIf} {
		if err := writeSysctl(ns, "net/ipv6/conf/"+name+"/disable_ipv6", "0"); err != nil {
			t.Fatal(err)
		}
	}
	hn, he := nlHandle(t, node), nlHandle(t, ep.ns)
	host, err := hn.LinkByName(ep.hostIf)
	if err != nil {
		t.Fatal(err)
	}
	eth0, err := he.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct {
		h    *netlink.Handle
		link netlink.Link
		p    netip.Prefix
	}{
		{hn, host, netip.MustParsePrefix("fe80::1/64")},
		{he, eth0, netip.PrefixFrom(ll, 64)},
		{he, eth0, netip.PrefixFrom(ip6, 128)},
	} {
		if err := a.h.AddrAdd(a.link, &netlink.Addr{IPNet: prefixNet(a.p), Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatalf("adding %v: %v", a.p, err)
		}
	}
	if err := he.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("fe80::1")}); err != nil {
		t.Fatalf("IPv6 default route: %v", err)
	}
	if err := hn.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(ip6, 128))}); err != nil {
		t.Fatalf("route to %v: %v", ip6, err)
	}
	return ll
}

// TestIPv6Traffic runs IPv6 TCP between two endpoint namespaces through a node namespace
// with the programs attached: neighbour discovery through the programs both ways, an
// allowed connection with its events, a port policy does not allow, and a forged source.
func TestIPv6Traffic(t *testing.T) {
	testenv.RequireRoot(t)
	node, suffix := newNode(t, "rp6")
	if err := writeSysctl(node, "net/ipv6/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	a := addEndpoint(t, node, "rp6-"+suffix+"-a", "r6a"+suffix, addr("198.18.10.2"), addr("198.18.10.1"))
	b := addEndpoint(t, node, "rp6-"+suffix+"-b", "r6b"+suffix, addr("198.18.20.2"), addr("198.18.20.1"))
	ip6A, ip6B := addr("2001:2:10::2"), addr("2001:2:20::2")
	llA := addEndpoint6(t, node, a, ip6A)
	llB := addEndpoint6(t, node, b, ip6B)

	d := openTest(t, Config{})
	attachAll(t, d, node, a, b)
	const idEpA, idEpB = identity.Identity(1001), identity.Identity(1002)
	twoEndpointIPCache(t, d, a, b, idEpA, idEpB)
	if err := d.IPCache.UpdateIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("::/0"):        {Identity: identity.World},
		netip.PrefixFrom(ip6A, 128):          {Identity: idEpA, EndpointID: 1},
		netip.PrefixFrom(ip6B, 128):          {Identity: idEpB, EndpointID: 2},
		netip.MustParsePrefix("2001:2::/48"): {Identity: identity.FirstCIDR + 5},
	}, nil); err != nil {
		t.Fatal(err)
	}
	const port = 8080
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(e(allow(idEpB, out, tcp, port, 16, 1)), e(allow(idEpB, out, tcp, port+1, 16, 1)))}
	polB := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(idEpA, in, tcp, port, 16, 2)))}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: 1, Identity: idEpA, Addr: a.ip, Addr6: ip6A, LinkLocal6: llA}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: 2, Identity: idEpB, Addr: b.ip, Addr6: ip6B, LinkLocal6: llB}, polB); err != nil {
		t.Fatal(err)
	}
	ev := eventsOf(t, d)

	server := netip.AddrPortFrom(ip6B, port)
	echoServer(t, b.ns, server)
	echoServer(t, b.ns, netip.AddrPortFrom(ip6B, port+1))
	c, err := dial(a.ns, server, 5*time.Second)
	if err != nil {
		t.Fatalf("allowed IPv6 connection: %v", err)
	}
	defer c.Close()
	if err := roundTrip(c, "hello over IPv6"); err != nil {
		t.Fatalf("allowed IPv6 connection: %v", err)
	}
	for _, at := range []struct {
		ep  uint32
		dir uint8
	}{{1, uint8(out)}, {2, uint8(in)}} {
		e := waitEvent(t, ev, "the connection's new-flow event", func(e flow.Event) bool {
			return e.Type == flow.EventNew && e.EpID == at.ep && e.Source == ip6A && e.Destination == ip6B && e.DestinationPort == port
		})
		if e.SrcIdentity != idEpA || e.DstIdentity != idEpB || e.RuleID == 0 {
			t.Errorf("new-flow event at endpoint %d: %+v", at.ep, e)
		}
	}

	// A port B does not allow: the SYN drops at B's veth.
	if c, err := dial(a.ns, netip.AddrPortFrom(ip6B, port+1), 500*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("connection to port %d, which B's policy does not allow, succeeded", port+1)
	}
	waitEvent(t, ev, "the default-deny drop at B", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.EpID == 2 && e.Reason == flow.ReasonPolicyDefaultDeny && e.Destination == ip6B
	})

	// A second address inside A's namespace: its packets drop as spoofed.
	forged := addr("2001:2:10::99")
	he := nlHandle(t, a.ns)
	eth0, err := he.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := he.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(forged, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	err = testenv.InNetns(a.ns, func() error {
		dl := net.Dialer{Timeout: 500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: forged.AsSlice()}}
		c, err := dl.Dial("tcp", server.String())
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil {
		t.Errorf("connection from a forged IPv6 source succeeded")
	}
	waitEvent(t, ev, "the spoofed-source drop at A", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.EpID == 1 && e.Reason == flow.ReasonSpoofedSource && e.Source == forged
	})
}
