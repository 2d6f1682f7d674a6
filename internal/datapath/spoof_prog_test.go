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

// ipRouter is the fixture's router address, which carries the host identity.
var ipRouter = addr("198.18.0.1")

// arpFrame is an Ethernet/IPv4 ARP frame (op 1 request, 2 reply) from sender to target.
func arpFrame(op uint16, sender, target netip.Addr) packet {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(b[2:], 0x0800) // IPv4
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], op)
	copy(b[8:], []byte{0x02, 0, 0, 0, 0, 2})
	s, t := sender.As4(), target.As4()
	copy(b[14:], s[:])
	copy(b[24:], t[:])
	return packet{ethType: 0x0806, payload: b}
}

// expectSpoofed checks that ret dropped the packet as spoofed-source at the fixture
// endpoint's egress, reported as the fixture endpoint's (its ep_id and identity as sender,
// however the packet's source address resolves) with source src.
func (f *fixture) expectSpoofed(name string, ret uint32, src netip.Addr, arp bool) {
	f.t.Helper()
	ev, ok := f.dropped(name, ret)
	if !ok {
		return
	}
	if ev.Type != flow.EventDrop || ev.Reason != flow.ReasonSpoofedSource || ev.EpID != epID ||
		ev.SrcIdentity != epIdent || ev.Direction != policy.Egress || ev.Source != src || ev.Flags.Has(flow.FlagARP) != arp {
		f.t.Errorf("%s: event %+v, want a spoofed-source drop of endpoint %d (identity %d) from %v",
			name, ev, epID, epIdent, src)
	}
}

// A packet or ARP frame leaving an endpoint with another source address than the
// endpoint's own is dropped (spoofed-source), whatever its flow, and counted and reported
// as the sending endpoint's; its own address passes.
func TestSpoofedSource(t *testing.T) {
	f := newFixture(t, Config{})
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipRouter, 32)] = mapstate.IPCacheEntry{Identity: identity.Host}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	// Egress unenforced: only the source check can drop.
	f.apply(true, false, e(allow(idA, in, tcp, 80, 16, 1)))
	before, err := f.d.Endpoints.drops(epID)
	if err != nil {
		t.Fatal(err)
	}

	own := packet{src: epIP, dst: ipB, proto: uint8(tcp), sport: f.port(), dport: 80, tcpFlags: 0x02}
	f.expectPass("own address", f.fromEp(own))

	forged := packet{src: ipA, dst: ipB, proto: uint8(tcp), sport: f.port(), dport: 80, tcpFlags: 0x02}
	f.expectSpoofed("TCP SYN from another endpoint's address", f.fromEp(forged), ipA, false)
	f.expectSpoofed("UDP from another endpoint's address",
		f.fromEp(packet{src: ipA, dst: ipB, proto: uint8(udp), sport: f.port(), dport: 53}), ipA, false)
	f.expectSpoofed("ICMP from the router (host) address",
		f.fromEp(packet{src: ipRouter, dst: ipB, proto: uint8(icmp), icmpType: 8, icmpID: 7}), ipRouter, false)
	f.expectSpoofed("from a world address", f.fromEp(packet{src: ipOut, dst: ipB, proto: uint8(udp), sport: 1, dport: 2}), ipOut, false)
	f.expectSpoofed("later fragment", f.fromEp(packet{src: ipA, dst: ipB, proto: uint8(udp), fragOffset: 100, ipID: 9}), ipA, false)

	// A forged packet that matches an established flow of the address it claims (as if the
	// endpoint owned that address) is still dropped: the check comes before conntrack.
	est := forged
	est.tcpFlags = 0x10
	k := ct4Key(est, epID, uint8(policy.Egress))
	now, err := jiffiesNow()
	if err != nil {
		t.Fatal(err)
	}
	v := rampartCtValue{Created: now, LastSeen: now, Flags: ctFSeenReply, Direction: uint8(policy.Egress),
		Revision: f.d.endpoints[epIfindex].Revision}
	if err := f.d.objs.Conntrack4Peer.Update(&k, &v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	for range 2 { // twice: the second would be a flow cache hit if the first filled it
		f.expectSpoofed("forged packet of an established flow", f.fromEp(est), ipA, false)
	}
	own.tcpFlags = 0x10
	f.expectPass("own established flow", f.fromEp(own))

	// ARP: the sender address must be the endpoint's; a probe (RFC 5227: request from
	// 0.0.0.0) claims nothing and passes.
	f.expectPass("ARP request from own address", f.fromEp(arpFrame(1, epIP, ipRouter)))
	f.expectPass("ARP reply from own address", f.fromEp(arpFrame(2, epIP, ipRouter)))
	f.expectPass("ARP probe", f.fromEp(arpFrame(1, netip.IPv4Unspecified(), epIP)))
	f.expectSpoofed("ARP request from another endpoint's address", f.fromEp(arpFrame(1, ipA, ipRouter)), ipA, true)
	f.expectSpoofed("ARP reply from another endpoint's address", f.fromEp(arpFrame(2, ipA, ipRouter)), ipA, true)
	f.expectSpoofed("gratuitous ARP for the router address", f.fromEp(arpFrame(1, ipRouter, ipRouter)), ipRouter, true)
	f.expectSpoofed("ARP reply from 0.0.0.0", f.fromEp(arpFrame(2, netip.IPv4Unspecified(), ipRouter)), netip.IPv4Unspecified(), true)
	short := arpFrame(1, epIP, ipRouter)
	short.payload = short.payload[:20]
	f.expectDrop("truncated ARP", f.fromEp(short), flow.ReasonMalformed)
	other := arpFrame(1, epIP, ipRouter)
	other.payload[5] = 16 // protocol address length of IPv6
	f.expectDrop("ARP of another address size", f.fromEp(other), flow.ReasonMalformed)
	// Towards the endpoint, the node's ARP passes (only senders are checked).
	f.expectPass("ARP from the node", f.toEp(arpFrame(1, ipRouter, epIP)))

	after, err := f.d.Endpoints.drops(epID)
	if err != nil {
		t.Fatal(err)
	}
	// 11 spoofed (5 packets, 2 of the established flow, 4 ARP frames) and 2 malformed.
	if got := after.egress - before.egress; got != 13 {
		t.Errorf("egress drops counted: %d, want 13", got)
	}
}

// runFrom runs the fixture endpoint's rampart_to_ep on p as if the node had received it on
// interface iif (skb->ingress_ifindex; 0: sent by the node itself).
func (f *fixture) runFrom(p packet, iif uint32) uint32 {
	f.t.Helper()
	c := skbContext{}
	c.Fields[6] = iif // ingress_ifindex
	ret, _ := runCtx(f.t, f.d.objs.RampartToEp, p.bytes(), c)
	return ret
}

// A new flow into an endpoint whose source is a local endpoint's address must have come
// from that endpoint's interface (or from the node itself), and a source with the host
// identity must come from the node itself: anything else is not what its address claims.
func TestIngressSourceOrigin(t *testing.T) {
	f := newFixture(t, Config{})
	const aIfindex, aEpID, uplink = 2, 8, 99
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipA, 32)] = mapstate.IPCacheEntry{Identity: idA, EndpointID: aEpID}
	ipc[netip.PrefixFrom(ipRouter, 32)] = mapstate.IPCacheEntry{Identity: identity.Host}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	if err := f.d.Endpoints.ApplyEndpoint(aIfindex, EndpointInfo{EpID: aEpID, Identity: idA, Addr: ipA}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	f.apply(true, false, e(allow(idA, in, tcp, 80, 16, 1)), e(allow(identity.Host, in, policy.ProtoAny, 0, 0, 2)))

	f.expectPass("from A's interface", f.runFrom(f.synIn(ipA, 80), aIfindex))
	f.expectPass("A's address sent by the node", f.runFrom(f.synIn(ipA, 80), 0))
	ret := f.runFrom(f.synIn(ipA, 80), uplink)
	if ret != actShot {
		t.Fatalf("A's address from another interface: verdict %d, want drop", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Reason != flow.ReasonSpoofedSource || ev.EpID != epID || ev.Direction != policy.Ingress ||
		ev.SrcIdentity != identity.World || ev.Source != ipA {
		t.Errorf("A's address from another interface: event %+v", ev)
	}
	// From the fixture endpoint's own interface (it would have been dropped there).
	ret = f.runFrom(f.synIn(ipA, 80), epIfindex)
	if ret != actShot {
		t.Fatalf("A's address from the endpoint's own interface: verdict %d, want drop", ret)
	}
	if ev := nextEvent(t, f.ev); ev.Reason != flow.ReasonSpoofedSource || ev.SrcIdentity != epIdent {
		t.Errorf("A's address from the endpoint's own interface: event %+v", ev)
	}

	// An established flow checked again after a policy change is judged by where its
	// packet came from too.
	syn := f.synIn(ipA, 80)
	f.expectPass("flow from A's interface", f.runFrom(syn, aIfindex))
	f.apply(true, false, e(allow(idA, in, tcp, 80, 16, 1)), e(allow(identity.Host, in, policy.ProtoAny, 0, 0, 2)),
		e(allow(idB, in, tcp, 81, 16, 3)))
	ack := syn
	ack.tcpFlags = 0x10
	ret = f.runFrom(ack, uplink)
	if ret != actShot {
		t.Fatalf("A's established flow from another interface after a policy change: verdict %d, want drop", ret)
	}
	if ev := nextEvent(t, f.ev); ev.Reason != flow.ReasonSpoofedSource || ev.SrcIdentity != identity.World {
		t.Errorf("A's established flow from another interface: event %+v", ev)
	}
	f.expectPass("A's established flow from its interface", f.runFrom(ack, aIfindex))

	f.expectPass("host, sent by the node", f.runFrom(f.synIn(ipRouter, 22), 0))
	ret = f.runFrom(f.synIn(ipRouter, 22), uplink)
	if ret != actShot {
		t.Fatalf("router address received from outside: verdict %d, want drop", ret)
	}
	if ev := nextEvent(t, f.ev); ev.Reason != flow.ReasonPolicyDefaultDeny || ev.SrcIdentity != identity.World {
		t.Errorf("router address received from outside: event %+v, want the default deny of world", ev)
	}
}
