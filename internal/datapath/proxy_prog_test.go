package datapath

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// L7 steering under BPF_PROG_RUN. bpf_sk_assign refuses to work there (EOPNOTSUPP: the
// test skb is not at tc ingress), and the fixture has no proxy listener anyway, so a flow
// the program decides to steer shows up as a drop with flow.ReasonProxyUnavailable: that is how
// these tests tell "steered" from "forwarded" and from a policy drop. Real steering is
// tested with traffic in TestProxySteering.

// The destination endpoint of the fixture's client (epID at epIP): another local endpoint.
const (
	dstEpID    = 8
	dstIdent   = identity.Identity(5000)
	dstIfindex = 1000 // never run on: only the key of its endpoint info
	unknownEp  = 9    // in the ipcache, but with no endpoint info installed
)

var (
	ipDst     = addr("198.18.0.40")
	ipUnknown = addr("198.18.0.50")
)

func redirect(id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16, plen uint8, rule uint32) (mapstate.Key, mapstate.Value) {
	k, v := allow(id, dir, proto, port, plen, rule)
	v.Redirect = true
	return k, v
}

func dnsRedirect(id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16, rule uint32) (mapstate.Key, mapstate.Value) {
	k, v := redirect(id, dir, proto, port, 16, rule)
	v.DNS = true
	return k, v
}

func newProxyFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, Config{})
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipDst, 32)] = mapstate.IPCacheEntry{Identity: dstIdent, EndpointID: dstEpID}
	ipc[netip.PrefixFrom(ipUnknown, 32)] = mapstate.IPCacheEntry{Identity: dstIdent, EndpointID: unknownEp}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	return f
}

// applyDst sets the destination endpoint's policy.
func (f *fixture) applyDst(enforceIn bool, es ...entry) {
	f.t.Helper()
	err := f.d.Endpoints.ApplyEndpoint(dstIfindex, EndpointInfo{EpID: dstEpID, Identity: dstIdent, Addr: ipDst},
		mapstate.EndpointPolicy{EnforceIngress: enforceIn, Entries: entries(es...)})
	if err != nil {
		f.t.Fatalf("ApplyEndpoint (destination): %v", err)
	}
}

func (f *fixture) synOut(dst netip.Addr, proto policy.Protocol, dport uint16) packet {
	return packet{src: epIP, dst: dst, proto: uint8(proto), sport: f.port(), dport: dport, tcpFlags: 0x02}
}

// want describes the expected outcome of one packet.
type want struct {
	pass      bool
	reason    flow.Reason
	epID      uint32           // of the event (0: the fixture's endpoint)
	dir       policy.Direction // of the event (0: egress)
	rule      uint32
	verdict   flow.Verdict // of a pass event (0: forwarded)
	l7Egress  bool
	l7Ingress bool
	fromProxy bool
	noEvent   bool // a pass without a new-flow event (established packet)
}

func (f *fixture) check(name string, ret uint32, w want) {
	f.t.Helper()
	if w.pass != (ret == actOK) || (!w.pass && ret != actShot) {
		f.t.Errorf("%s: verdict %d, want pass=%v", name, ret, w.pass)
		f.drain()
		return
	}
	if w.noEvent {
		noEvent(f.t, f.ev)
		return
	}
	ev := nextEvent(f.t, f.ev)
	if w.epID == 0 {
		w.epID = epID
	}
	if w.dir == 0 {
		w.dir = out
	}
	wantType, wantVerdict := flow.EventDrop, flow.VerdictDropped
	if w.pass {
		wantType, wantVerdict = flow.EventNew, flow.VerdictForwarded
		if w.verdict != 0 {
			wantVerdict = w.verdict
		}
	}
	if ev.Type != wantType || ev.Verdict != wantVerdict || ev.Reason != w.reason || ev.EpID != w.epID ||
		ev.Direction != w.dir || ev.RuleID != w.rule || ev.Flags.Has(flow.FlagL7Egress) != w.l7Egress ||
		ev.Flags.Has(flow.FlagL7Ingress) != w.l7Ingress || ev.Flags.Has(flow.FlagFromProxy) != w.fromProxy {
		f.t.Errorf("%s: event %v/%v/%v ep %d dir %v rule %d l7egress %v l7ingress %v fromproxy %v; "+
			"want %v/%v/%v ep %d dir %v rule %d l7egress %v l7ingress %v fromproxy %v", name,
			ev.Type, ev.Verdict, ev.Reason, ev.EpID, ev.Direction, ev.RuleID, ev.Flags.Has(flow.FlagL7Egress), ev.Flags.Has(flow.FlagL7Ingress), ev.Flags.Has(flow.FlagFromProxy),
			wantType, wantVerdict, w.reason, w.epID, w.dir, w.rule, w.l7Egress, w.l7Ingress, w.fromProxy)
	}
	f.drain()
}

// TestL7VerdictCombination: at the client's veth, the client's egress verdict and the
// local destination's ingress verdict combine into forward, steer to the proxy, or drop.
func TestL7VerdictCombination(t *testing.T) {
	f := newProxyFixture(t)
	steered := func(rule uint32, egress, ingress bool) want {
		return want{reason: flow.ReasonProxyUnavailable, rule: rule, l7Egress: egress, l7Ingress: ingress}
	}

	for _, c := range []struct {
		name        string
		enforceOut  bool
		egress      []entry
		dstEnforce  bool
		dst         []entry
		pkt         func() packet
		w           want
		destination bool // the packet goes to the destination endpoint (else it is ipA)
	}{
		{
			name:   "allow + allow: forwarded, no proxy",
			egress: []entry{e(allow(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(allow(epIdent, in, tcp, 80, 16, 2))}, dstEnforce: true,
			w: want{pass: true, rule: 1},
		},
		{
			name:   "allow + destination redirect: steered",
			egress: []entry{e(allow(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(redirect(epIdent, in, tcp, 80, 16, 2))}, dstEnforce: true,
			w: steered(2, false, true),
		},
		{
			name:   "unenforced egress + destination redirect: steered",
			dst:    []entry{e(redirect(epIdent, in, tcp, 80, 16, 2))},
			w:      steered(2, false, true),
			egress: nil, enforceOut: false, dstEnforce: false,
		},
		{
			name:   "egress redirect + destination allow: steered",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(allow(epIdent, in, tcp, 80, 16, 2))}, dstEnforce: true,
			w: steered(1, true, false),
		},
		{
			name:   "redirect on both sides: steered once, egress rule reported",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(redirect(epIdent, in, tcp, 80, 16, 2))}, dstEnforce: true,
			w: steered(1, true, true),
		},
		{
			name:   "egress redirect + destination deny: dropped as the destination's ingress",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(allow(epIdent, in, tcp, 0, 0, 2)), e(deny(epIdent, in, tcp, 80, 16, 3))}, dstEnforce: true,
			w: want{reason: flow.ReasonPolicyDeny, epID: dstEpID, dir: in, rule: 3, l7Egress: true},
		},
		{
			name:   "egress redirect + destination default deny: dropped as the destination's ingress",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(allow(epIdent, in, tcp, 81, 16, 2))}, dstEnforce: true,
			w: want{reason: flow.ReasonPolicyDefaultDeny, epID: dstEpID, dir: in, l7Egress: true},
		},
		{
			name:   "egress redirect + destination not enforcing: steered",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dstEnforce: false,
			w:          steered(1, true, false),
		},
		{
			name:   "egress deny + destination redirect: dropped by egress",
			egress: []entry{e(allow(dstIdent, out, tcp, 0, 0, 1)), e(deny(dstIdent, out, tcp, 80, 16, 4))}, enforceOut: true,
			dst: []entry{e(redirect(epIdent, in, tcp, 80, 16, 2))}, dstEnforce: true,
			w: want{reason: flow.ReasonPolicyDeny, rule: 4},
		},
		{
			name:   "egress default deny + destination redirect: dropped by egress",
			egress: []entry{e(allow(dstIdent, out, tcp, 81, 16, 1))}, enforceOut: true,
			dst: []entry{e(redirect(epIdent, in, tcp, 80, 16, 2))}, dstEnforce: true,
			w: want{reason: flow.ReasonPolicyDefaultDeny},
		},
		{
			// Not steered: the destination's own veth decides, as without L7.
			name:   "allow + destination deny without redirect: forwarded here",
			egress: []entry{e(allow(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			dst: []entry{e(deny(epIdent, in, tcp, 80, 16, 3))}, dstEnforce: true,
			w: want{pass: true, rule: 1},
		},
		{
			name:   "destination redirect on another port: forwarded",
			egress: nil, enforceOut: false,
			dst: []entry{e(redirect(epIdent, in, tcp, 81, 16, 2)), e(allow(epIdent, in, tcp, 80, 16, 5))}, dstEnforce: true,
			w: want{pass: true},
		},
		{
			name:   "redirect for another peer identity: forwarded",
			egress: nil, enforceOut: false,
			dst: []entry{e(redirect(idA, in, tcp, 80, 16, 2)), e(allow(epIdent, in, tcp, 80, 16, 5))}, dstEnforce: true,
			w: want{pass: true},
		},
		{
			name:   "destination redirect for any identity beats the peer's allow",
			egress: nil, enforceOut: false,
			dst: []entry{e(allow(epIdent, in, tcp, 80, 16, 5)), e(redirect(identity.Any, in, tcp, 80, 16, 6))}, dstEnforce: true,
			w: steered(6, false, true),
		},
		{
			name:   "egress redirect for any identity beats the peer's allow",
			egress: []entry{e(allow(dstIdent, out, tcp, 80, 16, 1)), e(redirect(identity.Any, out, tcp, 80, 16, 7))}, enforceOut: true,
			w: steered(7, true, false),
		},
		{
			name:   "egress deny for any identity beats the peer's redirect",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1)), e(deny(identity.Any, out, tcp, 80, 16, 8))}, enforceOut: true,
			w: want{reason: flow.ReasonPolicyDeny, rule: 8},
		},
		{
			name:   "egress redirect of UDP: dropped, the proxy takes TCP only",
			egress: []entry{e(redirect(dstIdent, out, udp, 53, 16, 1))}, enforceOut: true,
			pkt: func() packet { return packet{src: epIP, dst: ipDst, proto: uint8(udp), sport: f.port(), dport: 53} },
			w:   steered(1, true, false),
		},
		{
			name:   "egress DNS redirect of UDP: steered to the DNS proxy",
			egress: []entry{e(dnsRedirect(dstIdent, out, udp, 53, 1))}, enforceOut: true,
			dst: []entry{e(allow(epIdent, in, udp, 53, 16, 2))}, dstEnforce: true,
			pkt: func() packet { return packet{src: epIP, dst: ipDst, proto: uint8(udp), sport: f.port(), dport: 53} },
			w:   steered(1, true, false),
		},
		{
			name:   "egress DNS redirect of TCP: steered to the DNS proxy",
			egress: []entry{e(dnsRedirect(dstIdent, out, tcp, 53, 1))}, enforceOut: true,
			pkt: func() packet { return f.synOut(ipDst, tcp, 53) },
			w:   steered(1, true, false),
		},
		{
			// The DNS proxy asks the server from the node's address: the server's own
			// ingress policy for the client is taken at the client's veth.
			name:   "egress DNS redirect + server default deny: dropped as the server's ingress",
			egress: []entry{e(dnsRedirect(dstIdent, out, udp, 53, 1))}, enforceOut: true,
			dst: []entry{e(allow(epIdent, in, udp, 54, 16, 2))}, dstEnforce: true,
			pkt: func() packet { return packet{src: epIP, dst: ipDst, proto: uint8(udp), sport: f.port(), dport: 53} },
			w:   want{reason: flow.ReasonPolicyDefaultDeny, epID: dstEpID, dir: in, l7Egress: true},
		},
		{
			name:   "egress DNS redirect + server deny: dropped as the server's ingress",
			egress: []entry{e(dnsRedirect(dstIdent, out, udp, 53, 1))}, enforceOut: true,
			dst: []entry{e(deny(epIdent, in, udp, 53, 16, 3))}, dstEnforce: false,
			pkt: func() packet { return packet{src: epIP, dst: ipDst, proto: uint8(udp), sport: f.port(), dport: 53} },
			w:   want{reason: flow.ReasonPolicyDeny, epID: dstEpID, dir: in, rule: 3, l7Egress: true},
		},
		{
			name:   "egress DNS redirect to a non-endpoint server: steered",
			egress: []entry{e(dnsRedirect(idA, out, udp, 53, 1))}, enforceOut: true,
			pkt: func() packet { return packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53} },
			w:   steered(1, true, false),
		},
		{
			// The destination's redirect entry is for TCP; UDP to the port is plain policy.
			name: "UDP to a port with a TCP redirect: forwarded",
			dst:  []entry{e(redirect(epIdent, in, tcp, 80, 16, 2)), e(allow(epIdent, in, udp, 80, 16, 9))}, dstEnforce: true,
			pkt: func() packet { return packet{src: epIP, dst: ipDst, proto: uint8(udp), sport: f.port(), dport: 80} },
			w:   want{pass: true},
		},
		{
			name:   "egress redirect to a non-endpoint peer: steered",
			egress: []entry{e(redirect(idA, out, tcp, 80, 16, 1))}, enforceOut: true,
			pkt: func() packet { return f.synOut(ipA, tcp, 80) },
			w:   steered(1, true, false),
		},
		{
			// An ipcache ep_id without endpoint info: its enforcement is unknown, so a
			// steered flow needs an explicit allow or redirect there (fail closed).
			name:   "egress redirect to an endpoint without info: dropped",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			pkt: func() packet { return f.synOut(ipUnknown, tcp, 80) },
			w:   want{reason: flow.ReasonPolicyDefaultDeny, epID: unknownEp, dir: in, l7Egress: true},
		},
		{
			name:   "first fragment of a steered flow: dropped",
			egress: []entry{e(redirect(dstIdent, out, tcp, 80, 16, 1))}, enforceOut: true,
			pkt: func() packet {
				p := f.synOut(ipDst, tcp, 80)
				p.mf, p.ipID = true, 4242
				return p
			},
			w: steered(1, true, false),
		},
	} {
		f.apply(false, c.enforceOut, c.egress...)
		f.applyDst(c.dstEnforce, c.dst...)
		f.drain()
		p := f.synOut(ipDst, tcp, 80)
		if c.pkt != nil {
			p = c.pkt()
		}
		f.check(c.name, f.fromEp(p), c.w)
	}

	// The later fragment of a dropped steered first fragment is dropped too.
	later := packet{src: epIP, dst: ipDst, proto: uint8(tcp), ipID: 4242, fragOffset: 3, payload: make([]byte, 16)}
	f.check("later fragment of a steered flow", f.fromEp(later), want{reason: flow.ReasonProxyUnavailable, rule: 1})
}

// TestL7EstablishedSteering: established packets of a steered flow are steered too, and
// dropped (unmarked) when their proxy socket is gone; an unsteered flow's established
// packets pass.
func TestL7EstablishedSteering(t *testing.T) {
	f := newProxyFixture(t)
	f.apply(false, false)
	f.applyDst(true, e(redirect(epIdent, in, tcp, 80, 16, 2)), e(allow(epIdent, in, tcp, 8080, 16, 3)))

	// A conntrack entry as a successful steering leaves it (BPF_PROG_RUN cannot assign).
	steered := f.synOut(ipDst, tcp, 80)
	putCT(t, f.d, steered, epID, out, ctFToProxy)
	ack := steered
	ack.tcpFlags = 0x10
	ret, mark := runCtx(t, f.d.objs.RampartFromEp, ack.bytes(), skbContext{})
	f.check("established packet of a steered flow without its socket", ret,
		want{reason: flow.ReasonProxyUnavailable})
	if mark != 0 {
		t.Errorf("dropped packet carries mark %#x", mark)
	}
	// A reply to the client of a steered flow (from the proxy's accepted socket) passes.
	reply := packet{src: ipDst, dst: epIP, proto: uint8(tcp), sport: 80, dport: steered.sport, tcpFlags: 0x12}
	f.check("reply of a steered flow to the client", f.toEp(reply), want{pass: true, noEvent: true})

	// Without the flag, the established packet is forwarded as usual.
	plain := f.synOut(ipDst, tcp, 8080)
	f.check("plain flow", f.fromEp(plain), want{pass: true})
	plain.tcpFlags = 0x10
	f.check("plain flow, established", f.fromEp(plain), want{pass: true, noEvent: true})

	pc, err := f.d.Endpoints.ProxyCounters(epID)
	if err != nil {
		t.Fatal(err)
	}
	if pc.ToProxy != 0 || pc.FromProxy != 0 {
		t.Errorf("proxy counters %+v, want none (nothing was assigned)", pc)
	}
}

// TestL7UpstreamMark: at the server's veth, a redirect verdict admits only the proxy's
// upstream connection (socket mark 0x2); its replies are then steered back to the proxy.
func TestL7UpstreamMark(t *testing.T) {
	f := newProxyFixture(t)
	f.apply(true, true,
		e(redirect(idA, in, tcp, 80, 16, 1)),
		e(allow(idA, in, tcp, 8080, 16, 2)),
		e(deny(idB, in, tcp, 80, 16, 3)),
		e(redirect(identity.Any, in, tcp, 81, 16, 4)),
	)
	toEpMark := func(p packet, mark uint32) uint32 {
		t.Helper()
		ret, _ := runCtx(t, f.d.objs.RampartToEp, p.bytes(), skbContext{Mark: mark})
		return ret
	}
	fromEpMark := func(p packet, mark uint32) uint32 {
		t.Helper()
		ret, _ := runCtx(t, f.d.objs.RampartFromEp, p.bytes(), skbContext{Mark: mark})
		return ret
	}
	f.drain()

	f.check("redirect without mark: bypass", toEpMark(f.synIn(ipA, 80), 0),
		want{reason: flow.ReasonProxyBypass, dir: in, rule: 1, l7Ingress: true})
	f.check("redirect with the steer mark only: bypass", toEpMark(f.synIn(ipA, 80), ProxySteerMark),
		want{reason: flow.ReasonProxyBypass, dir: in, rule: 1, l7Ingress: true})
	f.check("redirect with another mark: bypass", toEpMark(f.synIn(ipA, 80), 0x100),
		want{reason: flow.ReasonProxyBypass, dir: in, rule: 1, l7Ingress: true})

	up := f.synIn(ipA, 80)
	f.check("redirect with the upstream mark: admitted", toEpMark(up, ProxyUpstreamMark|0x100),
		want{pass: true, dir: in, rule: 1, l7Ingress: true, fromProxy: true})
	upAck := up
	upAck.tcpFlags = 0x10
	f.check("upstream connection, established", toEpMark(upAck, ProxyUpstreamMark), want{pass: true, noEvent: true})
	// The server's reply belongs to the proxy's upstream socket: steered, and without that
	// socket here, dropped (never sent on to the real client).
	synAck := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 80, dport: up.sport, tcpFlags: 0x12}
	f.check("reply to the upstream connection", fromEpMark(synAck, 0), want{reason: flow.ReasonProxyUnavailable})

	f.check("deny beats the upstream mark", toEpMark(f.synIn(ipB, 80), ProxyUpstreamMark),
		want{reason: flow.ReasonPolicyDeny, dir: in, rule: 3})
	f.check("default deny with the upstream mark", toEpMark(f.synIn(ipB, 9999), ProxyUpstreamMark),
		want{reason: flow.ReasonPolicyDefaultDeny, dir: in})
	f.check("redirect for any identity, from the proxy", toEpMark(f.synIn(ipOut, 81), ProxyUpstreamMark),
		want{pass: true, dir: in, rule: 4, l7Ingress: true, fromProxy: true})
	f.check("redirect for any identity, direct", toEpMark(f.synIn(ipOut, 81), 0),
		want{reason: flow.ReasonProxyBypass, dir: in, rule: 4, l7Ingress: true})
	f.check("UDP to a redirect for any protocol", toEpMark(packet{src: ipA, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 81}, ProxyUpstreamMark),
		want{reason: flow.ReasonPolicyDefaultDeny, dir: in})

	// A plain allow with the upstream mark (the client's egress rules were the L7 ones):
	// admitted, and its replies go back to the proxy too.
	up2 := f.synIn(ipA, 8080)
	f.check("allow with the upstream mark", toEpMark(up2, ProxyUpstreamMark),
		want{pass: true, dir: in, rule: 2, fromProxy: true})
	f.check("reply to it", fromEpMark(packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 8080, dport: up2.sport, tcpFlags: 0x12}, 0),
		want{reason: flow.ReasonProxyUnavailable})
	// The same allow without the mark: an ordinary flow whose replies pass.
	direct := f.synIn(ipA, 8080)
	f.check("allow without mark", toEpMark(direct, 0), want{pass: true, dir: in, rule: 2})
	f.check("reply to the direct flow", fromEpMark(packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 8080, dport: direct.sport, tcpFlags: 0x12}, 0),
		want{pass: true, noEvent: true})

	pc, err := f.d.Endpoints.ProxyCounters(epID)
	if err != nil {
		t.Fatal(err)
	}
	// Admitted upstream packets: the two SYNs on 80 and 81, the ACK, the SYN on 8080.
	if pc.FromProxy != 4 || pc.ToProxy != 0 {
		t.Errorf("proxy counters %+v, want FromProxy 4, ToProxy 0", pc)
	}
}

// putCT writes a live conntrack entry for p's tuple at endpoint ep in direction dir, with
// a reply seen and the given extra flags.
func putCT(t *testing.T, d *Datapath, p packet, ep uint32, dir policy.Direction, flags uint32) {
	t.Helper()
	k := ct4Key(p, ep, uint8(dir))
	now, err := jiffiesNow()
	if err != nil {
		t.Fatal(err)
	}
	v := rampartCtValue{Created: now, LastSeen: now, Flags: flags | ctFSeenReply, Direction: uint8(dir)}
	if err := d.objs.Conntrack4Peer.Update(&k, &v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

func TestSetProxy(t *testing.T) {
	testenv.RequireRoot(t)
	pin := filepath.Join(BPFFSRoot, "rampart-test-"+testenv.Suffix(8))
	d := openTest(t, Config{PinDir: pin})
	got, err := d.Proxy.Proxy()
	if err != nil {
		t.Fatal(err)
	}
	if got != DefaultProxyAddr {
		t.Errorf("default proxy %v, want %v", got, DefaultProxyAddr)
	}
	want := netip.MustParseAddrPort("127.0.0.2:16001")
	if err := d.Proxy.SetProxy(want); err != nil {
		t.Fatal(err)
	}
	// The IPv6 listener has a map of its own and leaves the IPv4 one alone.
	if err := d.Proxy.SetProxy(netip.MustParseAddrPort("[::1]:15001")); err != nil {
		t.Fatal(err)
	}
	var cfg6 rampartProxyConfig
	if err := d.objs.Proxy6.Lookup(uint32(0), &cfg6); err != nil {
		t.Fatal(err)
	}
	if cfg6.Family != familyV6 || netip.AddrFrom16(cfg6.Addr) != netip.IPv6Loopback() || cfg6.Port != htons(15001) {
		t.Errorf("proxy6 map %+v, want [::1]:15001", cfg6)
	}
	for _, bad := range []netip.AddrPort{{}, netip.MustParseAddrPort("[::ffff:127.0.0.1]:15001"), netip.MustParseAddrPort("127.0.0.1:0")} {
		if err := d.Proxy.SetProxy(bad); err == nil {
			t.Errorf("SetProxy(%v) accepted", bad)
		}
	}
	// A reopened datapath (restarted agent) keeps the setting.
	d2, err := Open(Config{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if got, err := d2.Proxy.Proxy(); err != nil || got != want {
		t.Errorf("proxy after reopen %v, %v; want %v", got, err, want)
	}
	// The BPF side reads it: raw map contents.
	var (
		zero uint32
		cfg  rampartProxyConfig
	)
	if err := d2.objs.Proxy.Lookup(&zero, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Addr[0] != 127 || cfg.Addr[3] != 2 || cfg.Port != htons(16001) || cfg.SteerMark != 1 || cfg.UpstreamMark != 2 {
		t.Errorf("proxy map %+v", cfg)
	}
}

// TestEndpointsByID: the ep_id-keyed copy of the endpoint info follows ApplyEndpoint and
// RemoveEndpoint, also when an endpoint moves to a new interface.
func TestEndpointsByID(t *testing.T) {
	d := openTest(t, Config{})
	lookup := func(id uint32) (rampartEndpointInfo, bool) {
		var info rampartEndpointInfo
		err := d.objs.EndpointsById.Lookup(&id, &info)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return info, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return info, true
	}
	if err := d.Endpoints.ApplyEndpoint(10, EndpointInfo{EpID: 3, Identity: 300, Addr: ipA}, mapstate.EndpointPolicy{EnforceIngress: true}); err != nil {
		t.Fatal(err)
	}
	if info, ok := lookup(3); !ok || info.Identity != 300 || info.Flags != enforceIngress {
		t.Fatalf("by id after apply: %+v %v", info, ok)
	}
	// The endpoint's veth was recreated: new ifindex, same ep_id.
	if err := d.Endpoints.ApplyEndpoint(11, EndpointInfo{EpID: 3, Identity: 300, Addr: ipA}, mapstate.EndpointPolicy{EnforceEgress: true}); err != nil {
		t.Fatal(err)
	}
	if info, ok := lookup(3); !ok || info.Flags != enforceEgress {
		t.Fatalf("by id after move: %+v %v", info, ok)
	}
	// Another endpoint takes over ifindex 11: endpoint 3 is gone from it.
	if err := d.Endpoints.ApplyEndpoint(11, EndpointInfo{EpID: 4, Identity: 400, Addr: ipB}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := lookup(3); ok {
		t.Error("endpoint 3 still by id after its interface was taken over")
	}
	if err := d.Endpoints.RemoveEndpoint(11, 4); err != nil {
		t.Fatal(err)
	}
	if _, ok := lookup(4); ok {
		t.Error("endpoint 4 still by id after removal")
	}
	// Open rebuilds the map from the endpoints map.
	if err := d.Endpoints.ApplyEndpoint(12, EndpointInfo{EpID: 5, Identity: 500, Addr: ipPod}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	id := uint32(5)
	if err := d.objs.EndpointsById.Delete(&id); err != nil {
		t.Fatal(err)
	}
	stale, staleInfo := uint32(6), rampartEndpointInfo{EpId: 6}
	if err := d.objs.EndpointsById.Update(&stale, &staleInfo, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(Config{PinDir: d.Pins.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if info, ok := lookup(5); !ok || info.Identity != 500 {
		t.Errorf("endpoint 5 by id after reopen: %+v %v", info, ok)
	}
	if _, ok := lookup(6); ok {
		t.Error("stale endpoint 6 by id after reopen")
	}
}

func TestRedirectEntriesRoundTrip(t *testing.T) {
	d := openTest(t, Config{})
	k1, v1 := redirect(idA, in, tcp, 80, 16, 1)
	k2, v2 := allow(idA, in, tcp, 81, 16, 2)
	k3, v3 := deny(idB, in, tcp, 80, 16, 3)
	want := entries(e(k1, v1), e(k2, v2), e(k3, v3))
	if err := d.Endpoints.ApplyEndpoint(10, EndpointInfo{EpID: 3, Identity: 300, Addr: ipA}, mapstate.EndpointPolicy{EnforceIngress: true, Entries: want}); err != nil {
		t.Fatal(err)
	}
	check := func(d *Datapath, want map[mapstate.Key]mapstate.Value) {
		t.Helper()
		got := d.Endpoints.InstalledPolicy(3)
		if len(got) != len(want) {
			t.Errorf("installed %v, want %v", got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("entry %+v: %+v, want %+v", k, got[k], v)
			}
		}
	}
	check(d, want)
	// Redirect <-> allow is an overwrite of the same key.
	v1.Redirect, v2.Redirect = false, true
	want = entries(e(k1, v1), e(k2, v2), e(k3, v3))
	if err := d.Endpoints.ApplyEndpoint(10, EndpointInfo{EpID: 3, Identity: 300, Addr: ipA}, mapstate.EndpointPolicy{EnforceIngress: true, Entries: want}); err != nil {
		t.Fatal(err)
	}
	check(d, want)
	// Read back from the maps by a new Datapath.
	d2, err := Open(Config{PinDir: d.Pins.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	check(d2, want)
	// A deny that also says redirect is a deny.
	_, dv := deny(idA, in, tcp, 82, 16, 4)
	dv.Redirect = true
	if got := policyValue(dv); got.Action != policyDeny {
		t.Errorf("deny+redirect written as action %d", got.Action)
	}
}
