package cidrtest

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// Sets is the reference: set index -> its prefixes (canonical). An address is in a set
// when one of the set's prefixes contains it; checked by trying every prefix length.
type Sets map[uint8]map[netip.Prefix]bool

// canonical is p masked, an IPv4-mapped IPv6 prefix as IPv4.
func canonical(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// Mask returns the sets containing a (bit i: set i).
func (r Sets) Mask(a netip.Addr) uint32 {
	a = a.Unmap()
	var m uint32
	for i, set := range r {
		for l := 0; l <= a.BitLen(); l++ {
			p, _ := a.Prefix(l)
			if set[p] {
				m |= 1 << i
				break
			}
		}
	}
	return m
}

// Add lists ps in set i.
func (r Sets) Add(i uint8, ps ...netip.Prefix) {
	if r[i] == nil {
		r[i] = map[netip.Prefix]bool{}
	}
	for _, p := range ps {
		r[i][canonical(p)] = true
	}
}

// Remove unlists ps from set i.
func (r Sets) Remove(i uint8, ps ...netip.Prefix) {
	for _, p := range ps {
		delete(r[i], canonical(p))
	}
}

// Lists returns the sets as prefix lists (what ReplaceCIDRSets takes).
func (r Sets) Lists() map[uint8][]netip.Prefix {
	out := map[uint8][]netip.Prefix{}
	for i, set := range r {
		l := []netip.Prefix{}
		for p := range set {
			l = append(l, p)
		}
		out[i] = l
	}
	return out
}

// Clone returns a copy of r.
func (r Sets) Clone() Sets {
	out := Sets{}
	for i, set := range r {
		out[i] = map[netip.Prefix]bool{}
		for p := range set {
			out[i][p] = true
		}
	}
	return out
}

// V4Addr is the IPv4 address a (host order).
func V4Addr(a uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], a)
	return netip.AddrFrom4(b)
}

// Hot ranges: most random prefixes fall into a few /16s so that they overlap, within a set
// and across sets.
var hot4 = []uint32{0x0A000000, 0xC6120000, 0xCB007100, 0x00000000, 0xFFFF0000}

// RandPrefix4 draws an IPv4 prefix: lengths weighted towards the edges of the two tables
// (/24, /25, /31, /32) and /0 and /8 now and then.
func RandPrefix4(r *rand.Rand) netip.Prefix {
	lens := []int{0, 8, 8, 12, 16, 16, 20, 23, 24, 24, 24, 24, 25, 25, 25, 26, 27, 28, 29, 30, 31, 31, 31, 32, 32, 32, 32, 32, 32, 32}
	l := lens[r.IntN(len(lens))]
	if l == 0 && r.IntN(8) != 0 {
		l = 32 // /0 makes its set contain everything: keep it rare
	}
	a := r.Uint32()
	switch r.IntN(5) {
	case 0:
	case 1, 2:
		a = hot4[r.IntN(len(hot4))] | a&0xffff
	default: // a few /24s of a hot range: dense nesting
		a = hot4[r.IntN(len(hot4))] | uint32(r.IntN(3))<<8 | a&0xff
	}
	p, _ := V4Addr(a).Prefix(l)
	return p
}

// RandPrefix6 draws an IPv6 prefix from a small universe, so that prefixes nest often.
func RandPrefix6(r *rand.Rand) netip.Prefix {
	lens := []int{0, 16, 32, 48, 56, 63, 64, 64, 65, 96, 112, 120, 127, 128, 128, 128}
	l := lens[r.IntN(len(lens))]
	if l == 0 && r.IntN(8) != 0 {
		l = 128
	}
	// A small universe (2 random bits per byte boundary that a length above cuts) so that
	// prefixes nest often.
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], 0x20010db800000000|uint64(r.IntN(4))<<16|uint64(r.IntN(4))<<8|uint64(r.IntN(4)))
	binary.BigEndian.PutUint64(b[8:], uint64(r.IntN(4))<<62|uint64(r.IntN(4))<<32|uint64(r.IntN(4)))
	p, _ := netip.AddrFrom16(b).Prefix(l)
	return p
}

// Samples returns addresses at and around the edges of every prefix of r, and random ones.
func Samples(r Sets, rnd *rand.Rand, random int) []netip.Addr {
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	add := func(a netip.Addr) {
		if a.IsValid() && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, set := range r {
		for p := range set {
			first := p.Addr()
			last := LastAddr(p)
			add(first)
			add(last)
			add(first.Prev())
			add(last.Next())
		}
	}
	add(netip.MustParseAddr("0.0.0.0"))
	add(netip.MustParseAddr("255.255.255.255"))
	for range random {
		a := rnd.Uint32()
		if rnd.IntN(2) == 0 {
			a = hot4[rnd.IntN(len(hot4))] | a&0xffff
		}
		add(V4Addr(a))
		p, _ := RandPrefix6(rnd).Addr().Prefix(128)
		add(p.Addr())
	}
	return out
}

// LastAddr is the last address of p.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Backend is what Edges runs against: the tables over Go memory, or a datapath.
type Backend struct {
	Replace func(map[uint8][]netip.Prefix) error
	Change  func(i uint8, ps []netip.Prefix, add bool) error
	Member  func(netip.Addr) uint32
	// Packets, if set, checks an address's membership through the program too.
	Packets func(a netip.Addr, want uint32)
}

// Edges runs the edge cases named in the design one by one against b, checking every
// address of interest against the reference after each step.
func Edges(t *testing.T, b Backend) {
	pp := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			if strings.Contains(s, "/") {
				out = append(out, netip.MustParsePrefix(s))
			} else {
				a := netip.MustParseAddr(s)
				out = append(out, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		return out
	}
	ref := Sets{}
	check := func(step string, addrs ...string) {
		t.Helper()
		for _, s := range addrs {
			a := netip.MustParseAddr(s)
			want := ref.Mask(a)
			if got := b.Member(a); got != want {
				t.Errorf("%s: %s in %032b, want %032b", step, s, got, want)
			}
			if b.Packets != nil && a.Unmap().Is4() {
				b.Packets(a.Unmap(), want)
			}
		}
	}
	all := []string{"0.0.0.0", "0.0.0.1", "9.255.255.255", "10.0.0.0", "10.1.2.3", "10.1.2.4", "10.1.2.127",
		"10.1.2.128", "10.255.255.255", "11.0.0.0", "192.0.2.0", "192.0.2.1", "192.0.2.2", "192.0.2.3",
		"192.0.2.255", "192.0.3.0", "255.255.255.255", "::ffff:10.1.2.3", "2001:db8::1", "2001:db8:1::1", "2001:db9::"}

	sets := map[uint8][]netip.Prefix{
		0:  pp("10.0.0.0/8", "10.1.2.3", "192.0.2.0/31"),
		1:  pp("10.1.2.0/24", "10.1.2.0/25", "0.0.0.0/32", "2001:db8::/32"),
		31: pp("192.0.2.2/31", "255.255.255.255/32", "2001:db8::/48", "2001:db8::1/128"),
	}
	for i, l := range sets {
		ref.Add(i, l...)
	}
	if err := b.Replace(sets); err != nil {
		t.Fatal(err)
	}
	check("replace", all...)

	// Removing one of two overlapping prefixes of a set keeps the other's addresses.
	Must(t, b.Change(0, pp("10.0.0.0/8"), false))
	ref.Remove(0, pp("10.0.0.0/8")...)
	check("remove /8 over a /32", all...)
	Must(t, b.Change(1, pp("10.1.2.0/24"), false))
	ref.Remove(1, pp("10.1.2.0/24")...)
	check("remove /24 over a /25", all...)
	Must(t, b.Change(1, pp("10.1.2.0/25"), false))
	ref.Remove(1, pp("10.1.2.0/25")...)
	check("remove the /25", all...)
	// Overlap across sets: set 0's /32 stays when set 1 gets and loses the same address.
	Must(t, b.Change(1, pp("10.1.2.3/32", "10.1.2.0/31"), true))
	ref.Add(1, pp("10.1.2.3/32", "10.1.2.0/31")...)
	check("add to set 1", all...)
	Must(t, b.Change(1, pp("10.1.2.3/32"), false))
	ref.Remove(1, pp("10.1.2.3/32")...)
	check("remove from set 1", all...)
	// /0 in a set, then removed: the other sets' rows stay.
	Must(t, b.Change(5, pp("0.0.0.0/0", "::/0"), true))
	ref.Add(5, pp("0.0.0.0/0", "::/0")...)
	check("add /0", all...)
	Must(t, b.Change(5, pp("0.0.0.0/0", "::/0"), false))
	ref.Remove(5, pp("0.0.0.0/0", "::/0")...)
	check("remove /0", all...)
	// IPv6: removing the /32 keeps the longer prefixes of other sets.
	Must(t, b.Change(1, pp("2001:db8::/32"), false))
	ref.Remove(1, pp("2001:db8::/32")...)
	check("remove v6 /32", all...)
	// A 4in6 spelling is the IPv4 prefix.
	Must(t, b.Change(2, pp("::ffff:10.1.2.0/120"), true))
	ref.Add(2, pp("10.1.2.0/24")...)
	check("4in6 add", all...)
	// Sets absent from a replace are emptied.
	ref = Sets{}
	ref.Add(3, pp("10.1.2.4")...)
	if err := b.Replace(map[uint8][]netip.Prefix{3: pp("10.1.2.4")}); err != nil {
		t.Fatal(err)
	}
	check("replace with one set", all...)

	if err := b.Replace(map[uint8][]netip.Prefix{32: pp("10.0.0.0/8")}); err == nil {
		t.Error("set index 32 accepted")
	}
	if err := b.Change(32, pp("10.0.0.0/8"), true); err == nil {
		t.Error("set index 32 accepted by add")
	}
	if err := b.Change(3, []netip.Prefix{{}}, true); err == nil {
		t.Error("invalid prefix accepted")
	}
	check("after errors", all...)
}

// Must fails t on err.
func Must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// BenchPrefixes draws n IPv4 prefixes as the egress filtering benchmark does: about 10 %
// /24, 1 % /16, the rest /32, from a seeded generator.
func BenchPrefixes(n int, seed uint64) []netip.Prefix {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	out := make([]netip.Prefix, n)
	for i := range out {
		bits := 32
		switch x := r.IntN(100); {
		case x < 1:
			bits = 16
		case x < 11:
			bits = 24
		}
		p, _ := V4Addr(r.Uint32()).Prefix(bits)
		out[i] = p
	}
	return out
}

// BenchPrefixes6 draws n IPv6 prefixes: 10 % /48, 1 % /32, the rest /128.
func BenchPrefixes6(n int, seed uint64) []netip.Prefix {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	out := make([]netip.Prefix, n)
	for i := range out {
		bits := 128
		switch x := r.IntN(100); {
		case x < 1:
			bits = 32
		case x < 11:
			bits = 48
		}
		var a [16]byte
		binary.BigEndian.PutUint64(a[:8], 0x2000000000000000|r.Uint64()>>4)
		binary.BigEndian.PutUint64(a[8:], r.Uint64())
		p, _ := netip.AddrFrom16(a).Prefix(bits)
		out[i] = p
	}
	return out
}
