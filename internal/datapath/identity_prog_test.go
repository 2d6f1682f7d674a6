package datapath

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
)

// ipPeer is the peer whose identity the tests change: an address of its own, so that
// idA keeps an address (ipA), and with it its policy entries, whatever happens to it.
var ipPeer = addr("198.18.0.40")

// setPeerIdentity maps ipPeer to id in the fixture's ipcache, as the agent does when the
// pod there is relabelled or the address goes to another pod.
func (f *fixture) setPeerIdentity(id identity.Identity) {
	f.t.Helper()
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipPeer, 32)] = mapstate.IPCacheEntry{Identity: id}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		f.t.Fatal(err)
	}
}

// ctEntry reads the conntrack entry of p's flow at the fixture's endpoint, p travelling
// in direction dir.
func (f *fixture) ctEntry(p packet, dir uint8) rampartCtValue {
	f.t.Helper()
	k := ct4Key(p, epID, dir)
	var v rampartCtValue
	if err := f.d.objs.Conntrack4Peer.Lookup(&k, &v); err != nil {
		f.t.Fatalf("conntrack entry of %v: %v", p, err)
	}
	return v
}

// expectIdentityDrop checks that ret dropped a packet as one of an established flow
// whose peer now has identity src (the event's source, ingress) and rule.
func (f *fixture) expectIdentityDrop(name string, ret uint32, src identity.Identity, rule uint32) {
	f.t.Helper()
	ev, ok := f.dropped(name, ret)
	if !ok {
		return
	}
	if ev.Type != flow.EventDrop || ev.Reason != flow.ReasonPeerIdentityChanged || ev.SrcIdentity != src || ev.RuleID != rule {
		f.t.Errorf("%s: event %v/%v from %d rule %d, want a %v drop from %d rule %d", name,
			ev.Type, ev.Reason, ev.SrcIdentity, ev.RuleID, flow.ReasonPeerIdentityChanged, src, rule)
	}
}

// establishTCPIn opens a TCP connection from ipPeer to the endpoint's port 80 (SYN, the
// endpoint's SYN-ACK, an ACK) and sends one more ACK, which the flow cache serves: the
// flow is established on the conntrack and the flow cache paths.
func (f *fixture) establishTCPIn() packet {
	f.t.Helper()
	syn := f.synIn(ipPeer, 80)
	f.expectPass("SYN", f.toEp(syn))
	synAck := packet{src: epIP, dst: ipPeer, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x12}
	f.expectPass("SYN-ACK", f.fromEp(synAck))
	ack := syn
	ack.tcpFlags = 0x10
	f.expectPass("ACK", f.toEp(ack))
	if _, ok := cachedFlow(f.t, f.d, ack, false); !ok {
		f.t.Fatal("the established flow is not in the flow cache")
	}
	f.expectPass("cached ACK", f.toEp(ack))
	f.drain()
	return ack
}

// An established flow admitted for its peer's identity A is checked again when the ipcache
// gives the peer's address identity B, although the endpoint's policy (and its revision)
// did not change and A's entries stay: B not allowed, its packets are dropped (and keep
// being dropped, from the flow cache too), in both directions; B allowed, they pass and
// the entry records B.
func TestPeerIdentityChangeEstablished(t *testing.T) {
	f := newFixture(t, Config{})
	f.setPeerIdentity(idA)
	f.apply(true, true, e(allow(idA, in, tcp, 80, 16, 1)), e(allow(idA, in, tcp, 81, 16, 4)),
		e(deny(idB, in, tcp, 81, 16, 2)), e(allow(idA, out, tcp, 443, 16, 3)))
	rev := endpointRevision(t, f.d)
	f.drain()

	defaultDenied := f.establishTCPIn() // B: no entry (default deny)
	syn81 := f.synIn(ipPeer, 81)        // B: a deny entry
	f.expectPass("SYN to 81", f.toEp(syn81))
	egressSyn := packet{src: epIP, dst: ipPeer, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02}
	f.expectPass("egress SYN", f.fromEp(egressSyn))
	f.drain()
	if got := f.ctEntry(defaultDenied, uint8(in)).PeerIdentity; got != uint32(idA) {
		t.Fatalf("conntrack entry records peer identity %d, want %d", got, idA)
	}

	f.setPeerIdentity(idB)
	if got := endpointRevision(t, f.d); got != rev {
		t.Fatalf("policy revision %d after an ipcache change, want %d (unchanged)", got, rev)
	}
	for range 2 { // the flow stays refused, not only its first packet
		f.expectIdentityDrop("established flow, peer now B", f.toEp(defaultDenied), idB, 0)
	}
	ack81 := syn81
	ack81.tcpFlags = 0x10
	f.expectIdentityDrop("established flow, peer now B, denied", f.toEp(ack81), idB, 2)
	egressAck := egressSyn
	egressAck.tcpFlags = 0x10
	if ev, ok := f.dropped("egress flow to a peer now B", f.fromEp(egressAck)); ok && (ev.Reason != flow.ReasonPeerIdentityChanged || ev.DstIdentity != idB) {
		t.Errorf("egress flow to a peer now B: event %v to %d, want %v to %d", ev.Reason, ev.DstIdentity, flow.ReasonPeerIdentityChanged, idB)
	}
	// A's own flows are untouched: its entries are still there.
	f.expectPass("new flow from A", f.toEp(f.synIn(ipA, 80)))
	f.drain()

	// Back to A: the refused flow's entry kept A, so it goes on.
	f.setPeerIdentity(idA)
	f.check("established flow, peer A again", f.toEp(defaultDenied), want{pass: true, noEvent: true})

	// B allowed as well: the flow goes on as B's, and its entry says so.
	f.apply(true, true, e(allow(idA, in, tcp, 80, 16, 1)), e(allow(idB, in, tcp, 80, 16, 5)))
	flowB := f.establishTCPIn()
	f.setPeerIdentity(idB)
	f.check("established flow, peer now B, allowed", f.toEp(flowB), want{pass: true, noEvent: true})
	if got := f.ctEntry(flowB, uint8(in)).PeerIdentity; got != uint32(idB) {
		t.Errorf("conntrack entry records peer identity %d after the check, want %d", got, idB)
	}
	f.check("established flow as B, again", f.toEp(flowB), want{pass: true, noEvent: true})
	if ce, ok := cachedFlow(t, f.d, flowB, false); !ok || ce.Revision != f.revision() {
		t.Errorf("flow checked as B: cached %v at revision %d, want cached at %d", ok, ce.Revision, f.revision())
	}
}

// A packet that entered from the overlay is checked against the identity its VNI carried
// when its flow was admitted: another VNI identity (the sending node relabelled the pod)
// is checked again even though nothing changed on this node. An established flow from A
// whose packets now carry B is dropped while B is not allowed, from the flow cache too;
// once B is allowed, it passes and the entry records B.
func TestPeerIdentityChangeTunnel(t *testing.T) {
	f := newTunnelFixture(t, e(allow(idA, in, udp, 53, 16, 1)))
	remote := tunnelRemote
	gen, err := f.d.ipcacheGeneration()
	if err != nil {
		t.Fatal(err)
	}
	udpIn := packet{src: remote, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 53}
	reply := packet{src: epIP, dst: remote, proto: uint8(udp), sport: 53, dport: udpIn.sport}
	f.expectPass("first packet from A", f.runTunneled(udpIn, tunnelMark(idA), vxlanIfindex))
	f.expectPass("reply", f.fromEp(reply))
	f.expectPass("established packet from A", f.runTunneled(udpIn, tunnelMark(idA), vxlanIfindex))
	if _, ok := cachedFlow(t, f.d, udpIn, false); !ok {
		t.Fatal("the established flow is not in the flow cache")
	}
	f.expectPass("cached packet from A", f.runTunneled(udpIn, tunnelMark(idA), vxlanIfindex))
	f.drain()

	for range 2 {
		ev, ok := f.dropped("established flow, VNI now B", f.runTunneled(udpIn, tunnelMark(idB), vxlanIfindex))
		if ok && (ev.Reason != flow.ReasonPeerIdentityChanged || ev.SrcIdentity != idB || !ev.Flags.Has(flow.FlagTunnel)) {
			t.Errorf("established flow, VNI now B: event %v from %d (flags %v), want %v from %d flagged tunnel",
				ev.Reason, ev.SrcIdentity, ev.Flags, flow.ReasonPeerIdentityChanged, idB)
		}
	}
	if got, err := f.d.ipcacheGeneration(); err != nil || got != gen {
		t.Fatalf("ipcache generation %d (%v), want %d: the VNI alone must be what changed", got, err, gen)
	}
	f.check("established packet from A again", f.runTunneled(udpIn, tunnelMark(idA), vxlanIfindex), want{pass: true, noEvent: true})

	f.apply(true, false, e(allow(idA, in, udp, 53, 16, 1)), e(allow(idB, in, udp, 53, 16, 2)))
	f.check("established flow, VNI now B, allowed", f.runTunneled(udpIn, tunnelMark(idB), vxlanIfindex), want{pass: true, noEvent: true})
	if v := f.ctEntry(udpIn, uint8(in)); v.PeerIdentity != uint32(idB) || v.TunnelId != uint32(idB) {
		t.Errorf("conntrack entry records peer identity %d, VNI identity %d; want %d for both", v.PeerIdentity, v.TunnelId, idB)
	}
}

// The later fragments of a datagram follow its first fragment's verdict only from the
// identity the first fragment passed with: a later fragment whose peer has another
// identity, by its VNI or by the ipcache, is dropped.
func TestPeerIdentityChangeFragments(t *testing.T) {
	f := newTunnelFixture(t, e(allow(idA, in, udp, 53, 16, 1)), e(allow(idB, in, udp, 54, 16, 2)))
	remote := tunnelRemote
	f.setPeerIdentity(idA)
	first := func(src netip.Addr, id uint16) packet {
		return packet{src: src, dst: epIP, proto: uint8(udp), sport: 5350 + id, dport: 53, ipID: id, mf: true, payload: make([]byte, 1400)}
	}
	later := func(src netip.Addr, id uint16) packet {
		return packet{src: src, dst: epIP, proto: uint8(udp), ipID: id, fragOffset: 176, payload: make([]byte, 600)}
	}
	f.expectPass("first fragment, VNI A", f.runTunneled(first(remote, 1), tunnelMark(idA), vxlanIfindex))
	f.drain()
	f.expectPass("later fragment, VNI A", f.runTunneled(later(remote, 1), tunnelMark(idA), vxlanIfindex))
	f.expectIdentityDrop("later fragment, VNI B", f.runTunneled(later(remote, 1), tunnelMark(idB), vxlanIfindex), idB, 1)

	f.expectPass("first fragment from A by address", f.toEp(first(ipPeer, 2)))
	f.drain()
	f.setPeerIdentity(idB)
	f.expectIdentityDrop("later fragment, address now B", f.toEp(later(ipPeer, 2)), idB, 1)
	// A datagram whose first fragment passed as B: its later fragment, after an ipcache
	// change that leaves the address B's, is compared on its identity, and passes.
	f.expectPass("first fragment from B by address", f.toEp(packet{src: ipPeer, dst: epIP, proto: uint8(udp), sport: 5360, dport: 54, ipID: 3, mf: true, payload: make([]byte, 1400)}))
	f.drain()
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipPeer, 32)] = mapstate.IPCacheEntry{Identity: idB}
	ipc[netip.MustParsePrefix("198.18.9.0/24")] = mapstate.IPCacheEntry{Identity: cidrID}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	f.check("later fragment, address still B after another ipcache change", f.toEp(later(ipPeer, 3)), want{pass: true, noEvent: true})
}

// ctFSockverdict is CT_F_SOCKVERDICT (bpf/include/rampart.h).
const ctFSockverdict = 1 << 6

// A flow through the L7 proxy or the send-side verdict had its L7 decisions taken for its
// peer's identity: when the peer has another identity, which policy redirects too, the
// flow is dropped rather than handed on; a flow whose peer kept its identity goes on to
// its proxy socket (none here: the steering drop).
func TestPeerIdentityChangeSteered(t *testing.T) {
	f := newFixture(t, Config{})
	f.setPeerIdentity(idA)
	f.apply(false, true, e(redirect(idA, out, tcp, 8080, 16, 1)), e(redirect(idB, out, tcp, 8080, 16, 2)))
	// A flow as steering leaves it (BPF_PROG_RUN cannot assign sockets), admitted for peer.
	steered := func(peer identity.Identity, flags uint32) packet {
		p := f.synOut(ipPeer, tcp, 8080)
		p.tcpFlags = 0x10
		putCT(t, f.d, p, epID, out, flags)
		k, v := ct4Key(p, epID, uint8(out)), f.ctEntry(p, uint8(out))
		v.PeerIdentity = uint32(peer)
		if err := f.d.objs.Conntrack4Peer.Update(&k, &v, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fromA, fromB, svFromA := steered(idA, ctFToProxy), steered(idB, ctFToProxy), steered(idA, ctFSockverdict)
	f.setPeerIdentity(idB)
	f.check("steered flow, peer now B", f.fromEp(fromA),
		want{reason: flow.ReasonPeerIdentityChanged, rule: 2, l7Egress: true})
	f.check("send-side verdict flow, peer now B", f.fromEp(svFromA),
		want{reason: flow.ReasonPeerIdentityChanged, rule: 2, l7Egress: true})
	f.check("steered flow admitted for B", f.fromEp(fromB), want{reason: flow.ReasonProxyUnavailable})
}
