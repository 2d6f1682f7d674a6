package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// actUnspec is TC_ACT_UNSPEC, what the host programs return for a packet they pass: the
// device's next filter (the IP-in-IP overlay's) runs.
const actUnspec = 0xffffffff

var (
	ipHost  = addr("198.18.0.1")   // a host address (the router's)
	ipNode2 = addr("198.19.254.2") // another node
)

// hostFixture is the fixture world with the host addresses and another node in the
// ipcache.
func hostFixture(t *testing.T) *fixture {
	f := newFixture(t, Config{})
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipHost, 32)] = mapstate.IPCacheEntry{Identity: identity.Host}
	ipc[netip.PrefixFrom(ipNode2, 32)] = mapstate.IPCacheEntry{Identity: identity.RemoteNode}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) applyHost(ifindex uint32, enforceIn, enforceOut bool, es ...entry) {
	f.t.Helper()
	err := f.d.Endpoints.ApplyEndpoint(ifindex, EndpointInfo{EpID: hostEpID, Identity: identity.Host, Addr: ipHost, Host: true},
		mapstate.EndpointPolicy{EnforceIngress: enforceIn, EnforceEgress: enforceOut, Entries: entries(es...)})
	if err != nil {
		f.t.Fatalf("ApplyEndpoint(host): %v", err)
	}
}

func (f *fixture) expectHostPass(name string, ret uint32) {
	f.t.Helper()
	if ret != actUnspec {
		f.t.Errorf("%s: verdict %d, want TC_ACT_UNSPEC (passed on)", name, ret)
	}
	f.drain()
}

func (f *fixture) expectHostDrop(name string, ret uint32, reason flow.Reason, dir uint8) {
	f.t.Helper()
	ev, ok := f.dropped(name, ret)
	if !ok {
		return
	}
	if ev.EpID != hostEpID || ev.Reason != reason || uint8(ev.Direction) != dir {
		f.t.Errorf("%s: dropped by endpoint %d (%v, direction %v), want the host's %v in direction %d", name, ev.EpID, ev.Reason, ev.Direction, reason, dir)
	}
}

// TestHostPolicy: on a host device, the node's own traffic is the host endpoint's, judged
// by its policy with conntrack; forwarded packets, ARP and the overlay between nodes pass
// on unjudged; host_safe flows pass whatever the policy. Between a local endpoint and the
// node, the endpoint's veth judges the node's side by the host's policy.
func TestHostPolicy(t *testing.T) {
	f := hostFixture(t)
	toHost := func(p packet) uint32 { return run(t, f.d.hostProgsT().RampartToHost, p.bytes(), epIfindex) }
	fromHost := func(p packet) uint32 { return run(t, f.d.hostProgsT().RampartFromHost, p.bytes(), epIfindex) }
	syn := func(src, dst netip.Addr, dport uint16) packet {
		return packet{src: src, dst: dst, proto: uint8(tcp), sport: f.port(), dport: dport, tcpFlags: 0x02}
	}

	// Ingress enforced: SSH from anyone; egress enforced: nothing allowed.
	f.applyHost(epIfindex, true, true, e(allow(identity.Any, in, tcp, 22, 16, 1)))
	f.expectHostPass("world to host:22", toHost(syn(ipOut, ipHost, 22)))
	f.expectHostDrop("world to host:23", toHost(syn(ipOut, ipHost, 23)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostPass("forwarded to a pod", toHost(syn(ipOut, epIP, 23)))
	f.expectHostPass("forwarded from a pod", fromHost(syn(epIP, ipOut, 443)))
	f.expectHostPass("VXLAN from a node", toHost(packet{src: ipNode2, dst: ipHost, proto: uint8(udp), sport: 50000, dport: vxlanPort}))
	f.expectHostPass("VXLAN to a node", fromHost(packet{src: ipHost, dst: ipNode2, proto: uint8(udp), sport: 50000, dport: vxlanPort}))
	f.expectHostDrop("VXLAN port from the world", toHost(packet{src: ipOut, dst: ipHost, proto: uint8(udp), sport: 50000, dport: vxlanPort}),
		flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostPass("ARP", toHost(packet{ethType: 0x0806, src: ipOut, dst: ipHost}))
	f.expectHostDrop("host to the world:443", fromHost(syn(ipHost, ipOut, 443)), flow.ReasonPolicyDefaultDeny, uint8(out))
	f.expectHostDrop("a host address from outside is not the host", toHost(syn(ipHost, ipHost, 22+1)), flow.ReasonPolicyDefaultDeny, uint8(in))

	// The API server's address and port: allowed both ways, the reply by conntrack.
	if err := f.d.Host.SetHostSafe([]HostSafe{{Addr: netip.AddrPortFrom(ipOut, 443), Proto: uint8(tcp)}}); err != nil {
		t.Fatal(err)
	}
	s := syn(ipHost, ipOut, 443)
	if ret := fromHost(s); ret != actUnspec {
		t.Errorf("host to the API server: verdict %d, want passed on", ret)
	} else if ev := nextEvent(t, f.ev); ev.RuleID != hostSafeRuleID {
		t.Errorf("host to the API server: rule %d, want HOST_SAFE_RULE_ID", ev.RuleID)
	}
	f.drain()
	f.expectHostPass("the API server's reply", toHost(packet{src: ipOut, dst: ipHost, proto: uint8(tcp), sport: 443, dport: s.sport, tcpFlags: 0x12}))
	f.expectHostDrop("host to the API server's address, another port", fromHost(syn(ipHost, ipOut, 444)), flow.ReasonPolicyDefaultDeny, uint8(out))
	if err := f.d.Host.SetHostSafe(nil); err != nil {
		t.Fatal(err)
	}
	f.expectHostDrop("host to the API server, once no longer safe", fromHost(syn(ipHost, ipOut, 443)), flow.ReasonPolicyDefaultDeny, uint8(out))

	// Between the endpoint (on ifindex 1) and the node: the host endpoint on another
	// device admits TCP 9100 from the endpoint and may open TCP 80 to it.
	const hostDev = 77
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, hostEpID); err != nil {
		t.Fatal(err)
	}
	f.apply(false, false)
	f.applyHost(hostDev, true, true, e(allow(epIdent, in, tcp, 9100, 16, 2)), e(allow(epIdent, out, tcp, 80, 16, 3)))
	est := syn(epIP, ipHost, 9100)
	f.expectPass("endpoint to host:9100", f.fromEp(est))
	f.expectHostDrop("endpoint to host:9200", f.fromEp(syn(epIP, ipHost, 9200)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectPass("endpoint to the world (not the host's)", f.fromEp(syn(epIP, ipOut, 9200)))
	f.expectPass("host to endpoint:80", f.toEp(syn(ipHost, epIP, 80)))
	f.expectHostDrop("host to endpoint:81", f.toEp(syn(ipHost, epIP, 81)), flow.ReasonPolicyDefaultDeny, uint8(out))
	// A deny entry the host's policy gains reaches the established flow once flows are
	// checked again (the agent asks for it with every host policy change).
	ack := est
	ack.tcpFlags = 0x10
	f.expectPass("endpoint to host:9100, established", f.fromEp(ack))
	f.applyHost(hostDev, true, true, e(allow(epIdent, in, tcp, 9100, 16, 2)), e(allow(epIdent, out, tcp, 80, 16, 3)),
		e(deny(epIdent, in, tcp, 9100, 16, 4)))
	if err := f.d.Host.RecheckFlows(); err != nil {
		t.Fatal(err)
	}
	f.expectHostDrop("endpoint to host:9100, established, after a host deny", f.fromEp(ack), flow.ReasonPolicyDeny, uint8(in))
	if err := f.d.Endpoints.RemoveEndpoint(hostDev, hostEpID); err != nil {
		t.Fatal(err)
	}
	f.expectPass("host to endpoint:81 without a host endpoint", f.toEp(syn(ipHost, epIP, 81)))
}

// AttachHost puts the host programs on a device beside the IP-in-IP overlay's, before
// them in priority order; a device that leaves the list loses them; DetachHost leaves the
// overlay's alone.
func TestHostAttach(t *testing.T) {
	testenv.RequireRoot(t)
	d := openTest(t, Config{})
	ns := testenv.NewNetns(t, "rphost-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	for _, pair := range [][2]string{{"fab0", "peer0"}, {"fab1", "peer1"}} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pair[0]}, PeerName: pair[1]}); err != nil {
			t.Fatal(err)
		}
	}
	filters := func(name string) []string { return testenv.BPFFilterNames(t, h, name) }
	if err := d.Tunnel.AttachIPIP(ns, addr("198.19.0.1"), []string{"fab0"}); err != nil {
		t.Fatal(err)
	}
	idxs, err := d.Host.AttachHost(ns, []string{"fab0", "fab1"})
	if err != nil {
		t.Fatal(err)
	}
	fab0, _ := h.LinkByName("fab0")
	if len(idxs) != 2 || idxs[0] != uint32(fab0.Attrs().Index) {
		t.Errorf("AttachHost returned %v, want fab0's index %d first", idxs, fab0.Attrs().Index)
	}
	both := []string{filterFromHost, filterFromIPIP, filterToHost, filterToIPIP}
	if got := filters("fab0"); !slices.Equal(got, both) {
		t.Errorf("fab0: filters %v, want %v", got, both)
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(fab0, parent)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(fs, func(a, b netlink.Filter) int { return int(a.Attrs().Priority) - int(b.Attrs().Priority) })
		if first := fs[0].(*netlink.BpfFilter).Name; first != filterToHost && first != filterFromHost {
			t.Errorf("fab0 parent %x: %s runs first, want the host program", parent, first)
		}
	}
	if _, err := d.Host.AttachHost(ns, []string{"fab0"}); err != nil {
		t.Fatal(err)
	}
	if got := filters("fab1"); len(got) != 0 {
		t.Errorf("fab1 after it left the host devices: filters %v", got)
	}
	if _, err := DetachHost(ns); err != nil {
		t.Fatal(err)
	}
	if got, want := filters("fab0"), []string{filterFromIPIP, filterToIPIP}; !slices.Equal(got, want) {
		t.Errorf("fab0 after DetachHost: filters %v, want %v", got, want)
	}
}

// TestHostPolicyIPv6: host policy's IPv6 path, as TestHostPolicy's IPv4 one. The node's own
// IPv6 (to and from its addresses, and link-local on a host device) is judged by the host
// endpoint's policy; forwarded packets, neighbour discovery and the overlay pass on; a
// link-local peer on a host device is the world, not the host; host_safe6 flows pass; and
// an endpoint's flows with the node, by its global or the router's link-local address, are
// judged by the host's policy too.
func TestHostPolicyIPv6(t *testing.T) {
	f := newFixture6(t)
	node2 := addr("2001:2:ff::2")
	ipc := fixtureIPCache6()
	ipc[netip.PrefixFrom(node2, 128)] = mapstate.IPCacheEntry{Identity: identity.RemoteNode}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	toHost := func(p packet6) uint32 { return run(t, f.d.hostProgsT().RampartToHost, p.bytes(), epIfindex) }
	fromHost := func(p packet6) uint32 { return run(t, f.d.hostProgsT().RampartFromHost, p.bytes(), epIfindex) }
	syn := func(src, dst netip.Addr, dport uint16) packet6 {
		return packet6{src: src, dst: dst, proto: uint8(tcp), sport: f.port(), dport: dport, tcpFlags: 0x02}
	}
	nd := func(src, dst netip.Addr, typ uint8, hop uint8) packet6 {
		return packet6{src: src, dst: dst, proto: uint8(icmp6), icmpType: typ, ndTarget: ipHost6, hopLimit: hop}
	}
	neighbourLL, hostLL := addr("fe80::5"), addr("fe80::9")

	// Ingress enforced: SSH from anyone, 2223 from the CIDR; egress enforced: nothing.
	f.applyHost(epIfindex, true, true, e(allow(identity.Any, in, tcp, 22, 16, 1)), e(allow(cidrID, in, tcp, 2223, 16, 2)))
	f.expectHostPass("world to host:22", toHost(syn(ipOut6, ipHost6, 22)))
	f.expectHostDrop("world to host:23", toHost(syn(ipOut6, ipHost6, 23)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostPass("CIDR to host:2223", toHost(syn(ipCIDR6, ipHost6, 2223)))
	f.expectHostDrop("world to host:2223", toHost(syn(ipOut6, ipHost6, 2223)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostDrop("neighbour to host's link-local:23", toHost(syn(neighbourLL, hostLL, 23)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostDrop("the router's link-local from the fabric is not the host", toHost(syn(routerLL, hostLL, 23)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostDrop("a host address from outside is not the host", toHost(syn(ipHost6, ipHost6, 23)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostPass("forwarded to a pod", toHost(syn(ipOut6, epIP6, 23)))
	f.expectHostPass("forwarded from a pod", fromHost(syn(epIP6, ipOut6, 443)))
	f.expectHostPass("VXLAN from a node", toHost(packet6{src: node2, dst: ipHost6, proto: uint8(udp), sport: 50000, dport: vxlanPort}))
	f.expectHostDrop("VXLAN port from the world", toHost(packet6{src: ipOut6, dst: ipHost6, proto: uint8(udp), sport: 50000, dport: vxlanPort}),
		flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostDrop("host to the world:443", fromHost(syn(ipHost6, ipOut6, 443)), flow.ReasonPolicyDefaultDeny, uint8(out))
	f.expectHostDrop("host's link-local to a neighbour:443", fromHost(syn(hostLL, neighbourLL, 443)), flow.ReasonPolicyDefaultDeny, uint8(out))
	// Neighbour discovery passes both ways, to any address of the link (policy allows no
	// ICMPv6 here), but only from the link.
	f.expectHostPass("NS to the host's address", toHost(nd(neighbourLL, ipHost6, 135, 255)))
	f.expectHostPass("NS to a solicited-node group", toHost(nd(neighbourLL, addr("ff02::1:ff00:1"), 135, 255)))
	f.expectHostPass("the host's NUD probe", fromHost(nd(ipHost6, ipOut6, 135, 255)))
	f.expectHostDrop("NS to the host not from the link", toHost(nd(ipOut6, ipHost6, 135, 64)), flow.ReasonMalformed, uint8(in))
	f.expectHostDrop("echo to the host", toHost(packet6{src: ipOut6, dst: ipHost6, proto: uint8(icmp6), icmpType: 128, icmpID: 7}),
		flow.ReasonPolicyDefaultDeny, uint8(in))
	// What the parser refuses is dropped when it is the node's, passed on when forwarded.
	routed := syn(ipOut6, ipHost6, 22)
	routed.ext = []ext6{{typ: 43, segLeft: 1}}
	f.expectHostDrop("routing header to the host", toHost(routed), flow.ReasonIpv6Extension, uint8(in))
	routed.dst = epIP6
	f.expectHostPass("routing header, forwarded", toHost(routed))

	// The API server over IPv6: allowed both ways, the reply by conntrack.
	api6 := netip.AddrPortFrom(ipOut6, 6443)
	if err := f.d.Host.SetHostSafe([]HostSafe{{Addr: netip.AddrPortFrom(ipOut, 443), Proto: uint8(tcp)}, {Addr: api6, Proto: uint8(tcp)}}); err != nil {
		t.Fatal(err)
	}
	s := syn(ipHost6, ipOut6, 6443)
	if ret := fromHost(s); ret != actUnspec {
		t.Errorf("host to the API server over IPv6: verdict %d, want passed on", ret)
	} else if ev := nextEvent(t, f.ev); ev.RuleID != hostSafeRuleID {
		t.Errorf("host to the API server over IPv6: rule %d, want HOST_SAFE_RULE_ID", ev.RuleID)
	}
	f.drain()
	f.expectHostPass("the API server's reply", toHost(packet6{src: ipOut6, dst: ipHost6, proto: uint8(tcp), sport: 6443, dport: s.sport, tcpFlags: 0x12}))
	f.expectHostDrop("host to the API server's address, another port", fromHost(syn(ipHost6, ipOut6, 6444)), flow.ReasonPolicyDefaultDeny, uint8(out))
	if err := f.d.Host.SetHostSafe(nil); err != nil {
		t.Fatal(err)
	}
	if n := count6(t, f.d.objs.HostSafe6); n != 0 {
		t.Errorf("host_safe6 holds %d entries after SetHostSafe(nil)", n)
	}

	// Between the endpoint and the node: the host endpoint on another device admits TCP
	// 9100 from the endpoint and may open TCP 80 to it.
	const hostDev = 77
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, hostEpID); err != nil {
		t.Fatal(err)
	}
	f.apply6(false, false)
	f.applyHost(hostDev, true, true, e(allow(epIdent, in, tcp, 9100, 16, 2)), e(allow(epIdent, out, tcp, 80, 16, 3)))
	est := packet6{src: epIP6, dst: ipHost6, proto: uint8(tcp), sport: f.port(), dport: 9100, tcpFlags: 0x02}
	f.expectPass("endpoint to host:9100", f.fromEp6(est))
	f.expectHostDrop("endpoint to host:9200", f.fromEp6(packet6{src: epIP6, dst: ipHost6, proto: uint8(tcp), sport: f.port(), dport: 9200, tcpFlags: 0x02}),
		flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostDrop("endpoint's link-local to the router's:9200", f.fromEp6(packet6{src: epLL6, dst: routerLL, proto: uint8(tcp), sport: f.port(), dport: 9200, tcpFlags: 0x02}),
		flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectPass("endpoint's link-local to the router's:9100", f.fromEp6(packet6{src: epLL6, dst: routerLL, proto: uint8(tcp), sport: f.port(), dport: 9100, tcpFlags: 0x02}))
	f.expectPass("endpoint to the world (not the host's)", f.fromEp6(packet6{src: epIP6, dst: ipOut6, proto: uint8(tcp), sport: f.port(), dport: 9200, tcpFlags: 0x02}))
	f.expectPass("host to endpoint:80", f.toEp6(packet6{src: ipHost6, dst: epIP6, proto: uint8(tcp), sport: f.port(), dport: 80, tcpFlags: 0x02}))
	f.expectHostDrop("host to endpoint:81", f.toEp6(packet6{src: ipHost6, dst: epIP6, proto: uint8(tcp), sport: f.port(), dport: 81, tcpFlags: 0x02}),
		flow.ReasonPolicyDefaultDeny, uint8(out))
	ack := est
	ack.tcpFlags = 0x10
	f.expectPass("endpoint to host:9100, established", f.fromEp6(ack))
	f.applyHost(hostDev, true, true, e(allow(epIdent, in, tcp, 9100, 16, 2)), e(allow(epIdent, out, tcp, 80, 16, 3)),
		e(deny(epIdent, in, tcp, 9100, 16, 4)))
	if err := f.d.Host.RecheckFlows(); err != nil {
		t.Fatal(err)
	}
	f.expectHostDrop("endpoint to host:9100, established, after a host deny", f.fromEp6(ack), flow.ReasonPolicyDeny, uint8(in))
}
