package cidrtable

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/cidrtable/cidrtest"
)

// Tests of the CIDR set tables over Go memory (no root needed): the code that writes the
// mmapped BPF arrays, against the reference model. cidrset_test.go checks the same through
// the kernel's maps and the BPF program.

func TestCIDRHashInverse(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		a, seed := r.Uint32(), r.Uint32()
		if got := cidrUnhash(cidrHash(a, seed), seed); got != a {
			t.Fatalf("unhash(hash(%#x, %#x)) = %#x", a, seed, got)
		}
	}
	// The hash spreads consecutive addresses (a /25 expands to 128 of them) over the table.
	homes := map[uint32]int{}
	for a := uint32(0x0A000000); a < 0x0A000000+4096; a++ {
		homes[cidrHome(cidrHash(a, 12345), 4096*2)]++
	}
	if len(homes) < 2500 {
		t.Fatalf("4096 consecutive addresses hit only %d of 8192 home slots", len(homes))
	}
}

func TestRadixSort(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct{ n, bits int }{{0, 40}, {1, 40}, {1000, 40}, {100000, 37}, {5000, 64}, {3000, 11}} {
		keys := make([]uint64, c.n)
		for i := range keys {
			keys[i] = r.Uint64()
			if c.bits < 64 {
				keys[i] &= 1<<c.bits - 1
			}
			if i%7 == 0 && i > 0 {
				keys[i] = keys[i-1] // duplicates
			}
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		got := radixSort(keys, make([]uint64, c.n), c.bits)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d bits=%d: not sorted", c.n, c.bits)
		}
	}
}

// TestPlaceHost: every address of a layout is found from its home slot within the probe
// bound, also in tables so full that entries wrap around the end.
func TestPlaceHost(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		n    int
		size uint32
	}{{10, 64}, {50, 64}, {1000, 2000}, {1000, 1100}, {30000, 60000}} {
		var sets [cidrSets][]uint64
		addrs := map[uint32]uint32{}
		for len(addrs) < c.n {
			a, set := r.Uint32()|1, r.IntN(3)
			sets[set] = append(sets[set], v4enc(a, 32))
			addrs[a] |= 1 << set
		}
		for i := range sets {
			slices.Sort(sets[i])
			sets[i] = slices.Compact(sets[i])
		}
		seed := r.Uint32()
		keys, _ := hostKeys(&sets, seed, nil)
		keys = radixSort(keys, make([]uint64, len(keys)), 37)
		if d := distinctHashes(keys); d != c.n {
			t.Fatalf("%d distinct, want %d", d, c.n)
		}
		table := make([]uint64, c.size)
		probe, ok := placeHost(keys, c.size, seed, table)
		if !ok {
			t.Logf("n=%d size=%d: no layout within the probe bound (acceptable only when nearly full)", c.n, c.size)
			if float64(c.n)/float64(c.size) < 0.9 {
				t.Fatal("layout failed at a moderate load factor")
			}
			continue
		}
		tb := v4Tables{cfg: &config{HostSlots: [2]uint32{c.size}, Seed: [2]uint32{seed}}, host: [2][]uint64{table}}
		longest := 0
		for a, m := range addrs {
			i, v := tb.find(0, a, c.size)
			if i < 0 || uint32(v>>32) != m {
				t.Fatalf("n=%d size=%d: %#x found at %d with %#x, want mask %#x", c.n, c.size, a, i, v, m)
			}
			d := (i - int(cidrHome(cidrHash(a, seed), c.size)) + int(c.size)) % int(c.size)
			longest = max(longest, d+1)
		}
		if longest != probe {
			t.Errorf("n=%d size=%d: placeHost says %d probes, longest is %d", c.n, c.size, probe, longest)
		}
		if got, _ := placeHost(keys, c.size, seed, nil); got != probe {
			t.Errorf("dry run says %d probes, layout %d", got, probe)
		}
	}
}

// TestCIDRSetsEdges: the edges named in the design, one by one, over Go memory.
func TestCIDRSetsEdges(t *testing.T) {
	c, trie := newMemCIDR(t, 1024)
	cidrtest.Edges(t, cidrtest.Backend{
		Replace: func(sets map[uint8][]netip.Prefix) error { _, err := c.replace(sets); return err },
		Change:  c.change,
		Member:  func(a netip.Addr) uint32 { return memMembership(c, trie, a) },
	})
}

// TestCIDRSetsRandom: random sequences of reloads, additions and removals on random
// overlapping prefix sets, checked against the reference at every prefix's edges.
func TestCIDRSetsRandom(t *testing.T) {
	c, trie := newMemCIDR(t, 1<<14)
	r := rand.New(rand.NewPCG(7, 8))
	ref := cidrtest.Sets{}
	for step := range 60 {
		switch op := r.IntN(4); {
		case op == 0 || step == 0:
			ref = cidrtest.Sets{}
			for range 1 + r.IntN(5) {
				i := uint8(r.IntN(cidrSets))
				for range r.IntN(300) {
					if r.IntN(5) == 0 {
						ref.Add(i, cidrtest.RandPrefix6(r))
					} else {
						ref.Add(i, cidrtest.RandPrefix4(r))
					}
				}
			}
			if _, err := c.replace(ref.Lists()); err != nil {
				t.Fatalf("step %d: replace: %v", step, err)
			}
		case op == 1 || op == 2:
			i := uint8(r.IntN(cidrSets))
			if len(ref) > 0 && r.IntN(3) != 0 {
				for k := range ref {
					i = k
					break
				}
			}
			var ps []netip.Prefix
			if op == 1 {
				for range 1 + r.IntN(40) {
					if r.IntN(4) == 0 {
						ps = append(ps, cidrtest.RandPrefix6(r))
					} else {
						ps = append(ps, cidrtest.RandPrefix4(r))
					}
				}
				ref.Add(i, ps...)
			} else {
				for p := range ref[i] {
					if r.IntN(3) == 0 {
						ps = append(ps, p)
					}
				}
				ps = append(ps, cidrtest.RandPrefix4(r)) // most likely not in the set
				ref.Remove(i, ps...)
			}
			if err := c.change(i, ps, op == 1); err != nil {
				t.Fatalf("step %d: change: %v", step, err)
			}
		default:
			// A reload with the same content changes nothing visible.
			if _, err := c.replace(ref.Lists()); err != nil {
				t.Fatalf("step %d: reload: %v", step, err)
			}
		}
		for _, a := range cidrtest.Samples(ref, r, 200) {
			if got, want := memMembership(c, trie, a), ref.Mask(a); got != want {
				t.Fatalf("step %d: %v in %032b, want %032b", step, a, got, want)
			}
		}
	}
	st := c.usage()
	n4, n6 := 0, 0
	for _, set := range ref {
		for p := range set {
			if p.Addr().Is4() {
				n4++
			} else {
				n6++
			}
		}
	}
	if st.IPv4 != n4 || st.IPv6 != n6 || st.Prefixes != n4+n6 {
		t.Errorf("stats %+v, want %d IPv4 and %d IPv6 prefixes", st, n4, n6)
	}
}

// TestCIDRHostOverflow: an in-place addition that finds no slot rebuilds the table larger;
// more addresses than the capacity are refused with the old sets intact.
func TestCIDRHostOverflow(t *testing.T) {
	c, trie := newMemCIDR(t, 512)
	ref := cidrtest.Sets{}
	base := netip.MustParsePrefix("198.18.0.0/25")
	ref.Add(0, base)
	if _, err := c.replace(ref.Lists()); err != nil {
		t.Fatal(err)
	}
	if st := c.usage(); st.HostSlots != 256 || st.HostEntries != 128 {
		t.Fatalf("after the first load: %+v", st)
	}
	// Three more /25s: 512 addresses, beyond the 256-slot table: rebuilt to the capacity.
	more := []netip.Prefix{netip.MustParsePrefix("198.18.1.0/25"), netip.MustParsePrefix("198.18.2.128/25"), netip.MustParsePrefix("198.18.3.0/26")}
	ref.Add(0, more...)
	bank := c.t.active()
	if err := c.change(0, more, true); err != nil {
		t.Fatal(err)
	}
	if c.t.active() == bank {
		t.Error("no rebuild after the table ran out of slots")
	}
	st := c.usage()
	if st.HostSlots <= 256 || st.HostEntries != 128*3+64 {
		t.Errorf("after growing: %+v", st)
	}
	r := rand.New(rand.NewPCG(9, 10))
	for _, a := range cidrtest.Samples(ref, r, 0) {
		if got, want := memMembership(c, trie, a), ref.Mask(a); got != want {
			t.Fatalf("%v in %b, want %b", a, got, want)
		}
	}
	// An in-place addition whose rebuild cannot fit fails; in-place changes then need a
	// reload, and the reload restores the sets exactly.
	if err := c.change(0, []netip.Prefix{netip.MustParsePrefix("198.18.5.0/25")}, true); err == nil {
		t.Fatal("addition beyond the capacity accepted")
	}
	if err := c.change(0, more[:1], false); !errors.Is(err, ErrCIDRSetsNotLoaded) {
		t.Fatalf("in-place change after a failed addition: %v, want ErrCIDRSetsNotLoaded", err)
	}
	if _, err := c.replace(ref.Lists()); err != nil {
		t.Fatal(err)
	}
	if err := c.change(0, more[:1], true); err != nil {
		t.Fatalf("in-place change after the reload: %v", err)
	}

	// 640 addresses cannot fit 512 slots: refused, nothing changes.
	var big []netip.Prefix
	for _, s := range []string{"198.18.8.0/25", "198.18.8.128/25", "198.18.9.0/25", "198.18.9.128/25", "198.18.10.0/25"} {
		big = append(big, netip.MustParsePrefix(s))
	}
	_, err := c.replace(map[uint8][]netip.Prefix{0: big})
	if err == nil || !strings.Contains(err.Error(), "CIDRHostSlots") {
		t.Fatalf("overfull table: err %v", err)
	}
	for _, a := range cidrtest.Samples(ref, r, 0) {
		if got, want := memMembership(c, trie, a), ref.Mask(a); got != want {
			t.Fatalf("after the refused reload: %v in %b, want %b", a, got, want)
		}
	}
}

// TestV6Order: IPv6 changes never unlist an address listed before and after, and never list
// one listed neither before nor after, at any single write of the trie.
func TestV6Order(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	c, trie := newMemCIDR(t, 64)
	ref := cidrtest.Sets{}
	for step := range 25 {
		old := ref.Clone()
		var apply func() error
		switch r.IntN(3) {
		case 0:
			// A reload that keeps most of the sets (as reloading a list usually does), moves
			// some prefixes to other sets and adds new ones.
			next := cidrtest.Sets{}
			for i, set := range ref {
				for p := range set {
					switch r.IntN(6) {
					case 0:
					case 1:
						next.Add(uint8(r.IntN(4)), p)
					default:
						next.Add(i, p)
					}
				}
			}
			for range r.IntN(150) {
				next.Add(uint8(r.IntN(4)), cidrtest.RandPrefix6(r))
			}
			ref = next
			apply = func() error { _, err := c.replace(ref.Lists()); return err }
		case 1:
			i := uint8(r.IntN(4))
			var ps []netip.Prefix
			for range 1 + r.IntN(20) {
				ps = append(ps, cidrtest.RandPrefix6(r))
			}
			ref.Add(i, ps...)
			apply = func() error { return c.change(i, ps, true) }
		default:
			i := uint8(r.IntN(4))
			var ps []netip.Prefix
			for p := range ref[i] {
				if r.IntN(2) == 0 {
					ps = append(ps, p)
				}
			}
			ref.Remove(i, ps...)
			apply = func() error { return c.change(i, ps, false) }
		}
		addrs := cidrtest.Samples(old, r, 0)
		addrs = append(addrs, cidrtest.Samples(ref, r, 0)...)
		type probe struct {
			a             netip.Addr
			before, after uint32
		}
		var probes []probe
		for _, a := range addrs {
			if a.Is6() && !a.Is4In6() {
				probes = append(probes, probe{a, old.Mask(a), ref.Mask(a)})
			}
		}
		r.Shuffle(len(probes), func(i, j int) { probes[i], probes[j] = probes[j], probes[i] })
		probes = probes[:min(len(probes), 120)]
		writes := 0
		trie.check = func() {
			writes++
			for _, p := range probes {
				a, got, before, after := p.a, trie.lookup(p.a), p.before, p.after
				if before&after&^got != 0 || got&^(before|after) != 0 {
					t.Fatalf("step %d, write %d: %v in %b (before %b, after %b)", step, writes, a, got, before, after)
				}
			}
		}
		if err := apply(); err != nil {
			t.Fatal(err)
		}
		trie.check = nil
		for _, a := range addrs {
			if a.Is4() || a.Is4In6() {
				continue
			}
			if got, want := trie.lookup(a), ref.Mask(a); got != want {
				t.Fatalf("step %d: %v in %b, want %b", step, a, got, want)
			}
		}
	}
	// The case the three steps exist for: an address listed before and after by set 0,
	// through a shorter prefix before and a longer one after, with a new entry of another
	// set between them.
	pfx := func(ss ...string) (out []netip.Prefix) {
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	ref = cidrtest.Sets{}
	ref.Add(0, pfx("2001:db8:aa::/48")...)
	if _, err := c.replace(ref.Lists()); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("2001:db8:aa::1")
	trie.check = func() {
		if got := trie.lookup(a); got&1 == 0 {
			t.Fatalf("%v unlisted from set 0 during the reload (mask %b)", a, got)
		}
	}
	ref = cidrtest.Sets{}
	ref.Add(0, pfx("2001:db8:aa::/64")...)
	ref.Add(1, pfx("2001:db8:aa::/56")...)
	if _, err := c.replace(ref.Lists()); err != nil {
		t.Fatal(err)
	}
	trie.check = nil
	if got := trie.lookup(a); got != 0b11 {
		t.Fatalf("%v in %b after the reload, want 11", a, got)
	}

	// A reload with the same content writes nothing.
	if st, err := c.replace(ref.Lists()); err != nil || st.V6Writes != 0 {
		t.Fatalf("same-content reload: %d writes, %v", st.V6Writes, err)
	}
}
