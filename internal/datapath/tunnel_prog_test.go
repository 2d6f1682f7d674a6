package datapath

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// tunnelMark is the mark rampart_from_tunnel leaves on a packet whose VNI carried id
// (bpf/include/tunnel.h): the magic 0x28 in bits 2-5, the identity's low byte in bits 6-13
// and the rest from bit 16, clear of the proxy's bits 0-1 and kube-proxy's 14-15.
func tunnelMark(id identity.Identity) uint32 { return uint32(id)&0xFF<<6 | uint32(id)>>8<<16 | 0x28 }

// kubeProxyMarks are the mark bits kube-proxy gives a meaning to (0x4000 masquerade,
// 0x8000 drop), and proxyMarks the L7 proxy's: a tunnel mark must set none of them.
const kubeProxyMarks, proxyMarks = 0xC000, ProxySteerMark | ProxyUpstreamMark

// The identity in the mark survives any value of its bits: identities whose bits 6 and 7
// are set (which a plain shift would put on kube-proxy's bits) are judged as themselves at
// the endpoint, and no identity's mark touches kube-proxy's or the proxy's bits.
func TestTunnelMarkLayout(t *testing.T) {
	for _, id := range []identity.Identity{0x40, 0x80, 0xC0, 0x65C1F9, identity.FirstCIDR - 1} {
		if m := tunnelMark(id); m&(kubeProxyMarks|proxyMarks) != 0 {
			t.Errorf("identity %#x: mark %#x sets kube-proxy's or the proxy's bits", id, m)
		}
		f := newTunnelFixture(t, e(allow(id, in, udp, 53, 16, 1)))
		p := packet{src: tunnelRemote, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 53}
		if ret := f.runTunneled(p, tunnelMark(id), vxlanIfindex); ret != actOK {
			t.Errorf("identity %#x through the tunnel mark: verdict %d, want pass", id, ret)
			continue
		}
		if ev := nextEvent(t, f.ev); ev.SrcIdentity != id {
			t.Errorf("identity %#x through the tunnel mark arrived as %#x", id, ev.SrcIdentity)
		}
		other := id ^ 0x40
		p.sport = f.port()
		f.expectDrop(fmt.Sprintf("identity %#x, with only %#x allowed", other, id), f.runTunneled(p, tunnelMark(other), vxlanIfindex), flow.ReasonPolicyDefaultDeny)
	}
}

// vxlanIfindex is the VXLAN device the tunnel tests name to the programs (tunnel_config),
// and tunnelRemote a remote pod's address, world by address in the fixture's ipcache.
const vxlanIfindex = 42

var tunnelRemote = addr("10.2.0.5")

// newTunnelFixture is a fixture whose endpoint enforces ingress with entries es, on a node
// with the VXLAN overlay on vxlanIfindex.
func newTunnelFixture(t *testing.T, es ...entry) *fixture {
	t.Helper()
	f := newFixture(t, Config{})
	f.apply(true, false, es...)
	f.setVXLAN()
	return f
}

// setVXLAN puts the fixture's node on the VXLAN overlay, on device vxlanIfindex.
func (f *fixture) setVXLAN() {
	f.t.Helper()
	if err := f.d.Tunnel.setTunnel(rampartTunnelConfig{Ifindex: vxlanIfindex}); err != nil {
		f.t.Fatal(err)
	}
}

// runTunneled runs the fixture endpoint's rampart_to_ep on p with mark and ingress
// interface iif, as forwarding from the VXLAN device delivers it.
func (f *fixture) runTunneled(p packet, mark, iif uint32) uint32 {
	f.t.Helper()
	return f.runTunneledFrame(p.bytes(), mark, iif)
}

// runTunneledFrame is runTunneled for any frame (an IPv6 one: packet6.bytes).
func (f *fixture) runTunneledFrame(frame []byte, mark, iif uint32) uint32 {
	f.t.Helper()
	c := skbContext{Mark: mark}
	c.Fields[6] = iif // ingress_ifindex
	ret, _ := runCtx(f.t, f.d.objs.RampartToEp, frame, c)
	return ret
}

// A packet that arrived through the overlay is judged on the identity its VNI carried
// (rampart_from_tunnel's mark), not on its source address, and the flow says so; the
// same mark on a packet not received on the VXLAN device (a node process's SO_MARK) or
// with the overlay off is ignored: the address decides.
func TestTunnelIdentityAtEndpoint(t *testing.T) {
	f := newTunnelFixture(t, e(allow(idA, in, udp, 53, 16, 1)))
	remote := tunnelRemote
	udpIn := func() packet {
		return packet{src: remote, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 53}
	}

	if ret := f.runTunneled(udpIn(), tunnelMark(idA), vxlanIfindex); ret != actOK {
		t.Fatalf("tunnelled packet of an allowed identity: verdict %d, want pass", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Type != flow.EventNew || ev.SrcIdentity != idA || !ev.Flags.Has(flow.FlagTunnel) || ev.Direction != policy.Ingress {
		t.Errorf("tunnelled flow event %+v, want a new flow from identity %d flagged tunnel", ev, idA)
	}
	f.expectDrop("tunnelled packet of another identity", f.runTunneled(udpIn(), tunnelMark(idB), vxlanIfindex), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("the mark on a packet the node sent itself", f.runTunneled(udpIn(), tunnelMark(idA), 0), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("the mark on a packet from another interface", f.runTunneled(udpIn(), tunnelMark(idA), 7), flow.ReasonPolicyDefaultDeny)
	if err := f.d.Tunnel.ClearTunnel(); err != nil {
		t.Fatal(err)
	}
	f.expectDrop("the mark with the overlay off", f.runTunneled(udpIn(), tunnelMark(idA), vxlanIfindex), flow.ReasonPolicyDefaultDeny)
	if got, err := f.d.Tunnel.TunnelIfindex(); err != nil || got != 0 {
		t.Errorf("tunnel ifindex after ClearTunnel: %d %v", got, err)
	}
}

// rampart_to_tunnel sends a packet into the overlay only when the ipcache names the node
// that hosts its destination; rampart_from_tunnel drops a packet without tunnel metadata
// (one that did not come out of the VXLAN receive path).
func TestTunnelPrograms(t *testing.T) {
	f := newFixture(t, Config{})
	ipc := fixtureIPCache()
	remote := addr("10.2.0.5")
	ipc[netip.PrefixFrom(remote, 32)] = mapstate.IPCacheEntry{Identity: idB, TunnelEndpoint: addr("198.19.0.2")}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	toTunnel := func(dst netip.Addr) uint32 {
		p := packet{src: epIP, dst: dst, proto: uint8(udp), sport: f.port(), dport: 53}
		return run(t, f.d.vxlanProgsT().RampartToTunnel, p.bytes(), 0)
	}
	f.expectPass("to a remote pod", toTunnel(remote))
	f.expectDrop("to an address no node hosts", toTunnel(ipOut), flow.ReasonTunnelNoEndpoint)
	// The node reached over the IPv6 fabric: the packet leaves with an IPv6 tunnel key,
	// which the kernel accepts (traffic tests see it on the fabric, test/e2e).
	setTunnelRemote6(t, f.d, map[netip.Addr]netip.Addr{addr("198.19.0.2"): tunnelNode6})
	f.expectPass("to a remote pod over the IPv6 fabric", toTunnel(remote))

	p := packet{src: remote, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectDrop("decapsulated without tunnel metadata", run(t, f.d.vxlanProgsT().RampartFromTunnel, p.bytes(), 0), flow.ReasonMalformed)
}

// The fragments of a datagram that arrived through the VXLAN overlay follow the verdict
// its first fragment got on the VNI's identity: the later fragments of an allowed one
// pass, those of a denied one are dropped with the first fragment's ports and the VNI's
// identity (not the source address's).
func TestTunnelFragments(t *testing.T) {
	f := newTunnelFixture(t, e(allow(idA, in, udp, 53, 16, 1)))
	remote := tunnelRemote
	// Each datagram from its own port: another flow, judged anew.
	first := func(id, dport uint16) packet {
		return packet{src: remote, dst: epIP, proto: uint8(udp), sport: 5350 + id, dport: dport, ipID: id, mf: true, payload: make([]byte, 1400)}
	}
	later := func(id uint16) packet {
		return packet{src: remote, dst: epIP, proto: uint8(udp), ipID: id, fragOffset: 176, payload: make([]byte, 600)}
	}
	f.expectPass("first fragment from identity A", f.runTunneled(first(1, 53), tunnelMark(idA), vxlanIfindex))
	f.expectPass("later fragment from identity A", f.runTunneled(later(1), tunnelMark(idA), vxlanIfindex))

	f.expectDrop("first fragment from identity B", f.runTunneled(first(2, 53), tunnelMark(idB), vxlanIfindex), flow.ReasonPolicyDefaultDeny)
	if ret := f.runTunneled(later(2), tunnelMark(idB), vxlanIfindex); ret != actShot {
		t.Fatalf("later fragment from identity B: verdict %d, want drop", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Reason != flow.ReasonPolicyDefaultDeny || ev.SrcIdentity != idB || !ev.Flags.Has(flow.FlagTunnel) || ev.DestinationPort != 53 || ev.SourcePort != 5352 {
		t.Errorf("later fragment from identity B: event %+v, want default deny from identity %d, flagged tunnel, with ports 5352 -> 53", ev, idB)
	}
	f.expectDrop("later fragment without its first", f.runTunneled(later(3), tunnelMark(idA), vxlanIfindex), flow.ReasonFragmentUnknown)
}

// tunnelNode6 is the IPv6 fabric address of the tunnel tests' remote node.
var tunnelNode6 = addr("2001:2:0:fa6::b")

// setTunnelRemote6 sets the nodes reached over the IPv6 fabric, and checks that the map then
// holds exactly those.
func setTunnelRemote6(t *testing.T, d *Datapath, want map[netip.Addr]netip.Addr) {
	t.Helper()
	if err := d.Tunnel.SetTunnelRemote6(want); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Tunnel.TunnelRemote6(); err != nil || !maps.Equal(got, want) {
		t.Fatalf("tunnel_remote6 after setting %v: %v (%v)", want, got, err)
	}
}

// Setting the nodes reached over the IPv6 fabric replaces them: a node no longer named is
// reached over IPv4 again; addresses of the wrong family are refused.
func TestTunnelRemote6Map(t *testing.T) {
	f := newFixture(t, Config{})
	b, c := addr("198.19.0.2"), addr("198.19.0.3")
	setTunnelRemote6(t, f.d, map[netip.Addr]netip.Addr{b: tunnelNode6, c: addr("2001:2:0:fa6::c")})
	setTunnelRemote6(t, f.d, map[netip.Addr]netip.Addr{c: addr("2001:2:0:fa6::c")})
	setTunnelRemote6(t, f.d, nil)
	for node, a6 := range map[netip.Addr]netip.Addr{tunnelNode6: tunnelNode6, b: b, c: addr("::ffff:198.19.0.3")} {
		if err := f.d.Tunnel.SetTunnelRemote6(map[netip.Addr]netip.Addr{node: a6}); err == nil {
			t.Errorf("SetTunnelRemote6(%v at %v): no error", node, a6)
		}
	}
}
