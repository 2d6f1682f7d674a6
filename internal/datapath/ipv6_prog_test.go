package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// The IPv6 fixture world: the fixture's endpoint with IPv6 addresses, peers by identity,
// a CIDR, the router (host).
var (
	epIP6    = addr("2001:2::a")
	epLL6    = addr("fe80::a")
	ipA6     = addr("2001:2::14")
	ipB6     = addr("2001:2::1e")
	ipCIDR6  = addr("2001:2:1::6")
	ipOut6   = addr("2001:db8::9")
	ipHost6  = addr("2001:2::1")
	routerLL = addr("fe80::1")
	icmp6    = policy.ProtoICMPv6
)

func fixtureIPCache6() map[netip.Prefix]mapstate.IPCacheEntry {
	m := fixtureIPCache()
	m[netip.MustParsePrefix("::/0")] = mapstate.IPCacheEntry{Identity: identity.World}
	m[netip.MustParsePrefix("2001:2::a/128")] = mapstate.IPCacheEntry{Identity: epIdent, EndpointID: epID}
	m[netip.MustParsePrefix("2001:2::14/128")] = mapstate.IPCacheEntry{Identity: idA}
	m[netip.MustParsePrefix("2001:2::1e/128")] = mapstate.IPCacheEntry{Identity: idB}
	m[netip.MustParsePrefix("2001:2:1::/64")] = mapstate.IPCacheEntry{Identity: cidrID}
	m[netip.MustParsePrefix("2001:2::1/128")] = mapstate.IPCacheEntry{Identity: identity.Host}
	return m
}

func newFixture6(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, Config{})
	if err := f.d.IPCache.ApplyIPCache(fixtureIPCache6()); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) apply6(enforceIn, enforceOut bool, es ...entry) {
	f.t.Helper()
	err := f.d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP, Addr6: epIP6, LinkLocal6: epLL6},
		mapstate.EndpointPolicy{EnforceIngress: enforceIn, EnforceEgress: enforceOut, Entries: entries(es...)})
	if err != nil {
		f.t.Fatalf("ApplyEndpoint: %v", err)
	}
}

// ext6 is an IPv6 extension header for packet6: its type and, for a routing header,
// segments left; a fragment header's fields are packet6's.
type ext6 struct {
	typ     uint8
	segLeft uint8
	words   int // length in 8-octet units beyond the first
}

// packet6 is an IPv6 packet for BPF_PROG_RUN (checksums zero, as for packet).
type packet6 struct {
	src, dst   netip.Addr
	proto      uint8
	sport      uint16
	dport      uint16
	tcpFlags   uint8
	icmpType   uint8
	icmpID     uint16
	ndTarget   netip.Addr // NS and NA
	hopLimit   uint8      // 0: 64
	ext        []ext6
	frag       bool // a fragment header, with fragID, fragOffset, mf
	fragID     uint32
	fragOffset uint16 // 8-octet units; non-zero: a later fragment (payload only)
	mf         bool
	quoted     []byte // ICMPv6 errors: the quoted packet
	payload    []byte
	payloadLen int // overrides the payload length field
}

func (p packet6) l4() []byte {
	if p.frag && p.fragOffset != 0 {
		return nil
	}
	switch policy.Protocol(p.proto) {
	case tcp:
		b := make([]byte, 20)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		b[12] = 5 << 4
		b[13] = p.tcpFlags
		return b
	case udp:
		b := make([]byte, 8)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		return b
	case icmp6:
		b := make([]byte, 8)
		b[0] = p.icmpType
		binary.BigEndian.PutUint16(b[4:], p.icmpID)
		if p.ndTarget.IsValid() {
			t := p.ndTarget.As16()
			b = append(b, t[:]...)
		}
		return append(b, p.quoted...)
	}
	return nil
}

// ip6 is the IPv6 packet without the Ethernet header.
func (p packet6) ip6() []byte {
	type hdr struct {
		typ  uint8
		body []byte
	}
	var chain []hdr
	for _, x := range p.ext {
		b := make([]byte, 8+8*x.words)
		b[1] = uint8(x.words)
		if x.typ == 43 {
			b[3] = x.segLeft
		}
		chain = append(chain, hdr{x.typ, b})
	}
	if p.frag {
		b := make([]byte, 8)
		off := p.fragOffset << 3
		if p.mf {
			off |= 1
		}
		binary.BigEndian.PutUint16(b[2:], off)
		binary.BigEndian.PutUint32(b[4:], p.fragID)
		chain = append(chain, hdr{44, b})
	}
	var body []byte
	for i, h := range chain {
		next := p.proto
		if i+1 < len(chain) {
			next = chain[i+1].typ
		}
		h.body[0] = next
		body = append(body, h.body...)
	}
	body = append(body, p.l4()...)
	body = append(body, p.payload...)
	first := p.proto
	if len(chain) > 0 {
		first = chain[0].typ
	}
	h := make([]byte, 40)
	h[0] = 6 << 4
	plen := len(body)
	if p.payloadLen != 0 {
		plen = p.payloadLen
	}
	binary.BigEndian.PutUint16(h[4:], uint16(plen))
	h[6] = first
	h[7] = p.hopLimit
	if h[7] == 0 {
		h[7] = 64
	}
	s, d := p.src.As16(), p.dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, body...)
}

func (p packet6) bytes() []byte {
	return packet{ethType: 0x86dd, payload: p.ip6()}.bytes()
}

func (f *fixture) toEp6(p packet6) uint32 {
	f.t.Helper()
	return run(f.t, f.d.objs.RampartToEp, p.bytes(), epIfindex)
}

func (f *fixture) fromEp6(p packet6) uint32 {
	f.t.Helper()
	return run(f.t, f.d.objs.RampartFromEp, p.bytes(), epIfindex)
}

func (f *fixture) syn6(src netip.Addr, dport uint16) packet6 {
	return packet6{src: src, dst: epIP6, proto: uint8(tcp), sport: f.port(), dport: dport, tcpFlags: 0x02}
}

// expectEvent6 checks a verdict and its event: its reason, addresses and identities.
func (f *fixture) expectEvent6(name string, ret uint32, p packet6, reason flow.Reason, src, dst identity.Identity) {
	f.t.Helper()
	want := uint32(actOK)
	if reason != flow.ReasonNone {
		want = actShot
	}
	if ret != want {
		f.t.Errorf("%s: verdict %d, want %d", name, ret, want)
		f.drain()
		return
	}
	ev := nextEvent(f.t, f.ev)
	if ev.Reason != reason || ev.Source != p.src || ev.Destination != p.dst ||
		ev.SrcIdentity != src || ev.DstIdentity != dst || ev.Protocol != policy.Protocol(p.proto) {
		f.t.Errorf("%s: event %v %v -> %v (%v -> %v, protocol %v), want %v %v -> %v (%v -> %v, protocol %v)", name,
			ev.Reason, ev.Source, ev.Destination, ev.SrcIdentity, ev.DstIdentity, ev.Protocol,
			reason, p.src, p.dst, src, dst, p.proto)
	}
	f.drain()
}

func TestIPv6PolicyAndConntrack(t *testing.T) {
	f := newFixture6(t)
	f.apply6(true, false, e(allow(idA, in, tcp, 80, 16, 11)), e(allow(cidrID, in, udp, 53, 16, 12)))

	syn := f.syn6(ipA6, 80)
	f.expectEvent6("allowed SYN", f.toEp6(syn), syn, flow.ReasonNone, idA, epIdent)
	reply := packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x12}
	f.expectPass("SYN-ACK (reply)", f.fromEp6(reply))
	ack := syn
	ack.tcpFlags = 0x10
	f.expectPass("ACK (established)", f.toEp6(ack))
	noEvent(t, f.ev)

	other := f.syn6(ipA6, 81)
	f.expectEvent6("other port", f.toEp6(other), other, flow.ReasonPolicyDefaultDeny, idA, epIdent)
	fromB := f.syn6(ipB6, 80)
	f.expectEvent6("other peer", f.toEp6(fromB), fromB, flow.ReasonPolicyDefaultDeny, idB, epIdent)
	dns := packet6{src: ipCIDR6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectEvent6("CIDR peer", f.toEp6(dns), dns, flow.ReasonNone, cidrID, epIdent)
	world := packet6{src: ipOut6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectEvent6("world", f.toEp6(world), world, flow.ReasonPolicyDefaultDeny, identity.World, epIdent)
	// Egress is not enforced: a new flow out passes, and its reply comes in.
	out6 := packet6{src: epIP6, dst: ipOut6, proto: uint8(udp), sport: f.port(), dport: 443}
	f.expectEvent6("egress", f.fromEp6(out6), out6, flow.ReasonNone, epIdent, identity.World)
	back := packet6{src: ipOut6, dst: epIP6, proto: uint8(udp), sport: 443, dport: out6.sport}
	f.expectPass("egress reply", f.toEp6(back))

	// A deny rule reaches the established flow on its next packet.
	f.apply6(true, false, e(allow(idA, in, tcp, 80, 16, 11)), e(deny(idA, in, tcp, 80, 16, 13)))
	f.expectEvent6("established after deny", f.toEp6(ack), ack, flow.ReasonPolicyDeny, idA, epIdent)

	// The conntrack entry is keyed as IPv4's, with 16-byte addresses; the endpoint's
	// removal purges it.
	if n := count6(t, f.d.objs.Conntrack6); n == 0 {
		t.Errorf("conntrack6 is empty after IPv6 flows")
	}
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, epID); err != nil {
		t.Fatal(err)
	}
	if n := count6(t, f.d.objs.Conntrack6); n != 0 {
		t.Errorf("conntrack6 holds %d entries after the endpoint's removal", n)
	}
	if n := count6(t, f.d.objs.Endpoints6); n != 0 {
		t.Errorf("endpoints6 holds %d entries after the endpoint's removal", n)
	}
}

func TestIPv6ICMP(t *testing.T) {
	f := newFixture6(t)
	f.apply6(true, true, e(allow(idA, in, icmp6, 128, 16, 21)), e(allow(idA, out, tcp, 443, 16, 22)))

	echo := packet6{src: ipA6, dst: epIP6, proto: uint8(icmp6), icmpType: 128, icmpID: 77}
	f.expectEvent6("echo request", f.toEp6(echo), echo, flow.ReasonNone, idA, epIdent)
	f.expectPass("echo reply", f.fromEp6(packet6{src: epIP6, dst: ipA6, proto: uint8(icmp6), icmpType: 129, icmpID: 77}))
	f.expectDrop("unsolicited echo reply out", f.fromEp6(packet6{src: epIP6, dst: ipA6, proto: uint8(icmp6), icmpType: 129, icmpID: 78}), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("echo from B", f.toEp6(packet6{src: ipB6, dst: epIP6, proto: uint8(icmp6), icmpType: 128, icmpID: 79}), flow.ReasonPolicyDefaultDeny)

	// Packet too big about a live flow, from the node (router) and from a router outside:
	// related. From a pod of the cluster quoting another's flow: judged by policy.
	conn := packet6{src: epIP6, dst: ipOut6, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02}
	f.expectDrop("egress to the world on 443 (not allowed)", f.fromEp6(conn), flow.ReasonPolicyDefaultDeny)
	conn.dst = ipA6
	f.expectPass("egress to A on 443", f.fromEp6(conn))
	quote := conn.ip6()[:48]
	ptb := packet6{src: ipHost6, dst: epIP6, proto: uint8(icmp6), icmpType: 2, quoted: quote}
	f.expectPass("packet too big from the node", f.toEp6(ptb))
	fromA := packet6{src: ipA6, dst: epIP6, proto: uint8(icmp6), icmpType: 2, quoted: quote}
	f.expectPass("packet too big from the flow's peer", f.toEp6(fromA))
	fromB := packet6{src: ipB6, dst: epIP6, proto: uint8(icmp6), icmpType: 1, quoted: quote}
	f.expectDrop("unreachable from a third pod", f.toEp6(fromB), flow.ReasonPolicyDefaultDeny)
}

func TestIPv6NeighbourDiscovery(t *testing.T) {
	f := newFixture6(t)
	f.apply6(true, true) // everything enforced, nothing allowed: ND passes on its own
	unspec := netip.IPv6Unspecified()
	allNodes, solicited := addr("ff02::1"), addr("ff02::1:ff00:1")
	nd := func(src, dst netip.Addr, typ uint8, target netip.Addr) packet6 {
		return packet6{src: src, dst: dst, proto: uint8(icmp6), icmpType: typ, ndTarget: target, hopLimit: 255}
	}
	for _, c := range []struct {
		name   string
		p      packet6
		egress bool
		reason flow.Reason
	}{
		{"NS for the router", nd(epLL6, solicited, 135, routerLL), true, flow.ReasonNone},
		{"NS from the global address", nd(epIP6, solicited, 135, routerLL), true, flow.ReasonNone},
		{"NS for DAD", nd(unspec, solicited, 135, epIP6), true, flow.ReasonNone},
		{"NA for its address", nd(epLL6, routerLL, 136, epIP6), true, flow.ReasonNone},
		{"NA for its link-local", nd(epLL6, allNodes, 136, epLL6), true, flow.ReasonNone},
		{"RS", nd(epLL6, addr("ff02::2"), 133, netip.Addr{}), true, flow.ReasonNone},
		{"MLDv2 report", packet6{src: epLL6, dst: addr("ff02::16"), proto: uint8(icmp6), icmpType: 143, hopLimit: 1, payload: make([]byte, 8)}, true, flow.ReasonNone},
		{"NA for another pod's address", nd(epLL6, routerLL, 136, ipA6), true, flow.ReasonSpoofedSource},
		{"NA for the router's link-local", nd(epLL6, allNodes, 136, routerLL), true, flow.ReasonSpoofedSource},
		{"NA from unspecified", nd(unspec, allNodes, 136, epIP6), true, flow.ReasonSpoofedSource},
		{"NS from another address", nd(ipA6, solicited, 135, routerLL), true, flow.ReasonSpoofedSource},
		{"RA", nd(epLL6, allNodes, 134, netip.Addr{}), true, flow.ReasonSpoofedSource},
		{"redirect", nd(epLL6, routerLL, 137, netip.Addr{}), true, flow.ReasonSpoofedSource},
		{"NS not from the link", func() packet6 { p := nd(epLL6, solicited, 135, routerLL); p.hopLimit = 64; return p }(), true, flow.ReasonMalformed},
		{"NS without its target", packet6{src: epLL6, dst: solicited, proto: uint8(icmp6), icmpType: 135, hopLimit: 255}, true, flow.ReasonMalformed},
		{"NS from the router", nd(routerLL, solicited, 135, epIP6), false, flow.ReasonNone},
		{"NA from the router", nd(routerLL, epLL6, 136, routerLL), false, flow.ReasonNone},
		{"RA from the router", nd(routerLL, allNodes, 134, netip.Addr{}), false, flow.ReasonNone},
		{"NA routed in", func() packet6 { p := nd(ipA6, epIP6, 136, ipA6); p.hopLimit = 63; return p }(), false, flow.ReasonMalformed},
		// Sent beyond the link, ND is an ICMPv6 packet like others: policy (which allows
		// nothing here) judges it.
		{"NS to a world address", nd(epLL6, ipOut6, 135, ipOut6), true, flow.ReasonPolicyDefaultDeny},
		{"NA to another pod", nd(epIP6, ipA6, 136, epIP6), true, flow.ReasonPolicyDefaultDeny},
		{"MLD report to global multicast", packet6{src: epLL6, dst: addr("ff0e::16"), proto: uint8(icmp6), icmpType: 143, hopLimit: 1, payload: make([]byte, 8)}, true, flow.ReasonPolicyDefaultDeny},
		{"NUD from the node", nd(routerLL, epIP6, 135, epIP6), false, flow.ReasonNone},
	} {
		var ret uint32
		if c.egress {
			ret = f.fromEp6(c.p)
		} else {
			ret = f.toEp6(c.p)
		}
		if c.reason == flow.ReasonNone {
			f.expectPass(c.name, ret)
		} else {
			f.expectDrop(c.name, ret, c.reason)
		}
	}
}

func TestIPv6SourceCheck(t *testing.T) {
	f := newFixture6(t)
	f.apply6(false, false)
	f.expectPass("own address", f.fromEp6(packet6{src: epIP6, dst: ipA6, proto: uint8(udp), sport: f.port(), dport: 9}))
	f.expectPass("own link-local to the router", f.fromEp6(packet6{src: epLL6, dst: routerLL, proto: uint8(icmp6), icmpType: 128, icmpID: 5}))
	for _, src := range []netip.Addr{ipA6, addr("2001:2::b"), addr("fe80::b"), netip.IPv6Unspecified(), addr("::ffff:198.18.0.10")} {
		p := packet6{src: src, dst: ipB6, proto: uint8(udp), sport: f.port(), dport: 9}
		f.expectEvent6("from "+src.String(), f.fromEp6(p), p, flow.ReasonSpoofedSource, epIdent, idB)
	}
	// A local endpoint's address that did not come from its interface.
	p := packet6{src: epIP6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 9}
	c := skbContext{}
	c.Fields[6] = 99 // ingress_ifindex: received on another interface than the endpoint's
	ret, _ := runCtx(t, f.d.objs.RampartToEp, p.bytes(), c)
	f.expectDrop("own address from elsewhere", ret, flow.ReasonSpoofedSource)

	// Without IPv6 addresses, the endpoint's IPv6 drops.
	if err := f.d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	f.expectDrop("no IPv6 address", f.fromEp6(packet6{src: epIP6, dst: ipA6, proto: uint8(udp), sport: f.port(), dport: 9}), flow.ReasonUnsupportedL3)
	f.expectDrop("no IPv6 address (ND)", f.fromEp6(packet6{src: epLL6, dst: routerLL, proto: uint8(icmp6), icmpType: 135, ndTarget: routerLL, hopLimit: 255}), flow.ReasonUnsupportedL3)
	for _, bad := range []EndpointInfo{
		{EpID: epID, Identity: epIdent, Addr: epIP, Addr6: epIP6},
		{EpID: epID, Identity: epIdent, Addr: epIP, Addr6: epLL6, LinkLocal6: epLL6},
		{EpID: epID, Identity: epIdent, Addr: epIP, Addr6: epIP6, LinkLocal6: ipA6},
		{EpID: epID, Identity: epIdent, Addr: epIP, Addr6: addr("::ffff:198.18.0.10"), LinkLocal6: epLL6},
	} {
		if err := f.d.Endpoints.ApplyEndpoint(epIfindex, bad, mapstate.EndpointPolicy{}); err == nil {
			t.Errorf("ApplyEndpoint(%v, %v): no error", bad.Addr6, bad.LinkLocal6)
		}
	}
}

func TestIPv6ExtensionHeadersAndFragments(t *testing.T) {
	f := newFixture6(t)
	f.apply6(true, false, e(allow(idA, in, tcp, 80, 16, 31)), e(allow(idA, in, udp, 53, 16, 32)))

	withOpts := f.syn6(ipA6, 80)
	withOpts.ext = []ext6{{typ: 0}, {typ: 60, words: 1}, {typ: 43}, {typ: 60}}
	f.expectEvent6("hop-by-hop, options, routing done", f.toEp6(withOpts), withOpts, flow.ReasonNone, idA, epIdent)
	denied := f.syn6(ipA6, 81)
	denied.ext = []ext6{{typ: 60}}
	f.expectEvent6("port behind options", f.toEp6(denied), denied, flow.ReasonPolicyDefaultDeny, idA, epIdent)

	for _, c := range []struct {
		name   string
		ext    []ext6
		reason flow.Reason
	}{
		{"routing with segments left", []ext6{{typ: 43, segLeft: 1}}, flow.ReasonIpv6Extension},
		{"hop-by-hop second", []ext6{{typ: 60}, {typ: 0}}, flow.ReasonIpv6Extension},
		{"seven headers", []ext6{{typ: 60}, {typ: 60}, {typ: 60}, {typ: 60}, {typ: 60}, {typ: 60}, {typ: 60}}, flow.ReasonIpv6Extension},
	} {
		p := f.syn6(ipA6, 80)
		p.ext = c.ext
		f.expectDrop(c.name, f.toEp6(p), c.reason)
	}
	cut := f.syn6(ipA6, 80)
	cut.ext = []ext6{{typ: 60, words: 4}}
	cut.payloadLen = 16
	f.expectDrop("options beyond the payload", f.toEp6(cut), flow.ReasonMalformed)
	long := f.syn6(ipA6, 80)
	long.payloadLen = 400
	f.expectDrop("payload length beyond the packet", f.toEp6(long), flow.ReasonMalformed)
	jumbo := f.syn6(ipA6, 80)
	jumbo.ext = []ext6{{typ: 0}}
	jumbo.payloadLen = 0xffff + 1 // wraps to 0 in 16 bits: a jumbogram's
	f.expectDrop("jumbogram", f.toEp6(jumbo), flow.ReasonIpv6Extension)

	// Fragments: the first carries the ports; the later ones follow its verdict.
	first := packet6{src: ipA6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53, frag: true, fragID: 0x1234, mf: true, payload: make([]byte, 16)}
	f.expectEvent6("allowed first fragment", f.toEp6(first), first, flow.ReasonNone, idA, epIdent)
	later := first
	later.fragOffset, later.mf = 3, false
	f.expectPass("its later fragment", f.toEp6(later))
	stray := later
	stray.fragID = 0x9999
	f.expectDrop("a later fragment without a first", f.toEp6(stray), flow.ReasonFragmentUnknown)
	bad := packet6{src: ipA6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 54, frag: true, fragID: 0x4321, mf: true, payload: make([]byte, 16)}
	f.expectDrop("denied first fragment", f.toEp6(bad), flow.ReasonPolicyDefaultDeny)
	badLater := bad
	badLater.fragOffset, badLater.mf = 3, false
	f.expectDrop("its later fragment", f.toEp6(badLater), flow.ReasonPolicyDefaultDeny)
	atomic := packet6{src: ipA6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53, frag: true, fragID: 0x5555}
	f.expectPass("atomic fragment", f.toEp6(atomic))
}

// TestIPv6RedirectFailsClosed: an IPv6 connection that L7 or DNS rules apply to never
// passes unchecked: entering the endpoint without the proxy it is a proxy bypass; leaving
// it, it drops with no IPv6 proxy listener configured, with one configured but no socket
// there, and for DNS rules with no DNS proxy socket.
func TestIPv6RedirectFailsClosed(t *testing.T) {
	f := newFixture6(t)
	k, v := allow(idA, in, tcp, 80, 16, 41)
	v.Redirect = true
	eg, egv := allow(idA, out, tcp, 8080, 16, 42)
	egv.Redirect = true
	f.apply6(true, true, e(k, v), e(eg, egv), e(dnsRedirect(idA, out, udp, 53, 43)))
	syn := f.syn6(ipA6, 80)
	f.expectEvent6("L7 ingress rule, not from the proxy", f.toEp6(syn), syn, flow.ReasonProxyBypass, idA, epIdent)
	out6 := packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: f.port(), dport: 8080, tcpFlags: 0x02}
	f.expectEvent6("L7 egress rule, no IPv6 listener", f.fromEp6(out6), out6, flow.ReasonProxyUnavailable, epIdent, idA)
	if err := f.d.Proxy.SetProxy(netip.MustParseAddrPort("[::1]:15001")); err != nil {
		t.Fatal(err)
	}
	f.expectEvent6("L7 egress rule, nothing listening", f.fromEp6(out6), out6, flow.ReasonProxyUnavailable, epIdent, idA)
	dns := packet6{src: epIP6, dst: ipA6, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectEvent6("DNS rule", f.fromEp6(dns), dns, flow.ReasonProxyUnavailable, epIdent, idA)
}

// count6 counts the entries of m (conntrack6 or endpoints6).
func count6(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
