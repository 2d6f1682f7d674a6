package datapath

import (
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// tunnelRemote6 is a remote pod's IPv6 address, world by address in the fixture's ipcache
// (as tunnelRemote for IPv4).
var tunnelRemote6 = addr("2001:2:0:2::5")

// newTunnelFixture6 is newTunnelFixture with the fixture's IPv6 world and endpoint.
func newTunnelFixture6(t *testing.T, es ...entry) *fixture {
	t.Helper()
	f := newFixture6(t)
	f.apply6(true, false, es...)
	f.setVXLAN()
	return f
}

// runTunneled6 is runTunneled for an IPv6 packet.
func (f *fixture) runTunneled6(p packet6, mark, iif uint32) uint32 {
	f.t.Helper()
	return f.runTunneledFrame(p.bytes(), mark, iif)
}

// An IPv6 packet that arrived through the overlay is judged on the identity its VNI
// carried, under rampart_to_ep's conditions: received on the VXLAN device, with the overlay
// on. The same mark otherwise is ignored (the address decides), a local endpoint's address
// through the overlay is spoofed whatever the mark says, and an established flow whose
// packets start carrying another identity is checked again.
func TestTunnelIPv6IdentityAtEndpoint(t *testing.T) {
	f := newTunnelFixture6(t, e(allow(idA, in, udp, 53, 16, 1)))
	udpIn := func() packet6 {
		return packet6{src: tunnelRemote6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53}
	}

	p := udpIn()
	if ret := f.runTunneled6(p, tunnelMark(idA), vxlanIfindex); ret != actOK {
		t.Fatalf("tunnelled IPv6 packet of an allowed identity: verdict %d, want pass", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Type != flow.EventNew || ev.SrcIdentity != idA || !ev.Flags.Has(flow.FlagTunnel) ||
		ev.Direction != policy.Ingress || ev.Source != tunnelRemote6 {
		t.Errorf("tunnelled IPv6 flow event %+v, want a new flow from %v, identity %d, flagged tunnel", ev, tunnelRemote6, idA)
	}
	f.expectPass("the flow's next packet, same identity", f.runTunneled6(p, tunnelMark(idA), vxlanIfindex))
	noEvent(t, f.ev)
	// The same flow now claiming another identity: checked again, and nothing allows it.
	f.expectDrop("the flow's packet with another identity", f.runTunneled6(p, tunnelMark(idB), vxlanIfindex), flow.ReasonPeerIdentityChanged)

	f.expectDrop("tunnelled IPv6 packet of another identity", f.runTunneled6(udpIn(), tunnelMark(idB), vxlanIfindex), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("the mark on a packet the node sent itself", f.runTunneled6(udpIn(), tunnelMark(idA), 0), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("the mark on a packet from another interface", f.runTunneled6(udpIn(), tunnelMark(idA), 7), flow.ReasonPolicyDefaultDeny)

	// A local endpoint's address never arrives through the overlay: whatever identity the
	// VNI says, the packet claims the endpoint's.
	spoofed := packet6{src: epIP6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectDrop("a local endpoint's address through the overlay", f.runTunneled6(spoofed, tunnelMark(idA), vxlanIfindex), flow.ReasonSpoofedSource)

	if err := f.d.Tunnel.ClearTunnel(); err != nil {
		t.Fatal(err)
	}
	f.expectDrop("the mark with the overlay off", f.runTunneled6(udpIn(), tunnelMark(idA), vxlanIfindex), flow.ReasonPolicyDefaultDeny)
}

// rampart_to_tunnel sends an IPv6 packet into the overlay only when the ipcache names the
// node that hosts its destination (its /128 has a tunnel endpoint); rampart_from_tunnel
// drops an IPv6 packet without tunnel metadata, and one that is not a whole IPv6 packet
// never passes either way.
func TestTunnelIPv6Programs(t *testing.T) {
	f := newFixture6(t)
	ipc := fixtureIPCache6()
	ipc[netip.PrefixFrom(tunnelRemote6, 128)] = mapstate.IPCacheEntry{Identity: idB, TunnelEndpoint: addr("198.19.0.2")}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	toTunnel := func(src, dst netip.Addr) uint32 {
		p := packet6{src: src, dst: dst, proto: uint8(udp), sport: f.port(), dport: 53}
		return run(t, f.d.vxlanProgsT().RampartToTunnel, p.bytes(), 0)
	}
	f.expectPass("to a remote pod", toTunnel(epIP6, tunnelRemote6))
	setTunnelRemote6(t, f.d, map[netip.Addr]netip.Addr{addr("198.19.0.2"): tunnelNode6})
	f.expectPass("to a remote pod over the IPv6 fabric", toTunnel(epIP6, tunnelRemote6))
	setTunnelRemote6(t, f.d, nil)
	p := packet6{src: epIP6, dst: ipOut6, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectEvent6("to an address no node hosts", run(t, f.d.vxlanProgsT().RampartToTunnel, p.bytes(), 0), p,
		flow.ReasonTunnelNoEndpoint, 0, identity.World)
	f.expectDrop("to a local endpoint (no tunnel endpoint)", toTunnel(ipA6, epIP6), flow.ReasonTunnelNoEndpoint)
	bad := packet6{src: epIP6, dst: tunnelRemote6, proto: uint8(udp), sport: f.port(), dport: 53, payloadLen: 4000}
	f.expectDrop("a truncated IPv6 packet into the overlay", run(t, f.d.vxlanProgsT().RampartToTunnel, bad.bytes(), 0), flow.ReasonMalformed)

	in := packet6{src: tunnelRemote6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectDrop("decapsulated without tunnel metadata", run(t, f.d.vxlanProgsT().RampartFromTunnel, in.bytes(), 0), flow.ReasonMalformed)
}

// The later fragments of an IPv6 datagram that arrived through the overlay pass on their
// first fragment's verdict only while they carry its VNI identity: one that claims another
// identity is judged as that identity, and dropped when it is not the one the first
// fragment passed as.
func TestTunnelIPv6Fragments(t *testing.T) {
	f := newTunnelFixture6(t, e(allow(idA, in, udp, 53, 16, 1)), e(allow(idB, in, udp, 53, 16, 2)))
	first := packet6{src: tunnelRemote6, dst: epIP6, proto: uint8(udp), sport: f.port(), dport: 53,
		frag: true, fragID: 0x77, mf: true, payload: make([]byte, 16)}
	later := first
	later.fragOffset, later.mf = 3, false
	f.expectPass("first fragment from identity A", f.runTunneled6(first, tunnelMark(idA), vxlanIfindex))
	f.expectPass("later fragment from identity A", f.runTunneled6(later, tunnelMark(idA), vxlanIfindex))
	f.expectDrop("later fragment claiming identity B", f.runTunneled6(later, tunnelMark(idB), vxlanIfindex), flow.ReasonPeerIdentityChanged)
}
