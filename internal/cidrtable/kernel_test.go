package cidrtable

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/rampartnet/rampart/internal/cidrtable/cidrtest"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/testenv"
)

// Tests of the tables over the kernel's maps (a datapath of their own, no endpoint): their
// memory is created as loads need it, at the size they need, freed with the bank it
// belongs to, and a failed allocation leaves the tables in force. The programs reading
// the tables are tested with the datapath (internal/datapath, cidrset_test.go).

// openKernel opens a datapath pinned in a fresh directory and tables over its maps (host
// tables bounded by slots; 0: 1<<16), both removed at cleanup.
func openKernel(t *testing.T, slots uint32) (*datapath.Datapath, *Tables) {
	t.Helper()
	testenv.RequireRoot(t)
	if slots == 0 {
		slots = 1 << 16
	}
	d, err := datapath.Open(datapath.Config{PinDir: filepath.Join(datapath.BPFFSRoot, "rampart-test-"+rand.Text()[:8])})
	if err != nil {
		t.Fatalf("opening datapath: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Remove(); err != nil {
			t.Errorf("removing datapath: %v", err)
		}
	})
	ct, err := Open(Maps(d.Pins.CIDRMaps()), slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ct.Close)
	return d, ct
}

// cidrTables returns the CIDR set tables the kernel holds for d (the maps inside cidr4_top
// and cidr4_host, by OUTER[bank]), read through the pins as `rampart status` reads them.
func cidrTables(t *testing.T, d *datapath.Datapath) map[string]datapath.MapUsage {
	t.Helper()
	us, err := datapath.MapMemory(d.Pins.PinDir())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]datapath.MapUsage{}
	for _, u := range us {
		if strings.Contains(u.Name, "[") {
			out[u.Name] = u
		}
	}
	return out
}

// tableNamesOf lists the tables' names, sorted.
func tableNamesOf(ts map[string]datapath.MapUsage) []string {
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
	d, ct := openKernel(t, 1<<20)
	if ts := cidrTables(t, d); len(ts) != 0 {
		t.Fatalf("new datapath has CIDR tables %v", tableNamesOf(ts))
	}
	if st := ct.CIDRSetUsage(); st.TableBytes > 64<<10 {
		t.Fatalf("new datapath: %d bytes of IPv4 tables", st.TableBytes)
	}

	hosts := func(n int) []netip.Prefix {
		out := make([]netip.Prefix, n)
		for i := range out {
			out[i] = netip.PrefixFrom(cidrtest.V4Addr(0x0a000000+uint32(i)*7), 32)
		}
		return out
	}
	check := func(step string, wantTop bool, minSlots, maxSlots uint32) {
		t.Helper()
		ts := cidrTables(t, d)
		bank := ct.c.t.active()
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
		st := ct.CIDRSetUsage()
		if cfg := st.TableBytes - sum; cfg > 64<<10 {
			t.Errorf("%s: CIDRSetUsage says %d bytes of tables, the kernel %d (+ config)", step, st.TableBytes, sum)
		}
	}

	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{0: hosts(1000)}); err != nil {
		t.Fatal(err)
	}
	check("1000 /32s", false, 2000, 2100)

	if err := ct.AddCIDRs(0, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}); err != nil {
		t.Fatal(err)
	}
	check("a /24 added in place", true, 2000, 2100)
	if m, _ := ct.CIDRSetMembership(netip.MustParseAddr("198.51.100.9")); m != 1 {
		t.Errorf("198.51.100.9 in %b after the /24 was added, want set 0", m)
	}

	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{0: hosts(50000), 1: {netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatal(err)
	}
	check("50000 /32s and a /24", true, 100000, 101000)

	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{1: {netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatal(err)
	}
	check("a /24 alone", true, 0, 0)

	if _, err := ct.ReplaceCIDRSets(nil); err != nil {
		t.Fatal(err)
	}
	check("no sets", false, 0, 0)
	if m, _ := ct.CIDRSetMembership(netip.MustParseAddr("198.51.100.9")); m != 0 {
		t.Errorf("198.51.100.9 in %b with no sets", m)
	}
}

// TestCIDRTableAllocFailure: when the kernel cannot create a new table (ENOMEM here,
// injected before the map is created), the load fails saying the previous tables stay in
// force, and they do: the tables in force still list the address (read as the programs
// read them), and no table is left half made. An in-place addition that needs a new table fails the same way.
func TestCIDRTableAllocFailure(t *testing.T) {
	d, ct := openKernel(t, 0)
	listed := netip.MustParseAddr("203.0.113.7")
	member := func(step string, a netip.Addr, want uint32) {
		t.Helper()
		if m, err := ct.CIDRSetMembership(a); err != nil || m != want {
			t.Errorf("%s: %v in %b (%v), want %b", step, a, m, err, want)
		}
	}
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.PrefixFrom(listed, 32)}}); err != nil {
		t.Fatal(err)
	}
	before := tableNamesOf(cidrTables(t, d))
	store := ct.c.store.(*mapStore)
	store.fail = func(kind string, entries uint32) error { return syscall.ENOMEM }
	t.Cleanup(func() { store.fail = nil })

	_, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.MustParsePrefix("198.51.100.0/24")}})
	if err == nil || !errors.Is(err, syscall.ENOMEM) || !strings.Contains(err.Error(), "previous tables stay in force") {
		t.Fatalf("load with no memory: %v", err)
	}
	if got := tableNamesOf(cidrTables(t, d)); !slices.Equal(got, before) {
		t.Errorf("tables after the failed load: %v, want %v", got, before)
	}
	member("listed address after the failed load", listed, 1<<2)
	member("the /24 the failed load would have listed", netip.MustParseAddr("198.51.100.1"), 0)

	// The top table is made, the host table fails: the top table is freed again.
	store.fail = func(kind string, entries uint32) error {
		if kind == "cidr4_host" {
			return syscall.ENOMEM
		}
		return nil
	}
	_, err = ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.9/32")}})
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("load whose host table cannot be made: %v", err)
	}
	if got := tableNamesOf(cidrTables(t, d)); !slices.Equal(got, before) {
		t.Errorf("tables after the load that failed half way: %v, want %v", got, before)
	}
	member("listed address after the load that failed half way", listed, 1<<2)
	store.fail = func(kind string, entries uint32) error { return syscall.ENOMEM }

	// A /24 added in place needs a top table: rebuilt, which fails; the tables in force
	// still list the address.
	err = ct.AddCIDRs(2, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")})
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("in-place addition that needs a new table: %v", err)
	}
	member("listed address after the failed addition", listed, 1<<2)

	store.fail = nil
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {netip.PrefixFrom(listed, 32), netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatalf("load once memory is back: %v", err)
	}
	member("the /24 once memory is back", netip.MustParseAddr("198.51.100.1"), 1<<2)
}
