package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

func TestFlowCacheSlotOffset(t *testing.T) {
	for _, c := range []struct{ header, entry, want uint32 }{
		{312, flowCacheEntryBytes, 8}, // this kernel's struct bpf_array: slots start 56 bytes into a line
		{256, flowCacheEntryBytes, 0},
		{272, flowCacheEntryBytes, 0},  // 16 into a line: the entry ends at 48
		{288, flowCacheEntryBytes, 0},  // 32: ends at 64
		{296, flowCacheEntryBytes, 24}, // 40: moved to the next line
		{289, flowCacheEntryBytes, 31},
		{312, flowCache6EntryBytes, 8},
		{256, flowCache6EntryBytes, 0},
		{264, flowCache6EntryBytes, 0},  // 8 into a line: ends at 64
		{272, flowCache6EntryBytes, 48}, // 16: moved to the next line, 104 of a 128-byte slot
	} {
		got := flowCacheSlotOffset(c.header, c.entry)
		if got != c.want {
			t.Errorf("header %d, entry %d: offset %d, want %d", c.header, c.entry, got, c.want)
		}
		if start := (c.header + got) % cacheLineBytes; start+c.entry > cacheLineBytes {
			t.Errorf("header %d, entry %d: entry at %d crosses a line", c.header, c.entry, start)
		}
	}
}

// cachedFlows returns the flow cache's occupied entries.
func cachedFlows(t *testing.T, d *Datapath) []rampartFlowCacheEntry {
	t.Helper()
	var off uint32
	if err := d.objs.FlowCacheOffset.Get(&off); err != nil {
		t.Fatal(err)
	}
	var (
		k   uint32
		v   rampartFlowCacheSlot
		out []rampartFlowCacheEntry
	)
	it := d.objs.FlowCache.Iterate()
	for it.Next(&k, &v) {
		var e rampartFlowCacheEntry
		if err := binary.Read(bytes.NewReader(v.Bytes[off:]), binary.LittleEndian, &e); err != nil {
			t.Fatal(err)
		}
		if e.Ifindex != 0 {
			out = append(out, e)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// cachedFlow returns the cache entry of the flow of p as seen leaving (out) or entering
// the fixture's endpoint, if any.
func cachedFlow(t *testing.T, d *Datapath, p packet, leaving bool) (rampartFlowCacheEntry, bool) {
	t.Helper()
	l, r, lp, rp := p.src, p.dst, p.sport, p.dport
	if !leaving {
		l, r, lp, rp = p.dst, p.src, p.dport, p.sport
	}
	be32 := func(a netip.Addr) uint32 { b := a.As4(); return binary.LittleEndian.Uint32(b[:]) }
	be16 := func(v uint16) uint16 { return v<<8 | v>>8 }
	for _, e := range cachedFlows(t, d) {
		if e.Ifindex == epIfindex && e.Laddr == be32(l) && e.Raddr == be32(r) &&
			e.Lport == be16(lp) && e.Rport == be16(rp) && e.ProtoTunnel&0xff == uint32(p.proto) {
			return e, true
		}
	}
	return rampartFlowCacheEntry{}, false
}

// revision is the check revision of the fixture's endpoint: its policy revision plus the
// ipcache generation (bpf/include/conntrack.h).
func (f *fixture) revision() uint32 {
	f.t.Helper()
	info, ok := f.d.endpoints[epIfindex]
	if !ok {
		f.t.Fatal("no endpoint on the fixture's interface")
	}
	gen, err := f.d.ipcacheGeneration()
	if err != nil {
		f.t.Fatal(err)
	}
	return info.Revision + gen
}

// A flow's packets are served from the cache once conntrack has seen its reply, for at
// most a window after conntrack last confirmed it: with its conntrack entry gone, a reply
// still passes within the window (and does not recreate the entry), and is checked
// against conntrack (a new flow, refused by ingress policy) after it.
func TestFlowCacheServesEstablishedFlows(t *testing.T) {
	// Timeouts of 16 s and more: a window of one second (the most it can be).
	f := newFixture(t, Config{CTTimeouts: CTTimeouts{Other: 16 * time.Second, TCPClosing: 16 * time.Second}})
	tick, err := kernelTick()
	if err != nil {
		t.Fatal(err)
	}
	var window uint32
	if err := f.d.objs.FlowCacheWindow.Get(&window); err != nil {
		t.Fatal(err)
	}
	if want := uint32(toJiffies(time.Second, tick)); window != want {
		t.Fatalf("window %d jiffies, want %d (one second)", window, want)
	}

	f.apply(true, true, e(allow(idA, out, udp, 53, 16, 1)))
	q := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53}
	a := packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 53, dport: q.sport}
	f.expectPass("query", f.fromEp(q))
	if _, ok := cachedFlow(t, f.d, q, true); ok {
		t.Fatal("a flow without a reply was cached")
	}
	f.expectPass("answer", f.toEp(a))
	ce, ok := cachedFlow(t, f.d, q, true)
	if !ok {
		t.Fatal("the answered flow was not cached")
	}
	if ce.Revision != f.revision() {
		t.Errorf("cached at revision %d, want the endpoint's check revision %d", ce.Revision, f.revision())
	}

	k := ct4Key(q, epID, uint8(out))
	if err := f.d.objs.Conntrack4Peer.Delete(&k); err != nil {
		t.Fatal(err)
	}
	f.expectPass("answer served from the cache", f.toEp(a))
	var v rampartCtValue
	if err := f.d.objs.Conntrack4Peer.Lookup(&k, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("conntrack entry after a cache hit: %v, want none", err)
	}

	// After the window the answer goes to conntrack, which no longer has the flow.
	waitWindow(t, ce.Synced, window)
	f.expectDrop("answer after the window, flow gone from conntrack", f.toEp(a), flow.ReasonPolicyDefaultDeny)
}

// waitWindow returns once the flow cache window of window jiffies has passed since the
// jiffy synced.
func waitWindow(t *testing.T, synced, window uint32) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		now, err := jiffiesNow()
		if err != nil {
			t.Fatal(err)
		}
		if uint32(now)-synced > window {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the window did not pass in 5 s")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the kernel's tick, not for a result
	}
}

// A policy change reaches a cached flow on its next packet: the entry carries the revision
// it was checked against.
func TestFlowCachePolicyChange(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true, e(allow(idA, in, tcp, 80, 16, 1)))
	syn := f.synIn(ipA, 80)
	ack := syn
	ack.tcpFlags = 0x10
	synAck := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x12}
	f.expectPass("syn", f.toEp(syn))
	f.expectPass("syn-ack", f.fromEp(synAck))
	if _, ok := cachedFlow(t, f.d, syn, false); ok {
		t.Fatal("cached on a SYN")
	}
	f.expectPass("ack", f.toEp(ack))
	if _, ok := cachedFlow(t, f.d, syn, false); !ok {
		t.Fatal("the established connection was not cached")
	}
	f.expectPass("data, from the cache", f.toEp(ack))

	f.apply(true, true, e(deny(idA, in, tcp, 80, 16, 2)))
	f.expectDrop("data after a deny", f.toEp(ack), flow.ReasonPolicyDeny)
	f.expectDrop("data after a deny, again", f.toEp(ack), flow.ReasonPolicyDeny)
}

// An RST clears its flow's slot, and a SYN reusing the tuple is checked against policy.
func TestFlowCacheForgetsClosingFlows(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true, e(allow(idA, out, tcp, 443, 16, 1)))
	syn := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02}
	synAck := packet{src: ipA, dst: epIP, proto: uint8(tcp), sport: 443, dport: syn.sport, tcpFlags: 0x12}
	ack := syn
	ack.tcpFlags = 0x10
	f.expectPass("syn", f.fromEp(syn))
	f.expectPass("syn-ack", f.toEp(synAck))
	f.expectPass("ack", f.fromEp(ack))
	if _, ok := cachedFlow(t, f.d, syn, true); !ok {
		t.Fatal("the established connection was not cached")
	}
	rst := ack
	rst.tcpFlags = 0x04
	f.expectPass("rst", f.fromEp(rst))
	if _, ok := cachedFlow(t, f.d, syn, true); ok {
		t.Error("the reset connection is still cached")
	}
	// The endpoint reusing the tuple opens a new connection, checked again: now refused.
	f.apply(true, true)
	f.expectDrop("syn reusing the tuple", f.fromEp(syn), flow.ReasonPolicyDefaultDeny)
}

// An endpoint removed and installed again on the same interface, with the same id, gets
// a revision never handed out before: the flows cached for the one before do not pass.
func TestFlowCacheEndpointReinstalled(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true, e(allow(idA, out, udp, 53, 16, 1)))
	q := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53}
	a := packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 53, dport: q.sport}
	f.expectPass("query", f.fromEp(q))
	f.expectPass("answer", f.toEp(a))
	ce, ok := cachedFlow(t, f.d, q, true)
	if !ok {
		t.Fatal("the answered flow was not cached")
	}
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, epID); err != nil {
		t.Fatal(err)
	}
	f.apply(true, true)
	if rev := f.revision(); rev <= ce.Revision {
		t.Errorf("reinstalled at revision %d, not above the cached %d", rev, ce.Revision)
	}
	f.expectDrop("answer to the removed endpoint's flow", f.toEp(a), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("query of the removed endpoint's flow", f.fromEp(q), flow.ReasonPolicyDefaultDeny)
}

// A restarted agent hands out revisions above those pinned.
func TestRevisionsContinueAcrossOpen(t *testing.T) {
	testenv.RequireRoot(t)
	pins := newPinDir(t)
	d, err := Open(Config{PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent + identity.Identity(i), Addr: epIP}, mapstate.EndpointPolicy{}); err != nil {
			d.Close()
			t.Fatal(err)
		}
	}
	last := d.endpoints[epIfindex].Revision
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2 := openTest(t, Config{PinDir: pins})
	if err := d2.Endpoints.ApplyEndpoint(epIfindex+1, EndpointInfo{EpID: epID + 1, Identity: epIdent, Addr: ipA}, mapstate.EndpointPolicy{}); err != nil {
		t.Fatal(err)
	}
	if rev := d2.endpoints[epIfindex+1].Revision; rev <= last {
		t.Errorf("after reopening: revision %d, not above %d", rev, last)
	}
}

// cachedFlow6 returns the IPv6 flow cache's entry of the flow of p as seen leaving
// (leaving) or entering the fixture's endpoint, if any.
func cachedFlow6(t *testing.T, d *Datapath, p packet6, leaving bool) (rampartFlowCache6Entry, bool) {
	t.Helper()
	var off uint32
	if err := d.objs.FlowCache6Offset.Get(&off); err != nil {
		t.Fatal(err)
	}
	l, r, lp, rp := p.src.As16(), p.dst.As16(), p.sport, p.dport
	if !leaving {
		l, r, lp, rp = r, l, rp, lp
	}
	be16 := func(v uint16) uint16 { return v<<8 | v>>8 }
	var (
		k uint32
		v rampartFlowCache6Slot
	)
	it := d.objs.FlowCache6.Iterate()
	for it.Next(&k, &v) {
		var e rampartFlowCache6Entry
		if err := binary.Read(bytes.NewReader(v.Bytes[off:]), binary.LittleEndian, &e); err != nil {
			t.Fatal(err)
		}
		if e.Ifindex == epIfindex && e.Laddr == l && e.Raddr == r && e.Lport == be16(lp) &&
			e.Rport == be16(rp) && e.ProtoTunnel&0xff == uint32(p.proto) {
			return e, true
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return rampartFlowCache6Entry{}, false
}

// ct6Key is the conntrack6 key of p's flow at endpoint ep in direction dir.
func ct6Key(p packet6, ep uint32, dir uint8) rampartCt6Key {
	l, r, lp, rp := p.src.As16(), p.dst.As16(), htons(p.sport), htons(p.dport)
	if dir != uint8(policy.Egress) {
		l, r, lp, rp = r, l, rp, lp
	}
	return rampartCt6Key{Laddr: l, Raddr: r, Lport: lp, Rport: rp, EpId: ep, Protocol: p.proto}
}

// IPv6 flows are served from their own cache as IPv4's are: once answered, within a
// window of conntrack's last confirmation (a reply passes with its conntrack6 entry gone,
// and is refused as a new flow after the window); a policy change reaches a cached flow on
// its next packet; an RST clears the slot.
func TestFlowCacheIPv6(t *testing.T) {
	f := newFixture(t, Config{CTTimeouts: CTTimeouts{Other: 16 * time.Second, TCPClosing: 16 * time.Second}})
	if err := f.d.IPCache.ApplyIPCache(fixtureIPCache6()); err != nil {
		t.Fatal(err)
	}
	var window uint32
	if err := f.d.objs.FlowCacheWindow.Get(&window); err != nil {
		t.Fatal(err)
	}

	f.apply6(true, true, e(allow(idA, out, udp, 53, 16, 1)), e(allow(idA, in, tcp, 80, 16, 2)))
	q := packet6{src: epIP6, dst: ipA6, proto: uint8(udp), sport: f.port(), dport: 53}
	a := packet6{src: ipA6, dst: epIP6, proto: uint8(udp), sport: 53, dport: q.sport}
	f.expectPass("query", f.fromEp6(q))
	if _, ok := cachedFlow6(t, f.d, q, true); ok {
		t.Fatal("a flow without a reply was cached")
	}
	f.expectPass("answer", f.toEp6(a))
	ce, ok := cachedFlow6(t, f.d, q, true)
	if !ok {
		t.Fatal("the answered flow was not cached")
	}
	if ce.Revision != f.revision() {
		t.Errorf("cached at revision %d, want the endpoint's check revision %d", ce.Revision, f.revision())
	}
	if _, ok := cachedFlow(t, f.d, packet{src: epIP, dst: ipA, proto: uint8(udp), sport: q.sport, dport: 53}, true); ok {
		t.Error("an IPv6 flow landed in the IPv4 cache")
	}
	k := ct6Key(q, epID, uint8(out))
	if err := f.d.objs.Conntrack6.Delete(&k); err != nil {
		t.Fatal(err)
	}
	f.expectPass("answer served from the cache", f.toEp6(a))
	var v rampartCtValue
	if err := f.d.objs.Conntrack6.Lookup(&k, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("conntrack6 entry after a cache hit: %v, want none", err)
	}

	// TCP in: cached once established; a deny reaches it; an RST clears the slot.
	syn := f.syn6(ipA6, 80)
	synAck := packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x12}
	ack := syn
	ack.tcpFlags = 0x10
	f.expectPass("syn", f.toEp6(syn))
	f.expectPass("syn-ack", f.fromEp6(synAck))
	if _, ok := cachedFlow6(t, f.d, syn, false); ok {
		t.Fatal("cached on a SYN")
	}
	f.expectPass("ack", f.toEp6(ack))
	if _, ok := cachedFlow6(t, f.d, syn, false); !ok {
		t.Fatal("the established connection was not cached")
	}
	rst := ack
	rst.tcpFlags = 0x04
	f.expectPass("rst", f.toEp6(rst))
	if _, ok := cachedFlow6(t, f.d, syn, false); ok {
		t.Error("the reset connection is still cached")
	}
	syn2 := f.syn6(ipA6, 80)
	ack2 := syn2
	ack2.tcpFlags = 0x10
	f.expectPass("syn 2", f.toEp6(syn2))
	f.expectPass("syn-ack 2", f.fromEp6(packet6{src: epIP6, dst: ipA6, proto: uint8(tcp), sport: 80, dport: syn2.sport, tcpFlags: 0x12}))
	f.expectPass("ack 2", f.toEp6(ack2))
	if _, ok := cachedFlow6(t, f.d, syn2, false); !ok {
		t.Fatal("the second connection was not cached")
	}
	f.apply6(true, true, e(allow(idA, out, udp, 53, 16, 1)), e(allow(idA, in, tcp, 80, 16, 2)), e(deny(idA, in, tcp, 80, 16, 3)))
	f.expectDrop("cached connection after a deny", f.toEp6(ack2), flow.ReasonPolicyDeny)
	f.drain()

	// After the window the answer goes to conntrack6, which no longer has the flow.
	waitWindow(t, ce.Synced, window)
	f.expectDrop("answer after the window, flow gone from conntrack6", f.toEp6(a), flow.ReasonPolicyDefaultDeny)
}
