package egress

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"slices"
)

// Prefix6 is one IPv6 prefix of a generated list. An IPv6 list is at most about a million
// prefixes (the capacity of Rampart's IPv6 trie), so 24 bytes each is no burden.
type Prefix6 struct {
	Hi, Lo uint64 // network address, host bits zero
	Bits   uint8
}

// Addr returns p's network address.
func (p Prefix6) Addr() netip.Addr {
	var a [16]byte
	binary.BigEndian.PutUint64(a[:8], p.Hi)
	binary.BigEndian.PutUint64(a[8:], p.Lo)
	return netip.AddrFrom16(a)
}

// NetIP returns p as a netip.Prefix.
func (p Prefix6) NetIP() netip.Prefix { return netip.PrefixFrom(p.Addr(), int(p.Bits)) }

// String formats p as the tools read it (2001:db8::/48).
func (p Prefix6) String() string { return p.NetIP().String() }

// Append appends p as text to b.
func (p Prefix6) Append(b []byte) []byte { return p.NetIP().AppendTo(b) }

// prefix6Of returns the Prefix6 of a netip prefix (masked).
func prefix6Of(p netip.Prefix) Prefix6 {
	a := p.Masked().Addr().As16()
	return Prefix6{Hi: binary.BigEndian.Uint64(a[:8]), Lo: binary.BigEndian.Uint64(a[8:]), Bits: uint8(p.Bits())}
}

// mask6 returns the masks of the high and low 64 bits of a /bits prefix.
func mask6(bits uint8) (hi, lo uint64) {
	if bits >= 64 {
		return ^uint64(0), ^uint64(0) << (128 - uint(bits)) // a shift by 64 is 0
	}
	if bits == 0 {
		return 0, 0
	}
	return ^uint64(0) << (64 - uint(bits)), 0
}

// Contains reports whether the address hi:lo is inside p.
func (p Prefix6) Contains(hi, lo uint64) bool {
	mh, ml := mask6(p.Bits)
	return hi&mh == p.Hi && lo&ml == p.Lo
}

// Mix6 is the share of each prefix length in a generated IPv6 list: the IPv4 list's idea
// (a few large blocks, more medium ones, mostly single hosts) in IPv6's usual allocation
// sizes: /32 (a provider), /48 (a site), the rest /128.
type Mix6 struct {
	Share48, Share32 float64
	// Max32 caps the number of /32s as Mix.Max16 does the IPv4 /16s: a blocklist whose
	// short prefixes grew with the list would be a list of providers, not of hosts. At the
	// default it binds only above 1M prefixes, the most an IPv6 list is run with.
	Max32 int
}

// MaxCount6 is the capacity of Rampart's IPv6 CIDR set trie (rampartd's default,
// internal/datapath.DefaultCIDR6MaxEntries): a larger IPv6 list cannot be loaded.
const MaxCount6 = 1 << 20

// DefaultMix6 is about 10 % /48, 1 % /32, the rest /128.
var DefaultMix6 = Mix6{Share48: 0.10, Share32: 0.01, Max32: 10_000}

// Counts returns how many /32, /48 and /128 prefixes a list of n drawn prefixes holds: as
// Mix counts /16, /24 and /32.
func (m Mix6) Counts(n int) (n32, n48, n128 int) {
	return Mix{Share24: m.Share48, Share16: m.Share32, Max16: m.Max32}.Counts(n)
}

// benchRange6 is 2001:2::/48, where every IPv6 address the benchmark sends traffic to
// lives; as with benchRange, no drawn prefix overlaps it.
var benchRange6 = prefix6Of(netip.MustParsePrefix("2001:2::/48"))

// globalUnicast6 is 2000::/3, IANA's global unicast space, which prefixes are drawn from
// (the IPv4 generator draws from global unicast space too).
const globalUnicast6Hi = uint64(0x2000) << 48

// drawHi returns the high 64 bits of a random address in 2000::/3.
func drawHi(rng *rand.Rand) uint64 { return globalUnicast6Hi | rng.Uint64()>>3 }

// eligible6 reports whether a drawn prefix (hi masked, at most /64 or a /128) stays clear
// of the benchmark's range: either containing the other is an overlap.
func eligible6(hi uint64, bits uint8) bool {
	mh, _ := mask6(min(bits, benchRange6.Bits))
	return hi&mh != benchRange6.Hi
}

// Generate6 is Generate for IPv6: n-1 distinct, non-overlapping prefixes drawn with the mix
// from seed (none inside another, none overlapping 2001:2::/48), shuffled, then probe (an
// address in 2001:2::/48 the world namespace answers on) as a /128.
func Generate6(n int, mix Mix6, seed uint64, probe netip.Addr) ([]Prefix6, error) {
	n32, n48, n128 := mix.Counts(n - 1)
	if err := checkGenerate(n, probe, benchRange6.NetIP(), mix, n32, n48, n128); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x65677265737336)) // "egress6"
	out := make([]Prefix6, 0, n)
	in32 := make(map[uint64]bool, n32) // by hi>>32
	in48 := make(map[uint64]bool, n48) // by hi>>16
	// draw adds count distinct prefixes of bits (32 or 48) not inside a shorter one drawn.
	draw := func(count int, bits uint8, seen map[uint64]bool) error {
		mh, _ := mask6(bits)
		for drawn, tries := 0, 0; drawn < count; tries++ {
			if tries > 100*count+1000 {
				return fmt.Errorf("could not draw %d distinct /%d prefixes", count, bits)
			}
			hi := drawHi(rng) & mh
			if !eligible6(hi, bits) || in32[hi>>32] || seen[hi>>(64-bits)] {
				continue
			}
			seen[hi>>(64-bits)] = true
			out = append(out, Prefix6{Hi: hi, Bits: bits})
			drawn++
		}
		return nil
	}
	if err := draw(n32, 32, in32); err != nil {
		return nil, err
	}
	if err := draw(n48, 48, in48); err != nil {
		return nil, err
	}
	// /128s: in rounds, then sorted and without repeats (as the IPv4 /32s; a repeat of 125
	// random bits is all but impossible, but the list must hold exactly n).
	hosts := make([]Prefix6, 0, n128)
	for round := 0; len(hosts) < n128; round++ {
		if round > 50 {
			return nil, fmt.Errorf("could not draw %d distinct /128s", n128)
		}
		for len(hosts) < n128 {
			hi, lo := drawHi(rng), rng.Uint64()
			if eligible6(hi, 128) && !in32[hi>>32] && !in48[hi>>16] {
				hosts = append(hosts, Prefix6{Hi: hi, Lo: lo, Bits: 128})
			}
		}
		slices.SortFunc(hosts, func(a, b Prefix6) int { return cmp.Or(cmp.Compare(a.Hi, b.Hi), cmp.Compare(a.Lo, b.Lo)) })
		hosts = slices.Compact(hosts)
	}
	out = append(out, hosts...)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return append(out, prefix6Of(netip.PrefixFrom(probe, 128))), nil
}

// Covers6 reports whether any prefix of list contains addr.
func Covers6(list []Prefix6, addr netip.Addr) bool {
	a := addr.As16()
	hi, lo := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	return slices.ContainsFunc(list, func(p Prefix6) bool { return p.Contains(hi, lo) })
}

// ReadList6 reads a list of one IPv6 prefix per line, as WriteLines writes it (the LPM
// peer's set-up reads the file as ReadList does for IPv4). A million lines parse in well
// under a second with netip, so no parser of its own.
func ReadList6(path string) ([]Prefix6, error) { return readList(path, 30, parsePrefix6) }

// parsePrefix6 parses one IPv6 prefix without host bits.
func parsePrefix6(b []byte) (Prefix6, error) {
	p, err := netip.ParsePrefix(string(b))
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Masked() != p {
		return Prefix6{}, fmt.Errorf("bad IPv6 prefix %q", b)
	}
	return prefix6Of(p), nil
}

// List is one generated list: IPv4 (V4) or IPv6 (V6) prefixes, never both. Filters take
// it whole and write it in their own format with WriteLines.
type List struct {
	V4 []Prefix
	V6 []Prefix6
}

// Len is the number of prefixes.
func (l List) Len() int { return len(l.V4) + len(l.V6) }

// WriteLines writes one line per prefix (see WriteLines).
func (l List) WriteLines(w io.Writer, before, after string) error {
	if l.V6 != nil {
		return WriteLines(w, l.V6, before, after)
	}
	return WriteLines(w, l.V4, before, after)
}
