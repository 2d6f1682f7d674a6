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

	"github.com/rampartnet/rampart/internal/policy"
)

// TestMigrateEarlierConntrack: flows in the conntrack maps of earlier versions are moved
// into conntrack4_jiffies when the datapath opens, and their pins removed: ct4 (one entry
// per direction and tuple) keyed from the endpoint's side with their direction, conntrack4
// as it was; both with times in nanoseconds, which keep their age in jiffies.
func TestMigrateEarlierConntrack(t *testing.T) {
	pin := newPinDir(t)
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
	legacy, nsMap := earlier(legacyCT4Pin), earlier(nsConntrackPin)
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	nowNs := uint64(ts.Nano())
	ep, peer := netip.MustParseAddr("198.18.7.10"), netip.MustParseAddr("198.19.7.20")
	out := packet{src: ep, dst: peer, proto: 6, sport: 40000, dport: 443} // the endpoint connects
	in := packet{src: peer, dst: ep, proto: 17, sport: 5353, dport: 53}   // a peer connects to it
	later := packet{src: ep, dst: peer, proto: 6, sport: 40001, dport: 443}
	value := func(rule uint32) rampartCtValue {
		// Created 5 s ago, last seen 1 s ago.
		return rampartCtValue{Created: nowNs - 5e9, LastSeen: nowNs - 1e9, RuleId: rule, Flags: ctFSeenReply, Revision: 4}
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
	} {
		var v rampartCtValue
		// The key a reply of the flow builds is the same: look it up from that side.
		reply := packet{src: c.p.dst, dst: c.p.src, proto: c.p.proto, sport: c.p.dport, dport: c.p.sport}
		replyDir := policy.Ingress
		if c.dir == policy.Ingress {
			replyDir = policy.Egress
		}
		k := ct4Key(reply, 3, uint8(replyDir))
		if err := d.objs.Conntrack4Jiffies.Lookup(&k, &v); err != nil {
			t.Errorf("%s: not in conntrack4_jiffies under its reply's key: %v", c.name, err)
			continue
		}
		if v.Direction != uint8(c.dir) || v.RuleId != c.rule || v.Revision != 4 {
			t.Errorf("%s: migrated entry %+v, want direction %d, rule %d, revision 4", c.name, v, c.dir, c.rule)
		}
		// Ages kept, to a few ticks (the test's own time between the clock readings).
		if want := jiffyAt(nowNs - 1e9); !near(v.LastSeen, want) {
			t.Errorf("%s: last seen at jiffy %d, want about %d", c.name, v.LastSeen, want)
		}
		if want := jiffyAt(nowNs - 5e9); !near(v.Created, want) {
			t.Errorf("%s: created at jiffy %d, want about %d", c.name, v.Created, want)
		}
	}
	for _, name := range []string{legacyCT4Pin, nsConntrackPin} {
		if _, err := os.Stat(filepath.Join(pin, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("earlier pin %s still there after migration (stat: %v)", name, err)
		}
	}
}
