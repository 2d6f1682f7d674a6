package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
)

// TestProxySteeringIPv6 is TestProxySteering over IPv6: with the proxy's IPv6 listener set
// (map proxy6) and IPv6 proxy routing, the server's ingress L7 port and the client's egress
// L7 port go through the transparent proxy, keep-alive exchanges and all, and the server
// sees the client's own address; the plain port does not touch the proxy; with the proxy
// stopped, the L7 ports fail closed and the plain port keeps working.
func TestProxySteeringIPv6(t *testing.T) {
	node, suffix := newNode(t, "rp6x")
	if err := writeSysctl(node, "net/ipv6/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	a := addEndpoint(t, node, "rp6x-"+suffix+"-a", "r6xa"+suffix, addr("198.18.10.2"), addr("198.18.10.1"))
	b := addEndpoint(t, node, "rp6x-"+suffix+"-b", "r6xb"+suffix, addr("198.18.20.2"), addr("198.18.20.1"))
	a6, b6 := addr("2001:2:10::2"), addr("2001:2:20::2")
	llA, llB := addEndpoint6(t, node, a, a6), addEndpoint6(t, node, b, b6)

	t.Cleanup(func() {
		if err := TeardownProxyRouting(node); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	if err := SetupProxyRouting(node); err != nil {
		t.Fatalf("SetupProxyRouting: %v", err)
	}
	checkProxyRoutingOf(t, node, unix.AF_INET6, true)

	d := openTest(t, Config{})
	attachAll(t, d, node, a, b)
	const idEpA, idEpB = identity.Identity(1001), identity.Identity(1002)
	const epA, epB = 1, 2
	if err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.MustParsePrefix("::/0"):      {Identity: identity.World},
		netip.PrefixFrom(a6, 128):          {Identity: idEpA, EndpointID: epA},
		netip.PrefixFrom(b6, 128):          {Identity: idEpB, EndpointID: epB},
	}); err != nil {
		t.Fatal(err)
	}
	const portIngressL7, portEgressL7, portPlain = 80, 81, 8080
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(
		e(allow(idEpB, out, tcp, portIngressL7, 16, 1)),
		e(redirect(idEpB, out, tcp, portEgressL7, 16, 2)),
		e(allow(idEpB, out, tcp, portPlain, 16, 3)),
	)}
	polB := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(
		e(redirect(idEpA, in, tcp, portIngressL7, 16, 11)),
		e(allow(idEpA, in, tcp, portEgressL7, 16, 12)),
		e(allow(idEpA, in, tcp, portPlain, 16, 13)),
	)}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: epA, Identity: idEpA, Addr: a.ip, Addr6: a6, LinkLocal6: llA}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: epB, Identity: idEpB, Addr: b.ip, Addr6: b6, LinkLocal6: llB}, polB); err != nil {
		t.Fatal(err)
	}
	evs := collectEvents(t, d)
	to := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(b6, port) }
	srv := startTestServer(t, b.ns, to(portIngressL7), to(portEgressL7), to(portPlain))
	proxyAt := netip.MustParseAddrPort("[::1]:15001")
	if err := d.Proxy.SetProxy(proxyAt); err != nil {
		t.Fatal(err)
	}
	proxy := startTestProxy(t, node, proxyAt)

	proxied := func(port uint16, l7Egress, l7Ingress bool) net.Conn {
		t.Helper()
		c, err := dial(a.ns, to(port), 5*time.Second)
		if err != nil {
			t.Fatalf("port %d: connecting through the proxy: %v", port, err)
		}
		t.Cleanup(func() { c.Close() })
		for _, msg := range []string{"GET /1", "GET /2", "GET /3"} {
			if err := roundTrip(c, msg); err != nil {
				t.Fatalf("port %d: exchange %q through the proxy: %v", port, msg, err)
			}
		}
		client := c.LocalAddr().(*net.TCPAddr).AddrPort()
		pc, ok := proxy.saw(client)
		if !ok {
			t.Fatalf("port %d: the proxy did not see the connection from %v (saw %+v)", port, client, proxy.connections())
		}
		if pc.Err != nil || pc.Original != to(port) || pc.Upstream.Addr() != a6 || !srv.sawPeer(pc.Upstream) {
			t.Errorf("port %d: proxy saw %+v; want original destination %v, upstream from %v that the server saw", port, pc, to(port), a6)
		}
		red := evs.wait(t, "redirect at a", func(e flow.Event) bool {
			return e.EpID == epA && e.Type == flow.EventNew && e.SourcePort == client.Port() && e.DestinationPort == port
		})
		if red.Verdict != flow.VerdictRedirected || red.Flags.Has(flow.FlagL7Egress) != l7Egress || red.Flags.Has(flow.FlagL7Ingress) != l7Ingress ||
			red.Source != a6 || red.Destination != b6 {
			t.Errorf("port %d: event at a %+v", port, red)
		}
		up := evs.wait(t, "upstream flow at b", func(e flow.Event) bool {
			return e.EpID == epB && e.Type == flow.EventNew && e.SourcePort == pc.Upstream.Port() && e.DestinationPort == port
		})
		if up.Verdict != flow.VerdictForwarded || !up.Flags.Has(flow.FlagFromProxy) || up.Source != a6 || up.SrcIdentity != idEpA {
			t.Errorf("port %d: event at b %+v", port, up)
		}
		return c
	}
	plain := func(what string) {
		t.Helper()
		c, err := dial(a.ns, to(portPlain), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: plain port: %v", what, err)
		}
		defer c.Close()
		if err := roundTrip(c, "plain"); err != nil {
			t.Fatalf("%s: plain port: %v", what, err)
		}
		client := c.LocalAddr().(*net.TCPAddr).AddrPort()
		if _, ok := proxy.saw(client); ok || !srv.sawPeer(client) {
			t.Errorf("%s: the plain connection from %v went through the proxy, or the server did not see it", what, client)
		}
	}
	c80 := proxied(portIngressL7, false, true)
	c81 := proxied(portEgressL7, true, false)
	plain("proxy running")
	if pa, err := d.Endpoints.ProxyCounters(epA); err != nil || pa.ToProxy < 6 {
		t.Errorf("proxy counters of a: %+v, %v", pa, err)
	}

	proxy.stop()
	for _, c := range []net.Conn{c80, c81} {
		if err := roundTrip(c, "after stop"); err == nil {
			t.Error("a proxied connection still works after the proxy stopped")
		}
	}
	for _, port := range []uint16{portIngressL7, portEgressL7} {
		if c, err := dial(a.ns, to(port), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d: connected with the proxy stopped", port)
		}
	}
	evs.wait(t, "proxy-unavailable drop at a", func(e flow.Event) bool {
		return e.EpID == epA && e.Type == flow.EventDrop && e.Reason == flow.ReasonProxyUnavailable && e.DestinationPort == portEgressL7
	})
	plain("proxy stopped")
}
