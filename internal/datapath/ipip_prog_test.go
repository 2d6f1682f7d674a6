package datapath

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// runOut runs a tc program on data (received on loopback) and returns its verdict and the
// packet as the program left it.
func runOut(t *testing.T, prog *ebpf.Program, data []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(data)+64)
	opts := &ebpf.RunOptions{Data: data, DataOut: out, Context: skbContext{}, ContextOut: make([]byte, 256)}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// ipipFrame is data's Ethernet header, an outer IPv4 header (protocol 4) from src to dst
// and data's IP datagram.
func ipipFrame(data []byte, src, dst netip.Addr) []byte {
	inner := data[14:]
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(inner)))
	h[8], h[9] = 64, 4
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	out := append(append(append([]byte(nil), data[:14]...), h...), inner...)
	return out
}

// rampart_to_ipip puts a packet to a remote pod in an outer header from this node to the
// pod's node (later fragments too: no port is needed); other packets leave unchanged.
// rampart_from_ipip opens what a known node sent to this node's address, and drops what
// anyone else sent (a pod's own IP-in-IP packet claiming another pod's address) and a
// node's packet from an address that is not its pods'.
func TestIPIPPrograms(t *testing.T) {
	f := newFixture(t, Config{})
	local, nodeB, nodeC := addr("198.19.0.1"), addr("198.19.0.2"), addr("198.19.0.3")
	remote, remoteC := addr("10.2.0.5"), addr("10.3.0.5")
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(remote, 32)] = mapstate.IPCacheEntry{Identity: idB, TunnelEndpoint: nodeB}
	ipc[netip.PrefixFrom(remoteC, 32)] = mapstate.IPCacheEntry{Identity: idA, TunnelEndpoint: nodeC}
	ipc[netip.PrefixFrom(nodeB, 32)] = mapstate.IPCacheEntry{Identity: identity.RemoteNode}
	ipc[netip.PrefixFrom(nodeC, 32)] = mapstate.IPCacheEntry{Identity: identity.RemoteNode}
	if err := f.d.IPCache.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	f.apply(false, false)
	toRemote := packet{src: epIP, dst: remote, proto: uint8(udp), sport: f.port(), dport: 53, payload: []byte("hello")}

	// Attached but without the node's address: a remote pod's packet never leaves bare.
	ret, _ := runOut(t, f.d.ipipProgsT().RampartToIpip, toRemote.bytes())
	f.expectDrop("to a remote pod without the node's address", ret, flow.ReasonTunnelNoEndpoint)

	l4 := local.As4()
	if err := f.d.Tunnel.setTunnel(rampartTunnelConfig{IpipLocal: binary.NativeEndian.Uint32(l4[:])}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		p     packet
		reply packet // from the remote pod to the endpoint
	}{
		{"to a remote pod", toRemote, packet{src: remote, dst: epIP, proto: uint8(udp), sport: 53, dport: toRemote.sport, payload: []byte("hi")}},
		{"a later fragment to a remote pod", packet{src: epIP, dst: remote, proto: uint8(udp), ipID: 7, fragOffset: 185, payload: make([]byte, 100)},
			packet{src: remote, dst: epIP, proto: uint8(udp), ipID: 8, fragOffset: 185, payload: make([]byte, 100)}},
	} {
		ret, out := runOut(t, f.d.ipipProgsT().RampartToIpip, tc.p.bytes())
		want := ipipFrame(tc.p.bytes(), local, nodeB)
		binary.BigEndian.PutUint16(want[14+4:], tc.p.ipID) // the outer id is the inner one
		binary.BigEndian.PutUint16(want[14+10:], checksum(0, want[14:34]))
		if ret != actOK || !bytes.Equal(out, want) {
			t.Errorf("%s: verdict %d, packet\n% x\nwant\n% x", tc.name, ret, out, want)
		}
		// What node B sends back is opened.
		ret, back := runOut(t, f.d.ipipProgsT().RampartFromIpip, ipipFrame(tc.reply.bytes(), nodeB, local))
		if ret != actOK || !bytes.Equal(back, tc.reply.bytes()) {
			t.Errorf("%s: decapsulated reply: verdict %d, packet\n% x\nwant\n% x", tc.name, ret, back, tc.reply.bytes())
		}
	}
	f.drain()
	for _, p := range []packet{
		{src: epIP, dst: ipOut, proto: uint8(udp), sport: 1, dport: 53},
		{ethType: 0x0806, payload: make([]byte, 28)},
	} {
		ret, out := runOut(t, f.d.ipipProgsT().RampartToIpip, p.bytes())
		if ret != actOK || !bytes.Equal(out, p.bytes()) {
			t.Errorf("packet not to a remote pod: verdict %d, changed %v", ret, !bytes.Equal(out, p.bytes()))
		}
	}

	fromRemote := packet{src: remote, dst: epIP, proto: uint8(udp), sport: 4000, dport: 53}
	// Not addressed to this node: passes untouched (the node routes it as any packet).
	other := ipipFrame(fromRemote.bytes(), nodeB, addr("198.19.0.9"))
	if ret, out := runOut(t, f.d.ipipProgsT().RampartFromIpip, other); ret != actOK || !bytes.Equal(out, other) {
		t.Errorf("IP-in-IP packet to another address: verdict %d, changed %v", ret, !bytes.Equal(out, other))
	}
	// A pod (not a node) sends its own IP-in-IP packet claiming a remote pod's address.
	ret, _ = runOut(t, f.d.ipipProgsT().RampartFromIpip, ipipFrame(fromRemote.bytes(), ipA, local))
	if ret != actShot {
		t.Fatalf("IP-in-IP packet from a pod: verdict %d, want drop", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Reason != flow.ReasonTunnelUntrustedSource || ev.SrcIdentity != idB || ev.Source != remote || ev.DestinationPort != 53 {
		t.Errorf("IP-in-IP packet from a pod: event %+v, want tunnel-untrusted-source for the inner packet claiming identity %d", ev, idB)
	}
	// Node B sends a packet of node C's pod, or of a pod of this node.
	fromC := packet{src: remoteC, dst: epIP, proto: uint8(udp), sport: 4000, dport: 53}
	ret, _ = runOut(t, f.d.ipipProgsT().RampartFromIpip, ipipFrame(fromC.bytes(), nodeB, local))
	f.expectDrop("node B sending for node C's pod", ret, flow.ReasonSpoofedSource)
	fromLocal := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: 4000, dport: 53}
	ret, _ = runOut(t, f.d.ipipProgsT().RampartFromIpip, ipipFrame(fromLocal.bytes(), nodeB, local))
	f.expectDrop("node B sending for a local endpoint", ret, flow.ReasonSpoofedSource)
	// A truncated inner packet from a node.
	trunc := ipipFrame(fromRemote.bytes(), nodeB, local)
	trunc = trunc[:len(trunc)-4]
	binary.BigEndian.PutUint16(trunc[14+2:], uint16(len(trunc)-14))
	ret, _ = runOut(t, f.d.ipipProgsT().RampartFromIpip, trunc)
	f.expectDrop("truncated inner packet", ret, flow.ReasonMalformed)

	// Cleared: nothing is opened any more (the kernel, which has no IP-in-IP handler
	// here, drops it).
	if err := f.d.Tunnel.ClearTunnel(); err != nil {
		t.Fatal(err)
	}
	in := ipipFrame(fromRemote.bytes(), nodeB, local)
	if ret, out := runOut(t, f.d.ipipProgsT().RampartFromIpip, in); ret != actOK || !bytes.Equal(out, in) {
		t.Errorf("IP-in-IP packet with the overlay off: verdict %d, changed %v", ret, !bytes.Equal(out, in))
	}
}

// AttachIPIP puts the programs on the fabric interfaces it is given and takes them off
// those it no longer is; StopIPIP takes them off everywhere and forgets the node address.
// Someone else's filter on a fabric interface stays.
func TestIPIPAttach(t *testing.T) {
	testenv.RequireRoot(t)
	d := openTest(t, Config{})
	ns := testenv.NewNetns(t, "rpip-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	for _, pair := range [][2]string{{"fab0", "peer0"}, {"fab1", "peer1"}} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pair[0]}, PeerName: pair[1]}); err != nil {
			t.Fatal(err)
		}
	}
	filters := func(name string) []string { return testenv.BPFFilterNames(t, h, name) }
	// Someone else's program on fab1's ingress, at the endpoints' priority.
	fab1, _ := h.LinkByName("fab1")
	if err := h.QdiscAdd(clsact(fab1.Attrs().Index)); err != nil {
		t.Fatal(err)
	}
	if err := h.FilterAdd(bpfFilter(fab1.Attrs().Index, netlink.HANDLE_MIN_INGRESS, "theirs", d.objs.RampartToEp)); err != nil {
		t.Fatal(err)
	}
	ours := []string{filterFromIPIP, filterToIPIP}
	local := addr("198.19.0.1")
	if err := d.Tunnel.AttachIPIP(ns, local, []string{"fab0", "fab1"}); err != nil {
		t.Fatal(err)
	}
	if got := filters("fab0"); !slices.Equal(got, ours) {
		t.Errorf("fab0: filters %v, want %v", got, ours)
	}
	if got, want := filters("fab1"), []string{filterFromIPIP, filterToIPIP, "theirs"}; !slices.Equal(got, want) {
		t.Errorf("fab1: filters %v, want %v", got, want)
	}
	var cfg rampartTunnelConfig
	if err := d.objs.Tunnel.Lookup(uint32(0), &cfg); err != nil || cfg.IpipLocal != binary.NativeEndian.Uint32(local.AsSlice()) || cfg.Ifindex != 0 {
		t.Errorf("tunnel map %+v (%v), want the node address and no VXLAN device", cfg, err)
	}
	if err := d.Tunnel.AttachIPIP(ns, local, []string{"fab1"}); err != nil {
		t.Fatal(err)
	}
	if got := filters("fab0"); len(got) != 0 {
		t.Errorf("fab0 after it left the fabric: filters %v", got)
	}
	if err := d.Tunnel.StopIPIP(ns); err != nil {
		t.Fatal(err)
	}
	if got, want := filters("fab1"), []string{"theirs"}; !slices.Equal(got, want) {
		t.Errorf("fab1 after StopIPIP: filters %v, want %v", got, want)
	}
	if err := d.objs.Tunnel.Lookup(uint32(0), &cfg); err != nil || cfg != (rampartTunnelConfig{}) {
		t.Errorf("tunnel map after StopIPIP %+v (%v), want empty", cfg, err)
	}
}
