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

// TestProxySteering steers real connections to a transparent proxy (testProxy, a Go
// stand-in for Envoy) in the node namespace: the server's ingress L7 port (80) and the
// client's egress L7 port (81) go through the proxy and the server sees the client's
// address; a plain port (8080) of the same server does not touch the proxy; the host
// cannot bypass the proxy; with the proxy stopped, or the routing removed, L7 ports fail
// closed while the plain port keeps working.
func TestProxySteering(t *testing.T) {
	node, suffix := newNode(t, "rpx")
	a := addEndpoint(t, node, "rpx-"+suffix+"-a", "rxa"+suffix, addr("198.18.10.2"), addr("198.18.10.1"))
	b := addEndpoint(t, node, "rpx-"+suffix+"-b", "rxb"+suffix, addr("198.18.20.2"), addr("198.18.20.1"))

	// Routing first, twice: it is idempotent.
	t.Cleanup(func() {
		if err := TeardownProxyRouting(node); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	for i := 0; i < 2; i++ {
		if err := SetupProxyRouting(node); err != nil {
			t.Fatalf("SetupProxyRouting: %v", err)
		}
	}
	checkProxyRouting(t, node, true)

	d := openTest(t, Config{})
	attachAll(t, d, node, a, b)
	const idEpA, idEpB = identity.Identity(1001), identity.Identity(1002)
	const epA, epB = 1, 2
	err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.PrefixFrom(a.ip, 32):         {Identity: idEpA, EndpointID: epA},
		netip.PrefixFrom(b.ip, 32):         {Identity: idEpB, EndpointID: epB},
		netip.PrefixFrom(a.gw, 32):         {Identity: identity.Host},
		netip.PrefixFrom(b.gw, 32):         {Identity: identity.Host},
	})
	if err != nil {
		t.Fatal(err)
	}
	const (
		portIngressL7 = 80   // b's ingress policy redirects a's connections
		portEgressL7  = 81   // a's egress policy redirects its connections to b
		portPlain     = 8080 // plain L4 allow on both sides
	)
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(
		e(allow(idEpB, out, tcp, portIngressL7, 16, 1)),
		e(redirect(idEpB, out, tcp, portEgressL7, 16, 2)),
		e(allow(idEpB, out, tcp, portPlain, 16, 3)),
	)}
	polB := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(
		e(redirect(idEpA, in, tcp, portIngressL7, 16, 11)),
		e(allow(idEpA, in, tcp, portEgressL7, 16, 12)),
		e(allow(idEpA, in, tcp, portPlain, 16, 13)),
		e(redirect(identity.Host, in, tcp, portIngressL7, 16, 14)),
	)}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: epA, Identity: idEpA, Addr: a.ip}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: epB, Identity: idEpB, Addr: b.ip}, polB); err != nil {
		t.Fatal(err)
	}
	evs := collectEvents(t, d)

	to := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(b.ip, port) }
	srv := startTestServer(t, b.ns, to(portIngressL7), to(portEgressL7), to(portPlain))
	proxy := startTestProxy(t, node, DefaultProxyAddr)

	// proxied connects through the proxy and checks what everyone saw.
	proxied := func(port uint16, l7Egress, l7Ingress bool) net.Conn {
		t.Helper()
		c, err := dial(a.ns, to(port), 5*time.Second)
		if err != nil {
			t.Fatalf("port %d: connecting through the proxy: %v", port, err)
		}
		t.Cleanup(func() { c.Close() })
		// Kept alive: several exchanges on one connection.
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
		if pc.Err != nil || pc.Original != to(port) || pc.Upstream.Addr() != a.ip {
			t.Errorf("port %d: proxy saw %+v; want original destination %v and upstream from %v", port, pc, to(port), a.ip)
		}
		// The server saw the client's own address (on the proxy's upstream port).
		if !srv.sawPeer(pc.Upstream) {
			t.Errorf("port %d: server did not see %v", port, pc.Upstream)
		}
		red := evs.wait(t, "redirect at a", func(e flow.Event) bool {
			return e.EpID == epA && e.Type == flow.EventNew && e.SourcePort == client.Port() && e.DestinationPort == port
		})
		if red.Verdict != flow.VerdictRedirected || red.Flags.Has(flow.FlagL7Egress) != l7Egress || red.Flags.Has(flow.FlagL7Ingress) != l7Ingress || red.Flags.Has(flow.FlagFromProxy) ||
			red.Source != a.ip || red.Destination != b.ip {
			t.Errorf("port %d: event at a %+v", port, red)
		}
		upstream := evs.wait(t, "upstream flow at b", func(e flow.Event) bool {
			return e.EpID == epB && e.Type == flow.EventNew && e.SourcePort == pc.Upstream.Port() && e.DestinationPort == port
		})
		if upstream.Verdict != flow.VerdictForwarded || !upstream.Flags.Has(flow.FlagFromProxy) || upstream.Flags.Has(flow.FlagL7Ingress) != l7Ingress ||
			upstream.Source != a.ip || upstream.SrcIdentity != idEpA {
			t.Errorf("port %d: event at b %+v", port, upstream)
		}
		return c
	}
	c80 := proxied(portIngressL7, false, true)
	c81 := proxied(portEgressL7, true, false)

	// The plain port goes straight to the server.
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
		if _, ok := proxy.saw(client); ok {
			t.Errorf("%s: the proxy saw the plain connection from %v", what, client)
		}
		if !srv.sawPeer(client) {
			t.Errorf("%s: server did not see the client's own address and port %v", what, client)
		}
		ev := evs.wait(t, "plain flow at a", func(e flow.Event) bool {
			return e.EpID == epA && e.Type == flow.EventNew && e.SourcePort == client.Port()
		})
		if ev.Verdict != flow.VerdictForwarded || ev.Flags.Has(flow.FlagL7Egress) || ev.Flags.Has(flow.FlagL7Ingress) {
			t.Errorf("%s: plain flow event at a %+v", what, ev)
		}
	}
	plain("proxy running")

	pa, err := d.Endpoints.ProxyCounters(epA)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := d.Endpoints.ProxyCounters(epB)
	if err != nil {
		t.Fatal(err)
	}
	// a handed its packets to the proxy; b received the upstream packets and handed its
	// replies back to the proxy's upstream sockets.
	if pa.ToProxy < 6 || pb.FromProxy < 6 || pb.ToProxy < 6 || pa.FromProxy != 0 {
		t.Errorf("proxy counters: a %+v, b %+v", pa, pb)
	}

	// The host's own connections are not steered: the L7 port drops them.
	refused := func(ns string, port uint16, mark int) {
		t.Helper()
		var c net.Conn
		err := testenv.InNetns(ns, func() error {
			dl := net.Dialer{Timeout: time.Second}
			if mark != 0 {
				dl.Control = transparentControl(mark)
			}
			var err error
			c, err = dl.Dial("tcp4", to(port).String())
			return err
		})
		if err == nil {
			c.Close()
			t.Fatalf("connection to port %d from %s (mark %#x) succeeded, want refused", port, ns, mark)
		}
	}
	refused(node, portIngressL7, 0)
	evs.wait(t, "bypass drop at b", func(e flow.Event) bool {
		return e.EpID == epB && e.Type == flow.EventDrop && e.Reason == flow.ReasonProxyBypass && e.Source == b.gw && e.Flags.Has(flow.FlagL7Ingress)
	})

	// Stop the proxy: its connections end, and L7 ports fail closed while the plain port
	// works.
	proxy.stop()
	for _, c := range []net.Conn{c80, c81} {
		if err := roundTrip(c, "after stop"); err == nil {
			t.Error("a proxied connection still works after the proxy stopped")
		}
	}
	before := len(proxy.connections())
	refused(a.ns, portIngressL7, 0)
	refused(a.ns, portEgressL7, 0)
	// A client cannot claim to be the proxy: the mark does not cross into the node.
	refused(a.ns, portIngressL7, ProxyUpstreamMark)
	evs.wait(t, "proxy-unavailable drop at a (ingress L7)", func(e flow.Event) bool {
		return e.EpID == epA && e.Type == flow.EventDrop && e.Reason == flow.ReasonProxyUnavailable && e.DestinationPort == portIngressL7 && e.Flags.Has(flow.FlagL7Ingress)
	})
	evs.wait(t, "proxy-unavailable drop at a (egress L7)", func(e flow.Event) bool {
		return e.EpID == epA && e.Type == flow.EventDrop && e.Reason == flow.ReasonProxyUnavailable && e.DestinationPort == portEgressL7 && e.Flags.Has(flow.FlagL7Egress)
	})
	evs.none(t, "L7 traffic at b without the proxy", func(e flow.Event) bool {
		return e.EpID == epB && e.Type == flow.EventNew && e.DestinationPort != portPlain && !e.Flags.Has(flow.FlagFromProxy)
	})
	plain("proxy stopped")
	if n := len(proxy.connections()); n != before {
		t.Errorf("stopped proxy saw %d new connections", n-before)
	}

	// Restarted (as the agent restarts Envoy): new connections go through again.
	proxy = startTestProxy(t, node, DefaultProxyAddr)
	proxied(portIngressL7, false, true).Close()

	// Without the routing rule, the packet assigned to the listener is not delivered
	// locally; the kernel does not forward a packet that carries a socket either, so the
	// connection fails (closed) and nothing reaches the server.
	if err := TeardownProxyRouting(node); err != nil {
		t.Fatal(err)
	}
	if err := TeardownProxyRouting(node); err != nil {
		t.Fatalf("second teardown: %v", err)
	}
	checkProxyRouting(t, node, false)
	from := evs.count()
	refused(a.ns, portIngressL7, 0)
	evs.waitFrom(t, from, "redirect at a without routing", func(e flow.Event) bool {
		return e.EpID == epA && e.Type == flow.EventNew && e.Verdict == flow.VerdictRedirected && e.DestinationPort == portIngressL7
	})
	evs.noneFrom(t, from, "a flow at b without routing", func(e flow.Event) bool { return e.EpID == epB })
	plain("routing removed")
}

// checkProxyRouting checks that the node namespace has (or has not) exactly one proxy
// fwmark rule and the local default route in the proxy table.
func checkProxyRouting(t *testing.T, ns string, want bool) {
	t.Helper()
	checkProxyRoutingOf(t, ns, unix.AF_INET, want)
}

// checkProxyRoutingOf is checkProxyRouting for one address family.
func checkProxyRoutingOf(t *testing.T, ns string, family int, want bool) {
	t.Helper()
	h := nlHandle(t, ns)
	rules, err := h.RuleList(family)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range rules {
		if r.Table == ProxyRouteTable {
			n++
			if !isProxyRule(r) || r.Priority != ProxyRulePriority {
				t.Errorf("unexpected rule %+v", r)
			}
		}
	}
	routes, err := h.RouteListFiltered(family, &netlink.Route{Table: ProxyRouteTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	def := "0.0.0.0/0"
	if family == unix.AF_INET6 {
		def = "::/0"
	}
	if want && (n != 1 || len(routes) != 1 || routes[0].Type != unix.RTN_LOCAL || routes[0].Dst == nil || routes[0].Dst.String() != def) {
		t.Errorf("proxy routing: %d rules, routes %+v; want one rule and a local default route", n, routes)
	}
	if !want && (n != 0 || len(routes) != 0) {
		t.Errorf("proxy routing left: %d rules, routes %+v", n, routes)
	}
}
