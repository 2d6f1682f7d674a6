package datapath

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// Tests of the CIDR set tables' memory: created as loads need them, at the size they need,
// freed with the bank they belong to, and swapped without a window.

// cidrTables returns the CIDR set tables the kernel holds for d (the maps inside cidr4_top
// and cidr4_host, by OUTER[bank]), read through the pins as `rampart status` reads them.
func cidrTables(t *testing.T, d *Datapath) map[string]MapUsage {
	t.Helper()
	us, err := MapMemory(d.PinDir())
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

// TestCIDRTablesFollowLoad: a new datapath holds no CIDR table; a set of /32s creates a
// host table sized to its addresses and no top table; a /24 adds the 64 MiB top table;
// a larger load replaces the host table with a larger one; removing every set frees both.
// After every change only the active bank has tables, and the kernel's accounting of them
// is what CIDRSetUsage reports.
func TestCIDRTablesFollowLoad(t *testing.T) {
	d := openTest(t, Config{CIDRHostSlots: 1 << 20})
	if ts := cidrTables(t, d); len(ts) != 0 {
		t.Fatalf("new datapath has CIDR tables %v", tableNamesOf(ts))
	}
	if st := d.CIDRSetUsage(); st.TableBytes > 64<<10 {
		t.Fatalf("new datapath: %d bytes of IPv4 tables", st.TableBytes)
	}

	hosts := func(n int) []netip.Prefix {
		out := make([]netip.Prefix, n)
		for i := range out {
			out[i] = netip.PrefixFrom(v4addrOf(0x0a000000+uint32(i)*7), 32)
		}
		return out
	}
	check := func(step string, wantTop bool, minSlots, maxSlots uint32) {
		t.Helper()
		ts := cidrTables(t, d)
		bank := d.cidr.t.active()
		var want []string
		if wantTop {
			want = append(want, fmt.Sprintf("cidr4_top[%d]", bank))
		}
		if maxSlots > 0 {
			want = append(want, fmt.Sprintf("cidr4_host[%d]", bank))
		}
		slices.Sort(want)
		if got := tableNamesOf(ts); !slices.Equal(got, want) {
			t.Fatalf("%s: tables %v, want %v (active bank %d)", step, got, want, bank)
		}
		var sum uint64
		for _, u := range ts {
			sum += u.Bytes
		}
		if top, ok := ts[fmt.Sprintf("cidr4_top[%d]", bank)]; ok && (top.MaxEntries != cidrTopRows/2 || top.Bytes < 64<<20) {
			t.Errorf("%s: top table %+v, want %d entries, 64 MiB", step, top, cidrTopRows/2)
		}
		if maxSlots > 0 {
			host := ts[fmt.Sprintf("cidr4_host[%d]", bank)]
			slots := host.MaxEntries * cidrHostBucket // one element per bucket of slots
			if slots < minSlots || slots > maxSlots+cidrHostBucket || host.Bytes < uint64(slots)*8 {
				t.Errorf("%s: host table %+v, want %d..%d slots of 8 bytes", step, host, minSlots, maxSlots)
			}
		}
		st := d.CIDRSetUsage()
		if cfg := st.TableBytes - sum; cfg > 64<<10 {
			t.Errorf("%s: CIDRSetUsage says %d bytes of tables, the kernel %d (+ config)", step, st.TableBytes, sum)
		}
	}

	if _, err := d.ReplaceCIDRSets(map[uint8][]netip.Prefix{0: hosts(1000)}); err != nil {
		t.Fatal(err)
	}
	check("1000 /32s", false, 2000, 2100)

	if err := d.AddCIDRs(0, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}); err != nil {
		t.Fatal(err)
	}
	check("a /24 added in place", true, 2000, 2100)
	if m, _ := d.CIDRSetMembership(addr("198.51.100.9")); m != 1 {
		t.Errorf("198.51.100.9 in %b after the /24 was added, want set 0", m)
	}

	if _, err := d.ReplaceCIDRSets(map[uint8][]netip.Prefix{0: hosts(50000), 1: {netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatal(err)
	}
	check("50000 /32s and a /24", true, 100000, 101000)

	if _, err := d.ReplaceCIDRSets(map[uint8][]netip.Prefix{1: {netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatal(err)
	}
	check("a /24 alone", true, 0, 0)

	if _, err := d.ReplaceCIDRSets(nil); err != nil {
		t.Fatal(err)
	}
	check("no sets", false, 0, 0)
	if m, _ := d.CIDRSetMembership(addr("198.51.100.9")); m != 0 {
		t.Errorf("198.51.100.9 in %b with no sets", m)
	}
}

// TestCIDRSetGrowNoLeak: a set that starts with one address grows, by in-place additions
// and by reloads, far past every table it had (each growth a new, larger host table; the
// first /24 a new top table), and shrinks back to nothing, while BPF_PROG_RUN probes run
// without pause. A listed address is never let through, and an address no version lists
// never dropped.
func TestCIDRSetGrowNoLeak(t *testing.T) {
	f := newFixture(t, Config{CIDRHostSlots: 1 << 20})
	f.apply(false, true, e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
		e(deny(identity.CIDRSet(4), out, policy.ProtoAny, 0, 0, 2)))
	listed, neighbour := addr("203.0.113.7"), addr("203.0.113.8")
	inTop := addr("198.51.100.77") // listed from the moment its /24 is added
	ps := []netip.Prefix{netip.PrefixFrom(listed, 32)}
	if _, err := f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: ps}); err != nil {
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
			a := v4addrOf(0x0b000000 | r.Uint32()&0x00ffffff)
			if a != neighbour {
				out = append(out, netip.PrefixFrom(a, 32))
			}
		}
		return out
	}
	var grown []uint32
	slots := func() uint32 { return uint32(f.d.CIDRSetUsage().HostSlots) }
	grown = append(grown, slots())
	for _, n := range []int{40, 200, 1000, 5000, 20000} {
		overlap()
		add := more(n)
		if err := f.d.AddCIDRs(4, add); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, add...)
		grown = append(grown, slots())
	}
	overlap()
	topState.Store(0)
	if err := f.d.AddCIDRs(4, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}); err != nil {
		t.Fatal(err)
	}
	topState.Store(1)
	ps = append(ps, netip.MustParsePrefix("198.51.100.0/24"))
	for _, n := range []int{100000, 300000} {
		overlap()
		ps = append(ps, more(n)...)
		if _, err := f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: ps}); err != nil {
			t.Fatal(err)
		}
		grown = append(grown, slots())
	}
	overlap()
	topState.Store(0)
	if _, err := f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: {netip.PrefixFrom(listed, 32)}}); err != nil {
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

// TestCIDRTableAllocFailure: when the kernel cannot create a new table (ENOMEM here,
// injected before the map is created), the load fails saying the previous tables stay in
// force, and they do: the programs still drop the listed address, and no table is left
// half made. An in-place addition that needs a new table fails the same way.
func TestCIDRTableAllocFailure(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(false, true, e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
		e(deny(identity.CIDRSet(2), out, policy.ProtoAny, 0, 0, 2)))
	listed := addr("203.0.113.7")
	if _, err := f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.PrefixFrom(listed, 32)}}); err != nil {
		t.Fatal(err)
	}
	before := tableNamesOf(cidrTables(t, f.d))
	store := f.d.cidr.store.(*mapStore)
	store.fail = func(kind string, entries uint32) error { return syscall.ENOMEM }
	t.Cleanup(func() { store.fail = nil })

	_, err := f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.MustParsePrefix("198.51.100.0/24")}})
	if err == nil || !errors.Is(err, syscall.ENOMEM) || !strings.Contains(err.Error(), "previous tables stay in force") {
		t.Fatalf("load with no memory: %v", err)
	}
	if got := tableNamesOf(cidrTables(t, f.d)); !slices.Equal(got, before) {
		t.Errorf("tables after the failed load: %v, want %v", got, before)
	}
	f.expectDrop("listed address after the failed load", f.udpOut(listed, 53), flow.ReasonPolicyDeny)
	f.expectPass("the /24 the failed load would have listed", f.udpOut(addr("198.51.100.1"), 53))

	// The top table is made, the host table fails: the top table is freed again.
	store.fail = func(kind string, entries uint32) error {
		if kind == "cidr4_host" {
			return syscall.ENOMEM
		}
		return nil
	}
	_, err = f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.9/32")}})
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("load whose host table cannot be made: %v", err)
	}
	if got := tableNamesOf(cidrTables(t, f.d)); !slices.Equal(got, before) {
		t.Errorf("tables after the load that failed half way: %v, want %v", got, before)
	}
	f.expectDrop("listed address after the load that failed half way", f.udpOut(listed, 53), flow.ReasonPolicyDeny)
	store.fail = func(kind string, entries uint32) error { return syscall.ENOMEM }

	// A /24 added in place needs a top table: rebuilt, which fails; the tables in force
	// still list the address.
	err = f.d.AddCIDRs(2, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")})
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("in-place addition that needs a new table: %v", err)
	}
	f.expectDrop("listed address after the failed addition", f.udpOut(listed, 53), flow.ReasonPolicyDeny)

	store.fail = nil
	if _, err := f.d.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.PrefixFrom(listed, 32), netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatalf("load once memory is back: %v", err)
	}
	f.expectDrop("the /24 once memory is back", f.udpOut(addr("198.51.100.1"), 53), flow.ReasonPolicyDeny)
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
	for _, p := range pins {
		if _, err := ebpf.LoadPinnedMap(p, nil); err == nil {
			t.Errorf("legacy pin %s still there after Open", p)
		}
	}
	if _, err := d.ReplaceCIDRSets(map[uint8][]netip.Prefix{1: {netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.CIDRSetMembership(addr("192.0.2.5")); m != 1<<1 {
		t.Errorf("192.0.2.5 in %b, want set 1", m)
	}
}
