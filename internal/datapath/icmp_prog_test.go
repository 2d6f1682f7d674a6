package datapath

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// ipNode is a remote node's address in the ICMP error fixture (identity remote-node).
var ipNode = addr("198.18.200.2")

// icmpError is an ICMP error of type typ from src to dst quoting q (its IP header and first
// 8 bytes, as routers quote), followed by trailing bytes.
func icmpError(src, dst netip.Addr, typ uint8, q packet, trailing []byte) packet {
	return packet{src: src, dst: dst, proto: uint8(icmp), icmpType: typ, quoted: q.ipv4()[:28], payload: trailing}
}

// expectForeignDrop checks that ret dropped an ICMP error from src as the policy verdict of
// a packet from its sender (identity from) in direction dir.
func (f *fixture) expectForeignDrop(name string, ret uint32, src netip.Addr, from identity.Identity, dir policy.Direction) {
	f.t.Helper()
	ev, ok := f.dropped(name, ret)
	if !ok {
		return
	}
	if ev.Type != flow.EventDrop || ev.Reason != flow.ReasonPolicyDefaultDeny || ev.Protocol != icmp ||
		ev.Source != src || ev.SrcIdentity != from || ev.Direction != dir || ev.EpID != epID {
		f.t.Errorf("%s: event %+v, want the default deny of an ICMP packet from %v (identity %d), %v", name, ev, src, from, dir)
	}
}

// An ICMP error that quotes a packet of a live flow passes as related only when it
// travels between the flow's two ends (from the peer entering the endpoint, to the peer
// leaving it), or when a node sent it (this node, received from no interface; another
// node, by address or through the overlay), or, about a flow whose peer is outside the
// cluster, an address outside it too (a router on the way out). An error from anyone else (another endpoint,
// a world address, the router address received from outside) is judged by policy as a
// packet from its sender: the endpoint's policy denies it, so it is dropped with the
// policy's reason and a flow that names its sender; allowed by policy, it passes.
// Established traffic that filled the flow cache does not change this.
func TestICMPErrorSender(t *testing.T) {
	f := newFixture(t, Config{})
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipRouter, 32)] = mapstate.IPCacheEntry{Identity: identity.Host}
	ipc[netip.PrefixFrom(ipNode, 32)] = mapstate.IPCacheEntry{Identity: identity.RemoteNode}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	if err := f.d.Tunnel.setTunnel(rampartTunnelConfig{Ifindex: vxlanIfindex}); err != nil {
		t.Fatal(err)
	}
	// The endpoint talks with A only: TCP 80 and UDP 53 out, UDP 5000 in. B, world and
	// remote addresses may send it nothing.
	f.apply(true, true,
		e(allow(idA, out, tcp, 80, 16, 1)),
		e(allow(idA, out, udp, 53, 16, 2)),
		e(allow(idA, in, udp, 5000, 16, 3)),
		e(allow(identity.World, out, tcp, 443, 16, 5)),
	)
	const uplink = 99

	// A TCP flow and a UDP flow to A, with a few packets each way (the flow cache serves
	// established packets after the first).
	syn := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: f.port(), dport: 80, tcpFlags: 0x02}
	f.expectPass("SYN to A", f.fromEp(syn))
	synAck := packet{src: ipA, dst: epIP, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x12}
	f.expectPass("SYN-ACK from A", f.toEp(synAck))
	ack := syn
	ack.tcpFlags = 0x10
	replyAck := synAck
	replyAck.tcpFlags = 0x10
	for i := 0; i < 3; i++ {
		f.expectPass("ACK to A", f.fromEp(ack))
		f.expectPass("ACK from A", f.toEp(replyAck))
	}
	query := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53}
	for i := 0; i < 3; i++ {
		f.expectPass("query to A", f.fromEp(query))
	}

	for _, q := range []struct {
		name string
		pkt  packet
	}{{"TCP", ack}, {"UDP", query}} {
		unreach := func(src netip.Addr) packet { return icmpError(src, epIP, 3, q.pkt, nil) }
		fragNeeded := icmpError(ipRouter, epIP, 3, q.pkt, nil)

		f.expectPass(q.name+": port unreachable from the peer", f.toEp(unreach(ipA)))
		f.expectPass(q.name+": port unreachable from the peer, bytes after the quote",
			f.toEp(icmpError(ipA, epIP, 3, q.pkt, []byte("from the peer"))))
		f.expectPass(q.name+": fragmentation needed from this node", f.runFrom(fragNeeded, 0))
		f.expectPass(q.name+": unreachable from a remote node's address", f.toEp(unreach(ipNode)))
		f.expectPass(q.name+": unreachable from a remote node through the overlay",
			f.runTunneled(unreach(tunnelRemote), tunnelMark(identity.RemoteNode), vxlanIfindex))

		f.expectForeignDrop(q.name+": port unreachable forged by B", f.toEp(unreach(ipB)), ipB, idB, in)
		f.expectForeignDrop(q.name+": forged by B, bytes after the quote",
			f.toEp(icmpError(ipB, epIP, 3, q.pkt, []byte("smuggled"))), ipB, idB, in)
		f.expectForeignDrop(q.name+": unreachable from a world address", f.toEp(unreach(ipOut)), ipOut, identity.World, in)
		f.expectForeignDrop(q.name+": the router address received from outside",
			f.runFrom(fragNeeded, uplink), ipRouter, identity.World, in)
		f.expectForeignDrop(q.name+": forged by a pod of another node (its VNI identity)",
			f.runTunneled(unreach(tunnelRemote), tunnelMark(idB), vxlanIfindex), tunnelRemote, idB, in)

		// The flow goes on.
		f.expectPass(q.name+": the flow's next packet", f.fromEp(q.pkt))
	}

	// A flow to an address outside the cluster: a router on the way out (an address outside
	// the cluster too) may report on it, as path MTU discovery needs; a pod may not.
	out443 := packet{src: epIP, dst: ipOut, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02}
	f.expectPass("SYN to a world address", f.fromEp(out443))
	wanRouter := addr("203.0.113.1")
	f.expectPass("fragmentation needed from a router outside, about a flow outside",
		f.toEp(icmpError(wanRouter, epIP, 3, out443, nil)))
	f.expectForeignDrop("unreachable forged by B about a flow outside",
		f.toEp(icmpError(ipB, epIP, 3, out443, nil)), ipB, idB, in)

	// Errors about a flow the peer opened (quoting the endpoint's reply), and errors the
	// endpoint sends about it (quoting the peer's packet).
	dgram := packet{src: ipA, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 5000}
	f.expectPass("datagram from A", f.toEp(dgram))
	answer := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: 5000, dport: dgram.sport}
	f.expectPass("answer to A", f.fromEp(answer))
	f.expectPass("unreachable about the answer, from A", f.toEp(icmpError(ipA, epIP, 3, answer, nil)))
	f.expectForeignDrop("unreachable about the answer, forged by B", f.toEp(icmpError(ipB, epIP, 3, answer, nil)), ipB, idB, in)
	f.expectPass("the endpoint's unreachable to A", f.fromEp(icmpError(epIP, ipA, 3, dgram, nil)))
	f.expectForeignDrop("the endpoint's unreachable about A's flow, to B",
		f.fromEp(icmpError(epIP, ipB, 3, dgram, nil)), epIP, epIdent, out)

	// Judged by policy means allowed by policy too: with ICMP errors from B allowed, B's
	// error passes.
	f.apply(true, true,
		e(allow(idA, out, tcp, 80, 16, 1)),
		e(allow(idA, out, udp, 53, 16, 2)),
		e(allow(idA, in, udp, 5000, 16, 3)),
		e(allow(idB, in, icmp, 3, 16, 4)),
	)
	f.expectPass("port unreachable from B, allowed by policy", f.toEp(icmpError(ipB, epIP, 3, query, nil)))
}
