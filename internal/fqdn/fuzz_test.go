package fqdn

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The names, addresses and selectors FuzzCache draws from: few, so that operations meet
// on the same names and addresses, with invalid ones among them.
var (
	fuzzNames = []string{
		"a.example.com", "A.Example.COM.", "b.example.com", "x.b.example.com", "example.com",
		"c.example.org", "_srv._tcp.example.com", "d-1.example.com", "e.example.net",
		"bad name.example.com", "", "a..b", strings.Repeat("x", 64) + ".com", "*.example.com",
	}
	fuzzValidNames = map[string]bool{
		"a.example.com": true, "b.example.com": true, "x.b.example.com": true, "example.com": true,
		"c.example.org": true, "_srv._tcp.example.com": true, "d-1.example.com": true, "e.example.net": true,
	}
	fuzzAddrs = []netip.Addr{
		netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3"),
		netip.MustParseAddr("::ffff:192.0.2.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2"),
		netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("::"),
		netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8::ffff:1"), netip.MustParseAddr("10.0.0.1"),
		netip.MustParseAddr("fe80::1%eth0"), {},
	}
	fuzzPatterns = []string{"*", "*.example.com", "**.example.com", "*.b.example.com", "*xample.*", "_srv.*.example.com"}
)

// fuzzSelectors are a selector for each valid name and pattern of the pools.
var fuzzSelectors = sync.OnceValue(func() []Selector {
	var out []Selector
	for n := range fuzzValidNames {
		s, err := NewSelector(n, "")
		if err != nil {
			panic(err)
		}
		out = append(out, s)
	}
	for _, p := range fuzzPatterns {
		s, err := NewSelector("", p)
		if err != nil {
			panic(err)
		}
		out = append(out, s)
	}
	return out
})

// fuzzBytes hands out the fuzzer's bytes, zeros once they run out.
type fuzzBytes []byte

func (b *fuzzBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	v := (*b)[0]
	*b = (*b)[1:]
	return v
}

// FuzzCache runs a sequence of operations the input encodes (Learn, the clock moving,
// Expire with some addresses in use, Restore of the cache's own snapshot, of one spoilt,
// and of entries made up) on a cache with small bounds, and after each checks the cache
// against what its Snapshot says it holds: bounds, sorted and distinct answers, Addrs and
// Names exactly the live pairs, Zombies held by no name, Learn's and Expire's reports, and
// the internal indexes. Seeds: below and testdata/fuzz/FuzzCache.
func FuzzCache(f *testing.F) {
	f.Add([]byte{0, 0, 2, 0, 4, 30, 1, 50, 2, 0xff, 0xff, 3})
	f.Add([]byte{0, 1, 3, 0, 3, 6, 40, 0, 2, 1, 4, 50, 0, 4, 2, 9, 10, 60, 1, 200, 2, 1, 0, 4, 8})
	f.Add([]byte{4, 12, 0, 0, 0, 40, 1, 2, 3, 50, 2, 5, 9, 60, 0x80, 0, 1, 70, 5, 0, 5, 1})
	f.Add([]byte("learn, learn, expire, restore: any bytes make a sequence of operations"))
	f.Fuzz(runCacheOps)
}

// runCacheOps is FuzzCache's body.
func runCacheOps(t *testing.T, data []byte) {
	{
		// Small bounds, from the first two bytes, so that every bound is met.
		in := fuzzBytes(data)
		b := int(in.next())
		cfg := Config{Grace: 2 * time.Second, MinTTL: time.Second, MaxTTL: 20 * time.Second,
			MaxNames: 1 + b%5, MaxAddrsPerName: 1 + b/5%4, MaxEntries: 2 + b/20%10, MaxZombies: 1 + int(in.next())%5}
		c := NewCache(cfg)
		now := t0
		for step := 0; len(in) > 0 && step < 300; step++ {
			switch op := in.next(); op % 6 {
			case 0: // learn
				name := fuzzNames[int(in.next())%len(fuzzNames)]
				n := int(in.next()) % 5
				var as []netip.Addr
				for range n {
					as = append(as, fuzzAddrs[int(in.next())%len(fuzzAddrs)])
				}
				ttl := time.Duration(int(in.next())-20) * 250 * time.Millisecond
				before := liveView(c, now)
				got := c.Learn(now, name, as, ttl)
				if after := liveView(c, now); got != (after != before) {
					t.Fatalf("step %d: Learn(%q, %v, %v) = %v, but live view\n%s\nbecame\n%s", step, name, as, ttl, got, before, after)
				}
			case 1: // the clock moves
				now = now.Add(time.Duration(in.next()) * 100 * time.Millisecond)
			case 2: // expire
				mask := uint16(in.next()) | uint16(in.next())<<8
				inUse := func(a netip.Addr) bool {
					for i, b := range fuzzAddrs {
						if b.Unmap() == a {
							return mask&(1<<i) != 0
						}
					}
					t.Fatalf("inUse asked about %v, never learnt", a)
					return false
				}
				before, evictedBefore := c.Snapshot(), c.Stats().EvictedZombies
				got := c.Expire(now, inUse)
				after := c.Snapshot()
				if got == slices.Equal(before, after) {
					t.Fatalf("step %d: Expire = %v, snapshot\n%v\nbecame\n%v", step, got, before, after)
				}
				held := make(map[netip.Addr]bool)
				for _, e := range after {
					if !e.Zombie {
						if !e.Expires.After(now) {
							t.Fatalf("step %d: Expire left %+v", step, e)
						}
						held[e.Addr] = true
					} else if !inUse(e.Addr) {
						t.Fatalf("step %d: zombie %v not in use", step, e.Addr)
					}
				}
				zombies := c.Zombies()
				for _, e := range before {
					if !e.Zombie && !e.Expires.After(now) && !held[e.Addr] && inUse(e.Addr) &&
						!slices.Contains(zombies, e.Addr) && c.Stats().EvictedZombies == evictedBefore {
						t.Fatalf("step %d: %v expired in use but is no zombie", step, e.Addr)
					}
				}
			case 3: // the snapshot's round trip through JSON, into the cache and a new one
				snap := c.Snapshot()
				js, err := json.Marshal(snap)
				if err != nil {
					t.Fatal(err)
				}
				var back []Entry
				if err := json.Unmarshal(js, &back); err != nil {
					t.Fatal(err)
				}
				d := NewCache(cfg)
				if err := d.Restore(back); err != nil {
					t.Fatalf("step %d: Restore of a snapshot: %v", step, err)
				}
				if got := d.Snapshot(); !slices.Equal(got, snap) {
					t.Fatalf("step %d: snapshot\n%v\nrestored as\n%v", step, snap, got)
				}
				if err := c.Restore(back); err != nil {
					t.Fatalf("step %d: Restore of its own snapshot: %v", step, err)
				}
			case 4: // a snapshot spoilt: out of order, or an entry twice
				snap := c.Snapshot()
				if len(snap) == 0 {
					continue
				}
				i := int(in.next()) % len(snap)
				if in.next()%2 == 0 && i+1 < len(snap) {
					snap[i], snap[i+1] = snap[i+1], snap[i]
				} else {
					snap = slices.Insert(snap, i, snap[i])
				}
				before := c.Snapshot()
				if err := c.Restore(snap); err == nil || !strings.HasPrefix(err.Error(), "restore fqdn cache: entry ") {
					t.Fatalf("step %d: Restore of %v = %v, want an error", step, snap, err)
				}
				if after := c.Snapshot(); !slices.Equal(after, before) {
					t.Fatalf("step %d: a refused Restore changed the cache", step)
				}
			case 5: // entries made up, put in order
				var entries []Entry
				valid, conflict := true, false
				for range int(in.next()) % 24 {
					e := Entry{
						Addr:    fuzzAddrs[int(in.next())%len(fuzzAddrs)],
						Expires: now.Add(time.Duration(int(in.next())-64) * 250 * time.Millisecond),
					}
					if k := in.next(); k%5 == 0 {
						e.Zombie = true
					} else {
						e.Name = fuzzNames[int(k)%len(fuzzNames)]
					}
					entries = append(entries, e)
				}
				slices.SortFunc(entries, compareEntries)
				entries = slices.CompactFunc(entries, func(a, b Entry) bool { return compareEntries(a, b) == 0 })
				named := make(map[netip.Addr]bool)
				for _, e := range entries {
					if !e.Addr.IsValid() || e.Addr.Zone() != "" || e.Addr.Is4In6() || (!e.Zombie && !fuzzValidNames[e.Name]) {
						valid = false
					}
					if !e.Zombie {
						named[e.Addr] = true
					} else if named[e.Addr] {
						conflict = true
					}
				}
				before := c.Snapshot()
				err := c.Restore(entries)
				switch {
				case err != nil && valid && !conflict:
					t.Fatalf("step %d: Restore(%v) of valid entries: %v", step, entries, err)
				case err == nil && !valid:
					t.Fatalf("step %d: Restore(%v) took invalid entries", step, entries)
				case err != nil && !slices.Equal(c.Snapshot(), before):
					t.Fatalf("step %d: a refused Restore changed the cache", step)
				}
			}
			checkAgainstSnapshot(t, c, now)
		}
	}
}

// liveView describes what Learn may change: each name's live addresses at now, and the
// zombies.
func liveView(c *Cache, now time.Time) string {
	var b strings.Builder
	for _, e := range c.Snapshot() {
		if e.Zombie || e.Expires.After(now) {
			b.WriteString(e.Name + " " + e.Addr.String() + "\n")
		}
	}
	return b.String()
}

// checkAgainstSnapshot checks the cache's answers against its snapshot, and its indexes.
func checkAgainstSnapshot(t *testing.T, c *Cache, now time.Time) {
	t.Helper()
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	snap := c.Snapshot()
	live := make(map[string][]netip.Addr)
	namesOf := make(map[netip.Addr][]string)
	var zombies []netip.Addr
	var next time.Time
	pairs, held := 0, make(map[netip.Addr]bool)
	for i, e := range snap {
		if i > 0 && compareEntries(snap[i-1], e) >= 0 {
			t.Fatalf("snapshot out of order at %d: %v", i, snap)
		}
		if !e.Addr.IsValid() || e.Addr.Is4In6() || e.Addr.Zone() != "" {
			t.Fatalf("snapshot holds address %v", e.Addr)
		}
		if e.Zombie {
			zombies = append(zombies, e.Addr)
			continue
		}
		pairs++
		held[e.Addr] = true
		if next.IsZero() || e.Expires.Before(next) {
			next = e.Expires
		}
		if e.Expires.After(now) {
			live[e.Name] = append(live[e.Name], e.Addr)
			namesOf[e.Addr] = append(namesOf[e.Addr], e.Name)
		}
	}
	cfg := c.Config()
	st := c.Stats()
	if st.Entries != pairs || st.Zombies != len(zombies) || st.Addrs != len(held) ||
		st.Names > cfg.MaxNames || st.Entries > cfg.MaxEntries || st.Zombies > cfg.MaxZombies {
		t.Fatalf("stats %+v, snapshot %v", st, snap)
	}
	if got := c.Zombies(); !slices.Equal(got, zombies) {
		t.Fatalf("Zombies() = %v, snapshot says %v", got, zombies)
	}
	for _, z := range zombies {
		if held[z] {
			t.Fatalf("zombie %v is held by a name", z)
		}
	}
	if got := c.NextExpiry(); !got.Equal(next) {
		t.Fatalf("NextExpiry() = %v, want %v", got, next)
	}
	for _, s := range fuzzSelectors() {
		var want []netip.Addr
		for n, as := range live {
			if s.Matches(n) {
				want = append(want, as...)
			}
		}
		slices.SortFunc(want, netip.Addr.Compare)
		want = slices.Compact(want)
		got := c.Addrs(now, s)
		if !slices.Equal(got, want) {
			t.Fatalf("Addrs(%v) = %v, want the live %v", s, got, want)
		}
		for i := 1; i < len(got); i++ {
			if got[i-1].Compare(got[i]) >= 0 {
				t.Fatalf("Addrs(%v) = %v, not sorted and distinct", s, got)
			}
		}
	}
	for _, a := range fuzzAddrs {
		want := namesOf[a.Unmap()]
		slices.Sort(want)
		if got := c.Names(now, a); !slices.Equal(got, want) {
			t.Fatalf("Names(%v) = %q, want %q", a, got, want)
		}
	}
}
