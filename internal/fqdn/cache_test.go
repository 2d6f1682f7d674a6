package fqdn

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func matchName(t testing.TB, n string) Selector {
	t.Helper()
	s, err := NewSelector(n, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func matchPattern(t testing.TB, p string) Selector {
	t.Helper()
	s, err := NewSelector("", p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func wantAddrs(t *testing.T, c *Cache, now time.Time, s Selector, want ...string) {
	t.Helper()
	if got := c.Addrs(now, s); !slices.Equal(got, addrs(want...)) {
		t.Errorf("Addrs(%v, %v) = %v, want %v", now.Sub(t0), s, got, want)
	}
}

func wantZombies(t *testing.T, c *Cache, want ...string) {
	t.Helper()
	if got := c.Zombies(); !slices.Equal(got, addrs(want...)) {
		t.Errorf("Zombies() = %v, want %v", got, want)
	}
}

func inUseOf(ss ...string) func(netip.Addr) bool {
	set := make(map[netip.Addr]bool)
	for _, a := range addrs(ss...) {
		set[a] = true
	}
	return func(a netip.Addr) bool { return set[a] }
}

func TestConfigDefaults(t *testing.T) {
	got := NewCache(Config{}).Config()
	want := Config{
		Grace: DefaultGrace, MinTTL: DefaultMinTTL, MaxTTL: DefaultMaxTTL,
		MaxNames: DefaultMaxNames, MaxAddrsPerName: DefaultMaxAddrsPerName,
		MaxEntries: DefaultMaxEntries, MaxZombies: DefaultMaxZombies,
	}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	got = NewCache(Config{Grace: -1, MinTTL: -1, MaxEntries: 10, MaxNames: -3}).Config()
	if got.Grace != 0 || got.MinTTL != 0 || got.MaxAddrsPerName != 10 || got.MaxNames != DefaultMaxNames {
		t.Errorf("negative durations, small MaxEntries: %+v", got)
	}
}

func TestExpiryBoundary(t *testing.T) {
	c := NewCache(Config{Grace: 60 * time.Second})
	api := matchName(t, "api.example.com")
	c.Learn(t0, "api.example.com", addrs("192.0.2.1"), 30*time.Second)
	end := t0.Add(90 * time.Second)
	if got := c.NextExpiry(); !got.Equal(end) {
		t.Errorf("NextExpiry() = %v, want %v", got, end)
	}
	for _, tc := range []struct {
		at   time.Time
		live bool
	}{
		{t0, true},
		{end.Add(-time.Nanosecond), true},
		{end, false},
		{end.Add(time.Nanosecond), false},
	} {
		var want []string
		if tc.live {
			want = []string{"192.0.2.1"}
		}
		wantAddrs(t, c, tc.at, api, want...)
		if got := c.Names(tc.at, netip.MustParseAddr("192.0.2.1")); tc.live != (len(got) == 1) {
			t.Errorf("Names at %v = %v, want live %v", tc.at.Sub(t0), got, tc.live)
		}
	}
	if c.Expire(end.Add(-time.Nanosecond), nil) {
		t.Error("Expire before the expiry reported a change")
	}
	if st := c.Stats(); st.Entries != 1 {
		t.Errorf("Expire before the expiry dropped the pair: %+v", st)
	}
	if !c.Expire(end, nil) {
		t.Error("Expire at the expiry reported no change")
	}
	if st := c.Stats(); st.Entries != 0 || st.Names != 0 || st.Addrs != 0 {
		t.Errorf("after Expire at the expiry: %+v", st)
	}
	if !c.NextExpiry().IsZero() {
		t.Errorf("NextExpiry() of an empty cache = %v", c.NextExpiry())
	}
}

func TestTTLClamp(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		ttl  time.Duration
		want time.Duration // from learning to expiry
	}{
		{Config{Grace: 10 * time.Second, MinTTL: 5 * time.Second}, 0, 15 * time.Second},
		{Config{Grace: 10 * time.Second, MinTTL: 5 * time.Second}, -time.Hour, 15 * time.Second},
		{Config{Grace: 10 * time.Second, MinTTL: 5 * time.Second}, 7 * time.Second, 17 * time.Second},
		{Config{Grace: 10 * time.Second, MaxTTL: time.Hour}, 2 * time.Hour, time.Hour + 10*time.Second},
		{Config{}, 48 * time.Hour, DefaultMaxTTL + DefaultGrace},
		{Config{}, 0, DefaultMinTTL + DefaultGrace},
		{Config{Grace: -1, MinTTL: -1}, 3 * time.Second, 3 * time.Second},
		{Config{Grace: -1, MinTTL: time.Hour, MaxTTL: time.Minute}, 0, time.Minute},
	} {
		c := NewCache(tc.cfg)
		c.Learn(t0, "a.example.com", addrs("192.0.2.1"), tc.ttl)
		if got := c.NextExpiry().Sub(t0); got != tc.want {
			t.Errorf("%+v, TTL %v: expires after %v, want %v", tc.cfg, tc.ttl, got, tc.want)
		}
	}
	// Neither grace nor MinTTL, TTL 0: never live, not stored.
	c := NewCache(Config{Grace: -1, MinTTL: -1})
	if c.Learn(t0, "a.example.com", addrs("192.0.2.1"), 0) || c.Stats().Entries != 0 {
		t.Errorf("an answer dead on arrival was stored: %+v", c.Stats())
	}
}

func TestLearnReportsChange(t *testing.T) {
	c := NewCache(Config{Grace: 10 * time.Second, MinTTL: time.Second})
	steps := []struct {
		at    time.Duration
		name  string
		addrs []string
		ttl   time.Duration
		want  bool
	}{
		{0, "api.example.com", []string{"192.0.2.1"}, 30 * time.Second, true},                // new name
		{1 * time.Second, "api.example.com", []string{"192.0.2.1"}, 30 * time.Second, false}, // extended
		{2 * time.Second, "API.Example.COM.", []string{"192.0.2.1"}, 5 * time.Second, false}, // shorter: kept
		{3 * time.Second, "api.example.com", []string{"192.0.2.1", "192.0.2.2"}, 30 * time.Second, true},
		{4 * time.Second, "api.example.com", []string{"192.0.2.2", "192.0.2.1"}, 30 * time.Second, false},
		{5 * time.Second, "web.example.com", []string{"192.0.2.1"}, 30 * time.Second, true}, // same address, new name
		{6 * time.Second, "api.example.com", []string{"::ffff:192.0.2.2"}, 30 * time.Second, false},
		{7 * time.Second, "api.example.com", []string{"2001:db8::1"}, 30 * time.Second, true},
		{8 * time.Second, "bad name.example.com", []string{"192.0.2.9"}, 30 * time.Second, false},
		{9 * time.Second, "api.example.com", nil, 30 * time.Second, false},
		// 192.0.2.1 of web expired at 45 s, not dropped yet: learning it again is a change.
		{50 * time.Second, "web.example.com", []string{"192.0.2.1"}, 30 * time.Second, true},
	}
	for i, s := range steps {
		if got := c.Learn(t0.Add(s.at), s.name, addrs(s.addrs...), s.ttl); got != s.want {
			t.Errorf("step %d: Learn(%q, %v) = %v, want %v", i, s.name, s.addrs, got, s.want)
		}
		if err := c.check(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if got := c.expiresOf("api.example.com", netip.MustParseAddr("192.0.2.1")); !got.Equal(t0.Add(44 * time.Second)) {
		t.Errorf("api 192.0.2.1 expires at %v, want the latest expiry, 44 s", got.Sub(t0))
	}
	if c.Stats().Refused != 1 {
		t.Errorf("Refused = %d, want 1 (the bad name)", c.Stats().Refused)
	}
	if c.Learn(t0, "a.example.com", []netip.Addr{{}, netip.MustParseAddr("fe80::1%eth0")}, time.Minute) {
		t.Error("Learn of invalid addresses reported a change")
	}
	if c.Stats().Refused != 3 {
		t.Errorf("Refused = %d, want 3", c.Stats().Refused)
	}
}

// expiresOf gives the expiry of the pair (name, a), or the zero time.
func (c *Cache) expiresOf(name string, a netip.Addr) time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e := c.st.names[Canonical(name)]; e != nil {
		if p := e.addrs[a.Unmap()]; p != nil {
			return p.expires
		}
	}
	return time.Time{}
}

func TestAddrsAndNames(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1})
	c.Learn(t0, "a.example.com", addrs("192.0.2.3", "2001:db8::1", "192.0.2.1"), time.Minute)
	c.Learn(t0, "b.example.com", addrs("192.0.2.1", "::ffff:192.0.2.2"), 2*time.Minute)
	c.Learn(t0, "x.b.example.com", addrs("192.0.2.4"), time.Minute)
	c.Learn(t0, "example.org", addrs("198.51.100.1"), time.Minute)

	wantAddrs(t, c, t0, matchName(t, "A.example.com."), "192.0.2.1", "192.0.2.3", "2001:db8::1")
	wantAddrs(t, c, t0, matchPattern(t, "*.example.com"), "192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::1")
	wantAddrs(t, c, t0, matchPattern(t, "**.example.com"), "192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "2001:db8::1")
	wantAddrs(t, c, t0, matchPattern(t, "*"), "192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4", "198.51.100.1", "2001:db8::1")
	wantAddrs(t, c, t0, matchName(t, "c.example.com"))
	wantAddrs(t, c, t0, Selector{})

	names := func(at time.Time, a string, want ...string) {
		t.Helper()
		if got := c.Names(at, netip.MustParseAddr(a)); !slices.Equal(got, want) {
			t.Errorf("Names(%v, %s) = %q, want %q", at.Sub(t0), a, got, want)
		}
	}
	names(t0, "192.0.2.1", "a.example.com", "b.example.com")
	names(t0, "::ffff:192.0.2.1", "a.example.com", "b.example.com")
	names(t0, "192.0.2.2", "b.example.com")
	names(t0, "192.0.2.9")

	// a expires at 1 min, b at 2 min: the shared address stays live for b.
	later := t0.Add(90 * time.Second)
	wantAddrs(t, c, later, matchName(t, "a.example.com"))
	wantAddrs(t, c, later, matchName(t, "b.example.com"), "192.0.2.1", "192.0.2.2")
	names(later, "192.0.2.1", "b.example.com")
	if !c.Expire(later, inUseOf("192.0.2.1", "192.0.2.3")) {
		t.Error("Expire dropped pairs but reported no change")
	}
	wantAddrs(t, c, later, matchPattern(t, "*.example.com"), "192.0.2.1", "192.0.2.2")
	// 192.0.2.1 is still held by b: not a zombie although in use; 192.0.2.3 is one.
	wantZombies(t, c, "192.0.2.3")
	if st := c.Stats(); st.Names != 1 || st.Entries != 2 || st.Addrs != 2 || st.Zombies != 1 {
		t.Errorf("after Expire: %+v", st)
	}
}

func TestZombies(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1, MaxZombies: 2})
	c.Learn(t0, "a.example.com", addrs("192.0.2.1", "192.0.2.2", "192.0.2.3"), time.Minute)
	at := t0.Add(time.Minute)
	if !c.Expire(at, inUseOf("192.0.2.1", "192.0.2.2")) {
		t.Error("Expire reported no change")
	}
	wantZombies(t, c, "192.0.2.1", "192.0.2.2")
	wantAddrs(t, c, at, matchName(t, "a.example.com"))
	if got := c.Names(at, netip.MustParseAddr("192.0.2.1")); got != nil {
		t.Errorf("Names of a zombie = %q", got)
	}
	if !c.NextExpiry().IsZero() {
		t.Errorf("zombies have no expiry to schedule, NextExpiry() = %v", c.NextExpiry())
	}
	// Still in use: kept, nothing changed.
	if c.Expire(at.Add(time.Second), inUseOf("192.0.2.1", "192.0.2.2")) {
		t.Error("Expire with the same zombies in use reported a change")
	}
	// 192.0.2.2 closed its connection.
	if !c.Expire(at.Add(2*time.Second), inUseOf("192.0.2.1")) {
		t.Error("Expire dropping a zombie reported no change")
	}
	wantZombies(t, c, "192.0.2.1")
	// Learnt again: live, no longer a zombie.
	if !c.Learn(at.Add(3*time.Second), "b.example.com", addrs("192.0.2.1"), time.Minute) {
		t.Error("learning a zombie again reported no change")
	}
	wantZombies(t, c)
	wantAddrs(t, c, at.Add(3*time.Second), matchName(t, "b.example.com"), "192.0.2.1")

	// MaxZombies: the oldest (earliest expiry) go first.
	c.Learn(at, "c.example.com", addrs("198.51.100.1"), time.Second)
	c.Learn(at, "c.example.com", addrs("198.51.100.2"), 2*time.Second)
	c.Learn(at, "c.example.com", addrs("198.51.100.3"), 3*time.Second)
	c.Expire(at.Add(10*time.Second), inUseOf("198.51.100.1", "198.51.100.2", "198.51.100.3"))
	wantZombies(t, c, "198.51.100.2", "198.51.100.3")
	if st := c.Stats(); st.EvictedZombies != 1 {
		t.Errorf("EvictedZombies = %d, want 1", st.EvictedZombies)
	}
}

func TestMaxNames(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1, MaxNames: 2})
	c.Learn(t0, "a.example.com", addrs("192.0.2.1"), 3*time.Minute)
	c.Learn(t0, "b.example.com", addrs("192.0.2.2", "192.0.2.22"), time.Minute)
	c.Learn(t0, "b.example.com", addrs("192.0.2.22"), 4*time.Minute) // b leaves last now
	// c would leave first of the three: it is the one that goes.
	if c.Learn(t0, "c.example.com", addrs("192.0.2.3"), time.Minute) {
		t.Error("a name evicted at once reported a change")
	}
	if names := c.names(); !slices.Equal(names, []string{"a.example.com", "b.example.com"}) {
		t.Errorf("names %q", names)
	}
	wantZombies(t, c) // c's address was never admitted
	// d leaves after a: a goes, with its address becoming a zombie until Expire asks.
	if !c.Learn(t0, "d.example.com", addrs("192.0.2.4"), 5*time.Minute) {
		t.Error("evicting a live name reported no change")
	}
	if names := c.names(); !slices.Equal(names, []string{"b.example.com", "d.example.com"}) {
		t.Errorf("names %q", names)
	}
	wantZombies(t, c, "192.0.2.1")
	if st := c.Stats(); st.EvictedNames != 2 {
		t.Errorf("EvictedNames = %d, want 2", st.EvictedNames)
	}
	c.Expire(t0, inUseOf("192.0.2.2"))
	wantZombies(t, c)
}

func (c *Cache) names() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for n := range c.st.names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func TestMaxAddrsPerName(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1, MaxAddrsPerName: 3})
	c.Learn(t0, "a.example.com", addrs("192.0.2.1", "192.0.2.2"), 2*time.Minute)
	c.Learn(t0, "a.example.com", addrs("192.0.2.3"), time.Minute)
	c.Learn(t0, "b.example.com", addrs("192.0.2.3"), time.Minute)
	// Four addresses: 192.0.2.3 expires first and goes (b still holds it).
	if !c.Learn(t0, "a.example.com", addrs("192.0.2.4"), 3*time.Minute) {
		t.Error("Learn reported no change")
	}
	wantAddrs(t, c, t0, matchName(t, "a.example.com"), "192.0.2.1", "192.0.2.2", "192.0.2.4")
	wantZombies(t, c)
	// An answer larger than the bound: ties go by address, the lowest first. The new
	// addresses evicted at once were never admitted: no zombies.
	if !c.Learn(t0, "a.example.com", addrs("198.51.100.5", "198.51.100.4", "198.51.100.3", "198.51.100.2", "198.51.100.1"), time.Hour) {
		t.Error("Learn reported no change")
	}
	wantAddrs(t, c, t0, matchName(t, "a.example.com"), "198.51.100.3", "198.51.100.4", "198.51.100.5")
	wantZombies(t, c, "192.0.2.1", "192.0.2.2", "192.0.2.4")
	// A new address that would expire first goes at once: nothing changed.
	if c.Learn(t0, "a.example.com", addrs("203.0.113.1"), time.Minute) {
		t.Error("an address evicted at once reported a change")
	}
	if st := c.Stats(); st.EvictedEntries != 1+5+1 {
		t.Errorf("EvictedEntries = %d, want 7", st.EvictedEntries)
	}
}

func TestMaxEntries(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1, MaxEntries: 3})
	c.Learn(t0, "a.example.com", addrs("192.0.2.1"), 3*time.Minute)
	c.Learn(t0, "b.example.com", addrs("192.0.2.2", "192.0.2.3"), time.Minute)
	c.Learn(t0, "c.example.com", addrs("192.0.2.4"), 2*time.Minute)
	// The pair to expire first goes: b's first address (the lower of two).
	wantAddrs(t, c, t0, matchPattern(t, "*.example.com"), "192.0.2.1", "192.0.2.3", "192.0.2.4")
	wantZombies(t, c, "192.0.2.2")
	if st := c.Stats(); st.Entries != 3 || st.EvictedEntries != 1 {
		t.Errorf("%+v", st)
	}
	// A name's last pair evicted takes the name with it.
	c.Learn(t0, "d.example.com", addrs("192.0.2.5", "192.0.2.6"), 4*time.Minute)
	if got := c.names(); !slices.Equal(got, []string{"a.example.com", "d.example.com"}) {
		t.Errorf("names %q", got)
	}
}

func TestZombiesSeenInUseStay(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1, MaxNames: 1, MaxZombies: 2})
	c.Learn(t0, "a.example.com", addrs("192.0.2.1"), time.Second)
	c.Expire(t0.Add(time.Second), inUseOf("192.0.2.1"))
	// A flood of names: each evicts the one before, whose address waits as a zombie.
	for i := range 10 {
		c.Learn(t0.Add(time.Second), fmt.Sprintf("r%d.example.net", i), addrs(fmt.Sprintf("203.0.113.%d", i)), time.Duration(i+10)*time.Second)
	}
	wantZombies(t, c, "192.0.2.1", "203.0.113.8")
}

func TestSnapshotRestore(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1})
	c.Learn(t0, "b.example.com", addrs("2001:db8::2", "192.0.2.2"), time.Minute)
	c.Learn(t0, "a.example.com", addrs("192.0.2.2", "192.0.2.1"), 2*time.Minute)
	c.Learn(t0, "z.example.com", addrs("192.0.2.9"), time.Second)
	c.Expire(t0.Add(time.Second), inUseOf("192.0.2.9"))
	snap := c.Snapshot()
	want := []Entry{
		{Name: "a.example.com", Addr: netip.MustParseAddr("192.0.2.1"), Expires: t0.Add(2 * time.Minute)},
		{Name: "a.example.com", Addr: netip.MustParseAddr("192.0.2.2"), Expires: t0.Add(2 * time.Minute)},
		{Name: "b.example.com", Addr: netip.MustParseAddr("192.0.2.2"), Expires: t0.Add(time.Minute)},
		{Name: "b.example.com", Addr: netip.MustParseAddr("2001:db8::2"), Expires: t0.Add(time.Minute)},
		{Addr: netip.MustParseAddr("192.0.2.9"), Expires: t0.Add(time.Second), Zombie: true},
	}
	if !slices.Equal(snap, want) {
		t.Fatalf("Snapshot() = %+v\nwant %+v", snap, want)
	}
	js, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `[{"name":"a.example.com","addr":"192.0.2.1","expires":"2026-12-07T10:02:00Z"},` +
		`{"name":"a.example.com","addr":"192.0.2.2","expires":"2026-12-07T10:02:00Z"},` +
		`{"name":"b.example.com","addr":"192.0.2.2","expires":"2026-12-07T10:01:00Z"},` +
		`{"name":"b.example.com","addr":"2001:db8::2","expires":"2026-12-07T10:01:00Z"},` +
		`{"addr":"192.0.2.9","expires":"2026-12-07T10:00:01Z","zombie":true}]`
	if string(js) != wantJSON {
		t.Errorf("JSON %s\nwant %s", js, wantJSON)
	}
	var back []Entry
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	d := NewCache(Config{Grace: -1, MinTTL: -1})
	d.Learn(t0, "gone.example.com", addrs("203.0.113.1"), time.Hour)
	if err := d.Restore(back); err != nil {
		t.Fatal(err)
	}
	if err := d.check(); err != nil {
		t.Fatal(err)
	}
	if got := d.Snapshot(); !slices.Equal(got, want) {
		t.Errorf("Snapshot() after Restore = %+v\nwant %+v", got, want)
	}
	wantAddrs(t, d, t0, matchPattern(t, "*"), "192.0.2.1", "192.0.2.2", "2001:db8::2")
	wantZombies(t, d, "192.0.2.9")
	if !d.NextExpiry().Equal(t0.Add(time.Minute)) {
		t.Errorf("NextExpiry() after Restore = %v", d.NextExpiry())
	}
}

func TestRestoreRefuses(t *testing.T) {
	exp := t0.Add(time.Minute)
	good := Entry{Name: "a.example.com", Addr: netip.MustParseAddr("192.0.2.1"), Expires: exp}
	for _, tc := range []struct {
		entries []Entry
		want    string
	}{
		{[]Entry{good, {Name: "A.example.com", Addr: good.Addr, Expires: exp}}, `entry 1 ("A.example.com" 192.0.2.1): name is not canonical`},
		{[]Entry{{Name: "a.example.com.", Addr: good.Addr, Expires: exp}}, `entry 0 ("a.example.com." 192.0.2.1): name is not canonical`},
		{[]Entry{{Name: "a..com", Addr: good.Addr, Expires: exp}}, `entry 0 ("a..com" 192.0.2.1): name: empty label`},
		{[]Entry{{Name: "", Addr: good.Addr, Expires: exp}}, `entry 0 ("" 192.0.2.1): name: empty label`},
		{[]Entry{{Name: "a b.com", Addr: good.Addr, Expires: exp}}, `name: character ' ' is not allowed`},
		{[]Entry{{Name: strings.Repeat("a.", 127) + "com", Addr: good.Addr, Expires: exp}}, `name: longer than 253 characters`},
		{[]Entry{{Name: "a.example.com", Expires: exp}}, `entry 0 ("a.example.com" invalid IP): no address`},
		{[]Entry{{Name: "a.example.com", Addr: netip.MustParseAddr("fe80::1%eth0"), Expires: exp}}, `address has a zone`},
		{[]Entry{{Name: "a.example.com", Addr: netip.MustParseAddr("::ffff:192.0.2.1"), Expires: exp}}, `address is IPv4-mapped: write it as 192.0.2.1`},
		{[]Entry{{Name: "a.example.com", Addr: good.Addr}}, `entry 0 ("a.example.com" 192.0.2.1): no expiry`},
		{[]Entry{good, good}, `entry 1 ("a.example.com" 192.0.2.1): not after entry 0 ("a.example.com" 192.0.2.1)`},
		{[]Entry{{Name: "b.example.com", Addr: good.Addr, Expires: exp}, good}, `entry 1 ("a.example.com" 192.0.2.1): not after entry 0`},
		{[]Entry{{Addr: good.Addr, Expires: exp, Zombie: true}, good}, `entry 1 ("a.example.com" 192.0.2.1): not after entry 0 (zombie 192.0.2.1)`},
		{[]Entry{{Name: "a.example.com", Addr: good.Addr, Expires: exp, Zombie: true}}, `entry 0 (zombie 192.0.2.1): a zombie has no name`},
		{[]Entry{good, {Addr: good.Addr, Expires: exp, Zombie: true}}, `entry 1 (zombie 192.0.2.1): the address is also learnt for "a.example.com"`},
	} {
		c := NewCache(Config{})
		c.Learn(t0, "kept.example.com", addrs("203.0.113.1"), time.Hour)
		before := c.Snapshot()
		err := c.Restore(tc.entries)
		if err == nil || !strings.HasPrefix(err.Error(), "restore fqdn cache: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Restore(%+v) = %v, want an error with %q", tc.entries, err, tc.want)
		}
		if after := c.Snapshot(); !slices.Equal(after, before) {
			t.Errorf("a refused Restore changed the cache: %+v", after)
		}
	}
}

func TestRestoreBounds(t *testing.T) {
	var entries []Entry
	for i := range 100 {
		name := fmt.Sprintf("n%03d.example.com", i)
		for j := range 10 {
			entries = append(entries, Entry{Name: name, Addr: netip.AddrFrom4([4]byte{10, 0, byte(i), byte(j)}), Expires: t0.Add(time.Duration(i*10+j) * time.Second)})
		}
	}
	for i := range 100 {
		entries = append(entries, Entry{Addr: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Expires: t0, Zombie: true})
	}
	c := NewCache(Config{MaxNames: 20, MaxAddrsPerName: 4, MaxEntries: 50, MaxZombies: 30})
	if err := c.Restore(entries); err != nil {
		t.Fatal(err)
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Names > 20 || st.Entries > 50 || st.Zombies != 30 {
		t.Errorf("bounds not held: %+v", st)
	}
	// The names that leave last stay: n099 down to n087 (4 addresses each: 13 names, 52
	// pairs, so the 2 first to expire of n087 go too).
	if names := c.names(); len(names) != 13 || names[0] != "n087.example.com" || names[12] != "n099.example.com" {
		t.Errorf("names %q", names)
	}
	if st.Entries != 50 {
		t.Errorf("Entries = %d, want 50", st.Entries)
	}
}

func TestConcurrentUse(t *testing.T) {
	c := NewCache(Config{Grace: -1, MinTTL: -1, MaxNames: 64, MaxZombies: 16})
	pattern := matchPattern(t, "*.example.com")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				now := t0.Add(time.Duration(i) * time.Second)
				name := fmt.Sprintf("n%d.example.com", (g*7+i)%100)
				c.Learn(now, name, addrs(fmt.Sprintf("192.0.2.%d", i%50), fmt.Sprintf("2001:db8::%x", i%70)), time.Duration(i%9)*time.Second)
				c.Addrs(now, pattern)
				c.Names(now, netip.MustParseAddr("192.0.2.1"))
				if i%10 == g {
					c.Expire(now, func(a netip.Addr) bool { return a.Is4() })
				}
				if i%100 == g {
					if err := c.Restore(c.Snapshot()); err != nil {
						t.Error(err)
					}
				}
				c.Zombies()
				c.NextExpiry()
				c.Stats()
			}
		})
	}
	wg.Wait()
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
}

// check verifies the cache's internal consistency and bounds.
func (c *Cache) check() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st, cfg := c.st, c.cfg
	if len(st.names) > cfg.MaxNames || st.entries > cfg.MaxEntries || len(st.zombies) > cfg.MaxZombies {
		return fmt.Errorf("bounds: %d names, %d entries, %d zombies; config %+v", len(st.names), st.entries, len(st.zombies), cfg)
	}
	entries := 0
	for n, e := range st.names {
		if e.name != n || Canonical(n) != n || checkName(n, false) != nil {
			return fmt.Errorf("name %q held as %q", e.name, n)
		}
		if len(e.addrs) == 0 || len(e.addrs) > cfg.MaxAddrsPerName {
			return fmt.Errorf("name %q has %d addresses", n, len(e.addrs))
		}
		var latest time.Time
		for a, p := range e.addrs {
			if p.addr != a || p.name != e || !a.IsValid() || a.Zone() != "" || a.Is4In6() {
				return fmt.Errorf("pair %q %v held as %v", n, p.addr, a)
			}
			if st.byExpiry.items[p.heapIndex] != p {
				return fmt.Errorf("pair %q %v not at its heap index", n, a)
			}
			latest = later(latest, p.expires)
			entries++
		}
		if !e.latest.Equal(latest) {
			return fmt.Errorf("name %q: latest %v, want %v", n, e.latest, latest)
		}
		if st.byLatest.items[e.heapIndex] != e {
			return fmt.Errorf("name %q not at its heap index", n)
		}
	}
	if entries != st.entries || st.byExpiry.Len() != entries || st.byLatest.Len() != len(st.names) {
		return fmt.Errorf("%d pairs, counted %d, %d in the heap; %d names, %d in the heap", entries, st.entries, st.byExpiry.Len(), len(st.names), st.byLatest.Len())
	}
	linked := 0
	for a, first := range st.holders {
		if first.prevSameAddr != nil {
			return fmt.Errorf("holders of %v do not start at the first", a)
		}
		for p := first; p != nil; p = p.nextSameAddr {
			if p.addr != a || p.name.addrs[a] != p || (p.nextSameAddr != nil && p.nextSameAddr.prevSameAddr != p) {
				return fmt.Errorf("holders of %v badly linked", a)
			}
			linked++
		}
		if st.zombies[a] != nil {
			return fmt.Errorf("%v is held and a zombie", a)
		}
	}
	if linked != entries {
		return fmt.Errorf("%d pairs linked by address, %d held", linked, entries)
	}
	if len(st.zombies) != st.byAge.Len() {
		return fmt.Errorf("%d zombies, %d in the heap", len(st.zombies), st.byAge.Len())
	}
	for a, z := range st.zombies {
		if z.addr != a || st.byAge.items[z.heapIndex] != z {
			return fmt.Errorf("zombie %v badly indexed", a)
		}
	}
	if err := checkHeap(&st.byExpiry); err != nil {
		return fmt.Errorf("byExpiry: %w", err)
	}
	if err := checkHeap(&st.byLatest); err != nil {
		return fmt.Errorf("byLatest: %w", err)
	}
	if err := checkHeap(&st.byAge); err != nil {
		return fmt.Errorf("byAge: %w", err)
	}
	return nil
}

func checkHeap[T heapElement[T]](h *indexedHeap[T]) error {
	for i, x := range h.items {
		if *x.index() != i {
			return fmt.Errorf("element %d has index %d", i, *x.index())
		}
		if i > 0 && x.less(h.items[(i-1)/2]) {
			return errors.New("not a heap")
		}
	}
	return nil
}

// BenchmarkLearnFlood is a pod resolving a new name each time, the cache full: every Learn
// evicts a name.
func BenchmarkLearnFlood(b *testing.B) {
	c := NewCache(Config{})
	a := addrs("203.0.113.1")
	i := 0
	for b.Loop() {
		c.Learn(t0.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("r%d.example.net", i), a, time.Minute)
		i++
	}
	if st := c.Stats(); st.Names > DefaultMaxNames {
		b.Fatalf("%+v", st)
	}
}

// BenchmarkAddrsPattern is a MatchPattern selector against a full cache.
func BenchmarkAddrsPattern(b *testing.B) {
	c := NewCache(Config{})
	for i := range DefaultMaxNames {
		c.Learn(t0, fmt.Sprintf("n%d.example%d.com", i, i%16), []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}, time.Hour)
	}
	s := matchPattern(b, "*.example3.com")
	for b.Loop() {
		if got := c.Addrs(t0, s); len(got) != DefaultMaxNames/16 {
			b.Fatalf("%d addresses", len(got))
		}
	}
}
