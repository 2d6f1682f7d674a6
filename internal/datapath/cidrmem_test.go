package datapath

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/cidrtable/cidrtest"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// Tests of the CIDR set tables' memory: created as loads need them, at the size they need,
// freed with the bank they belong to, and swapped without a window.

// cidrTables returns the CIDR set tables the kernel holds for d (the maps inside cidr4_top
// and cidr4_host, by OUTER[bank]), read through the pins as `rampart status` reads them.
func cidrTables(t *testing.T, d *Datapath) map[string]MapUsage {
	t.Helper()
	us, err := MapMemory(d.Pins.PinDir())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]MapUsage{}
	for _, u := range us {
		if strings.Contains(u.Name, "[") {
			out[u.Name] = u
		}
	}
	return out
}

// tableNamesOf lists the tables' names, sorted.
func tableNamesOf(ts map[string]MapUsage) []string {
	var out []string
	for n := range ts {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestCIDRSetGrowNoLeak: a set that starts with one address grows, by in-place additions
// and by reloads, far past every table it had (each growth a new, larger host table; the
// first /24 a new top table), and shrinks back to nothing, while BPF_PROG_RUN probes run
// without pause. A listed address is never let through, and an address no version lists
// never dropped.
func TestCIDRSetGrowNoLeak(t *testing.T) {
	f := newFixture(t, Config{})
	ct := cidrOf(t, f.d, 1<<20)
	f.apply(false, true, e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
		e(deny(identity.CIDRSet(4), out, policy.ProtoAny, 0, 0, 2)))
	listed, neighbour := addr("203.0.113.7"), addr("203.0.113.8")
	inTop := addr("198.51.100.77") // listed from the moment its /24 is added
	ps := []netip.Prefix{netip.PrefixFrom(listed, 32)}
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: ps}); err != nil {
		t.Fatal(err)
	}

	var (
		stop     atomic.Bool
		topState atomic.Int32 // 0: changing, 1: inTop listed, 2 (before) and 3 (after): not listed
		probes   atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		bad      []string
	)
	topState.Store(2)
	prog := f.d.objs.RampartFromEp
	wg.Go(func() {
		sport := uint16(1)
		for !stop.Load() {
			for _, c := range []struct {
				dst    netip.Addr
				drop   bool
				changs bool // inTop: judged by topState
			}{{listed, true, false}, {neighbour, false, false}, {inTop, false, true}} {
				sport++
				p := packet{src: epIP, dst: c.dst, proto: uint8(udp), sport: sport, dport: 53}
				before := topState.Load()
				ret, err := prog.Run(&ebpf.RunOptions{Data: p.bytes(), Context: skbContext{}, ContextOut: make([]byte, 256)})
				if c.changs {
					// topState goes 2 -> 0 -> 1 -> 0 -> 3, never back: the same non-zero
					// value before and after the run means no change overlapped it.
					if after := topState.Load(); before == 0 || after != before {
						continue
					}
					c.drop = before == 1
				}
				if err != nil || (ret == actShot) != c.drop {
					mu.Lock()
					bad = append(bad, c.dst.String()+": verdict "+verdictName(ret)+errString(err))
					mu.Unlock()
				}
				probes.Add(1)
			}
		}
	})
	// overlap waits until the probes ran through a few more rounds, so that every change
	// happens while probes run.
	overlap := func() {
		before := probes.Load()
		deadline := time.Now().Add(5 * time.Second)
		for probes.Load() < before+30 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
	}
	r := rand.New(rand.NewPCG(41, 42))
	more := func(n int) []netip.Prefix {
		var out []netip.Prefix
		for len(out) < n {
			a := cidrtest.V4Addr(0x0b000000 | r.Uint32()&0x00ffffff)
			if a != neighbour {
				out = append(out, netip.PrefixFrom(a, 32))
			}
		}
		return out
	}
	var grown []uint32
	slots := func() uint32 { return uint32(ct.CIDRSetUsage().HostSlots) }
	grown = append(grown, slots())
	for _, n := range []int{40, 200, 1000, 5000, 20000} {
		overlap()
		add := more(n)
		if err := ct.AddCIDRs(4, add); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, add...)
		grown = append(grown, slots())
	}
	overlap()
	topState.Store(0)
	if err := ct.AddCIDRs(4, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}); err != nil {
		t.Fatal(err)
	}
	topState.Store(1)
	ps = append(ps, netip.MustParsePrefix("198.51.100.0/24"))
	for _, n := range []int{100000, 300000} {
		overlap()
		ps = append(ps, more(n)...)
		if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: ps}); err != nil {
			t.Fatal(err)
		}
		grown = append(grown, slots())
	}
	overlap()
	topState.Store(0)
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: {netip.PrefixFrom(listed, 32)}}); err != nil {
		t.Fatal(err)
	}
	topState.Store(3)
	grown = append(grown, slots())
	overlap()
	stop.Store(true)
	wg.Wait()

	if len(bad) > 0 {
		t.Fatalf("%d wrong verdicts while the tables grew and shrank (of %d probes), first: %v", len(bad), probes.Load(), bad[0])
	}
	// The host table grew with the set (never a fixed size) and shrank back with it.
	if n := len(grown); grown[n-2] < 600000 || grown[n-1] > 1024 || grown[0] > 1024 {
		t.Errorf("host table sizes %v: want small, then over 600k slots, then small again", grown)
	}
	if len(cidrTables(t, f.d)) != 1 {
		t.Errorf("tables at the end: %v, want the host table only", tableNamesOf(cidrTables(t, f.d)))
	}
	t.Logf("%d probes, none wrong; host table sizes %v", probes.Load(), grown)
}

// TestCIDRLegacyPinsRemoved: the tables of versions that allocated both banks in full
// (cidr_banks, cidr_top, cidr_host) are unpinned when a datapath opens the directory, so
// their hundreds of MiB go once the old programs are replaced; the new maps start empty
// and take sets.
func TestCIDRLegacyPinsRemoved(t *testing.T) {
	dir := newPinDir(t)
	var pins []string
	for _, name := range []string{"cidr_banks", "cidr_top", "cidr_host"} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 64, Flags: unix.BPF_F_MMAPABLE})
		if err != nil {
			t.Fatal(err)
		}
		p := dir + "/" + name
		if err := m.Pin(p); err != nil {
			t.Fatal(err)
		}
		m.Close()
		pins = append(pins, p)
	}
	d := openTest(t, Config{PinDir: dir})
	ct := cidrOf(t, d, 0)
	for _, p := range pins {
		if _, err := ebpf.LoadPinnedMap(p, nil); err == nil {
			t.Errorf("legacy pin %s still there after Open", p)
		}
	}
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{1: {netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	if m, _ := ct.CIDRSetMembership(addr("192.0.2.5")); m != 1<<1 {
		t.Errorf("192.0.2.5 in %b, want set 1", m)
	}
}
