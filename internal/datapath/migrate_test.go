package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/policy"
)

// TestMigrateLegacyConntrack: flows in the conntrack map of an earlier version (ct4, one
// entry per direction and tuple) are moved into conntrack4 when the datapath opens, keyed
// from the endpoint's side with their direction, and the legacy pin is removed.
func TestMigrateLegacyConntrack(t *testing.T) {
	requirePrivileged(t)
	pin := filepath.Join(BPFFSRoot, "rampart-test-"+randSuffix(t))
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pin) })
	legacy, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "ct4", Type: ebpf.LRUHash, KeySize: 20, ValueSize: 32, MaxEntries: 16,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer legacy.Close()
	if err := legacy.Pin(filepath.Join(pin, legacyCT4Pin)); err != nil {
		t.Fatal(err)
	}
	ep, peer := netip.MustParseAddr("198.18.7.10"), netip.MustParseAddr("198.19.7.20")
	out := packet{src: ep, dst: peer, proto: 6, sport: 40000, dport: 443} // the endpoint connects
	in := packet{src: peer, dst: ep, proto: 17, sport: 5353, dport: 53}   // a peer connects to it
	put := func(p packet, dir policy.Direction, rule uint32) {
		s, d := p.src.As4(), p.dst.As4()
		k := legacyCT4Key{Sport: htons(p.sport), Dport: htons(p.dport), EpID: 3, Protocol: p.proto, Direction: uint8(dir)}
		k.Saddr, k.Daddr = binary.NativeEndian.Uint32(s[:]), binary.NativeEndian.Uint32(d[:])
		v := rampartCtValue{CreatedNs: 1, LastSeenNs: 2, RuleId: rule, Flags: ctFSeenReply, Revision: 4}
		if err := legacy.Update(&k, &v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	put(out, policy.Egress, 11)
	put(in, policy.Ingress, 12)

	d := openTest(t, Config{PinDir: pin})
	for _, c := range []struct {
		name string
		p    packet
		dir  policy.Direction
		rule uint32
	}{
		{"egress flow", out, policy.Egress, 11},
		{"ingress flow", in, policy.Ingress, 12},
	} {
		var v rampartCtValue
		// The key a reply of the flow builds is the same: look it up from that side.
		reply := packet{src: c.p.dst, dst: c.p.src, proto: c.p.proto, sport: c.p.dport, dport: c.p.sport}
		replyDir := policy.Ingress
		if c.dir == policy.Ingress {
			replyDir = policy.Egress
		}
		k := ct4Key(reply, 3, uint8(replyDir))
		if err := d.objs.Conntrack4.Lookup(&k, &v); err != nil {
			t.Errorf("%s: not in conntrack4 under its reply's key: %v", c.name, err)
			continue
		}
		if v.Direction != uint8(c.dir) || v.RuleId != c.rule || v.Revision != 4 || v.LastSeenNs != 2 {
			t.Errorf("%s: migrated entry %+v, want direction %d, rule %d, revision 4, last seen 2", c.name, v, c.dir, c.rule)
		}
	}
	if _, err := os.Stat(filepath.Join(pin, legacyCT4Pin)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("legacy pin still there after migration (stat: %v)", err)
	}
}
