package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// TestMigrateEarlierConntrack: flows in the conntrack maps of earlier versions are moved
// into conntrack4_peer when the datapath opens, and their pins removed: ct4 (one entry
// per direction and tuple) keyed from the endpoint's side with their direction, conntrack4
// and conntrack4_jiffies as they were; those of the first two with times in nanoseconds,
// which keep their age in jiffies; all with their peer's identity in the ipcache.
func TestMigrateEarlierConntrack(t *testing.T) {
	pin := newPinDir(t)
	ep, peer := netip.MustParseAddr("198.18.7.10"), netip.MustParseAddr("198.19.7.20")
	// The ipcache the earlier version left pinned.
	first := openTest(t, Config{PinDir: pin})
	if err := first.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{netip.PrefixFrom(peer, 32): {Identity: idA}}); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	earlier := func(name string) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.LRUHash, KeySize: 20, ValueSize: 32, MaxEntries: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if err := m.Pin(filepath.Join(pin, name)); err != nil {
			t.Fatal(err)
		}
		return m
	}
	legacy, nsMap, jMap := earlier(legacyCT4Pin), earlier(nsConntrackPin), earlier(jiffiesConntrackPin)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	nowNs := uint64(ts.Nano())
	out := packet{src: ep, dst: peer, proto: 6, sport: 40000, dport: 443} // the endpoint connects
	in := packet{src: peer, dst: ep, proto: 17, sport: 5353, dport: 53}   // a peer connects to it
	later := packet{src: ep, dst: peer, proto: 6, sport: 40001, dport: 443}
	jiffiesFlow := packet{src: ep, dst: peer, proto: 6, sport: 40002, dport: 443}
	value := func(rule uint32) legacyCtValue {
		// Created 5 s ago, last seen 1 s ago.
		return legacyCtValue{Created: nowNs - 5e9, LastSeen: nowNs - 1e9, RuleID: rule, Flags: ctFSeenReply, Revision: 4}
	}
	put := func(p packet, dir policy.Direction, rule uint32) {
		s, d := p.src.As4(), p.dst.As4()
		k := legacyCT4Key{Sport: htons(p.sport), Dport: htons(p.dport), EpID: 3, Protocol: p.proto, Direction: uint8(dir)}
		k.Saddr, k.Daddr = binary.NativeEndian.Uint32(s[:]), binary.NativeEndian.Uint32(d[:])
		v := value(rule)
		if err := legacy.Update(&k, &v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	put(out, policy.Egress, 11)
	put(in, policy.Ingress, 12)
	k := ct4Key(later, 3, uint8(policy.Egress))
	v := value(13)
	v.Direction = uint8(policy.Egress)
	if err := nsMap.Update(&k, &v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	jiffiesBefore, err := jiffiesNow()
	if err != nil {
		t.Fatal(err)
	}
	k = ct4Key(jiffiesFlow, 3, uint8(policy.Egress))
	v = legacyCtValue{Created: jiffiesBefore - 7, LastSeen: jiffiesBefore - 3, RuleID: 14, Flags: ctFSeenReply, Revision: 4, Direction: uint8(policy.Egress)}
	if err := jMap.Update(&k, &v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}

	d := openTest(t, Config{PinDir: pin})
	tick, err := kernelTick()
	if err != nil {
		t.Fatal(err)
	}
	// The tick at monotonic time ns, from a reading of both clocks now.
	nowJ, err := jiffiesNow()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	jiffyAt := func(ns uint64) uint64 { return nowJ - (uint64(ts.Nano())-ns)/uint64(tick) }
	near := func(got, want uint64) bool { return got+3 >= want && got <= want+3 }
	for _, c := range []struct {
		name string
		p    packet
		dir  policy.Direction
		rule uint32
	}{
		{"ct4 egress flow", out, policy.Egress, 11},
		{"ct4 ingress flow", in, policy.Ingress, 12},
		{"conntrack4 flow", later, policy.Egress, 13},
		{"conntrack4_jiffies flow", jiffiesFlow, policy.Egress, 14},
	} {
		var v rampartCtValue
		// The key a reply of the flow builds is the same: look it up from that side.
		reply := packet{src: c.p.dst, dst: c.p.src, proto: c.p.proto, sport: c.p.dport, dport: c.p.sport}
		replyDir := policy.Ingress
		if c.dir == policy.Ingress {
			replyDir = policy.Egress
		}
		k := ct4Key(reply, 3, uint8(replyDir))
		if err := d.objs.Conntrack4Peer.Lookup(&k, &v); err != nil {
			t.Errorf("%s: not in conntrack4_peer under its reply's key: %v", c.name, err)
			continue
		}
		if v.Direction != uint8(c.dir) || v.RuleId != c.rule || v.Revision != 4 || v.PeerIdentity != uint32(idA) {
			t.Errorf("%s: migrated entry %+v, want direction %d, rule %d, revision 4, peer identity %d", c.name, v, c.dir, c.rule, idA)
		}
		if c.rule == 14 { // in jiffies already: unchanged
			if v.Created != jiffiesBefore-7 || v.LastSeen != jiffiesBefore-3 {
				t.Errorf("%s: times %d, %d, want %d, %d (unchanged)", c.name, v.Created, v.LastSeen, jiffiesBefore-7, jiffiesBefore-3)
			}
			continue
		}
		// Ages kept, to a few ticks (the test's own time between the clock readings).
		if want := jiffyAt(nowNs - 1e9); !near(v.LastSeen, want) {
			t.Errorf("%s: last seen at jiffy %d, want about %d", c.name, v.LastSeen, want)
		}
		if want := jiffyAt(nowNs - 5e9); !near(v.Created, want) {
			t.Errorf("%s: created at jiffy %d, want about %d", c.name, v.Created, want)
		}
	}
	for _, name := range []string{legacyCT4Pin, nsConntrackPin, jiffiesConntrackPin} {
		if _, err := os.Stat(filepath.Join(pin, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("earlier pin %s still there after migration (stat: %v)", name, err)
		}
	}
}

// TestMigrateEndpointsWithoutAddress: the endpoint maps of the version before
// endpoint_info.addr are replaced when the datapath opens, each endpoint keeping its info
// and getting its address from the ipcache, so the new programs check its sources from
// their first packet.
func TestMigrateEndpointsWithoutAddress(t *testing.T) {
	pin := newPinDir(t)
	d := openTest(t, Config{PinDir: pin})
	if err := d.IPCache.ApplyIPCache(fixtureIPCache()); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// The earlier layout: ep_id, identity, flags, revision (and the slot's ifindex).
	for _, m := range []struct {
		name  string
		typ   ebpf.MapType
		size  uint32
		key   uint32
		value []uint32
	}{
		{"endpoints", ebpf.Hash, 16, epIfindex, []uint32{epID, uint32(epIdent), enforceIngress, 9}},
		{"endpoints", ebpf.Hash, 16, 5, []uint32{8, uint32(idA), 0, 3}}, // no address in the ipcache
		{"endpoint_slots", ebpf.Array, 20, epIfindex, []uint32{epID, uint32(epIdent), enforceIngress, 9, epIfindex}},
		{"endpoints_by_id", ebpf.Hash, 16, epID, []uint32{epID, uint32(epIdent), enforceIngress, 9}},
	} {
		path := filepath.Join(pin, m.name)
		old, err := ebpf.LoadPinnedMap(path, nil)
		if err == nil && old.ValueSize() != m.size {
			old.Close()
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			err = os.ErrNotExist
		}
		if errors.Is(err, os.ErrNotExist) {
			entries := uint32(16)
			if m.typ == ebpf.Array {
				entries = 1024
			}
			old, err = ebpf.NewMap(&ebpf.MapSpec{Name: m.name, Type: m.typ, KeySize: 4, ValueSize: m.size, MaxEntries: entries})
			if err == nil {
				err = old.Pin(path)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Update(&m.key, m.value, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		old.Close()
	}

	f := &fixture{t: t, d: openTest(t, Config{PinDir: pin}), sport: 40000}
	f.ev = eventsOf(t, f.d)
	got := f.d.Endpoints.InstalledEndpoints()
	want := map[uint32]InstalledEndpoint{
		epIfindex: {EndpointInfo: EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}, EnforceIngress: true},
		5:         {EndpointInfo: EndpointInfo{EpID: 8, Identity: idA}},
	}
	if len(got) != len(want) || got[epIfindex] != want[epIfindex] || got[5] != want[5] {
		t.Errorf("migrated endpoints %+v, want %+v", got, want)
	}
	if rev := f.d.endpoints[epIfindex].Revision; rev != 9 {
		t.Errorf("revision %d, want 9 (kept)", rev)
	}
	f.expectPass("own address after the migration", f.fromEp(packet{src: epIP, dst: ipB, proto: uint8(udp), sport: f.port(), dport: 53}))
	f.expectSpoofed("other address after the migration", f.fromEp(packet{src: ipA, dst: ipB, proto: uint8(udp), sport: f.port(), dport: 53}), ipA, false)
	f.expectDrop("enforcement kept", f.toEp(f.synIn(ipB, 80)), flow.ReasonPolicyDefaultDeny)
}
