package egress

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
)

// Prefix is one IPv4 prefix of a generated list, kept compact (8 bytes) because a run holds
// lists of up to ten million of them.
type Prefix struct {
	Addr uint32 // network address, host byte order, host bits zero
	Bits uint8
}

// String formats p as a.b.c.d/n.
func (p Prefix) String() string {
	return string(p.Append(nil))
}

// Append appends p as a.b.c.d/n to b, without allocating.
func (p Prefix) Append(b []byte) []byte {
	for i := 3; i >= 0; i-- {
		b = strconv.AppendUint(b, uint64(byte(p.Addr>>(8*i))), 10)
		if i > 0 {
			b = append(b, '.')
		}
	}
	b = append(b, '/')
	return strconv.AppendUint(b, uint64(p.Bits), 10)
}

// NetIP returns p as a netip.Prefix.
func (p Prefix) NetIP() netip.Prefix {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], p.Addr)
	return netip.PrefixFrom(netip.AddrFrom4(a), int(p.Bits))
}

// Contains reports whether addr (host byte order) is inside p.
func (p Prefix) Contains(addr uint32) bool {
	return addr&mask(p.Bits) == p.Addr
}

func mask(bits uint8) uint32 {
	if bits == 0 {
		return 0
	}
	return ^uint32(0) << (32 - bits)
}

// Mix is the share of each prefix length in a generated list, as in the benchmark this one
// reproduces ("24:0.1,16:0.01", the rest /32).
type Mix struct {
	Share24, Share16 float64
	// Max16 caps the number of /16s. There are only about 56,000 eligible /16s, so 1 % of
	// ten million (100,000) cannot be drawn, and a list whose /16s covered most of the
	// address space would no longer be a blocklist. The shortfall is drawn as /32s, as the
	// original generator assigns every remainder to /32.
	Max16 int
}

// DefaultMix is the original benchmark's: about 10 % /24, 1 % /16, the rest /32; /16s
// capped at a quarter of the eligible /16s.
var DefaultMix = Mix{Share24: 0.10, Share16: 0.01, Max16: 14000}

// Counts returns how many /16, /24 and /32 prefixes a list of n drawn prefixes holds.
func (m Mix) Counts(n int) (n16, n24, n32 int) {
	n16 = min(int(m.Share16*float64(n)), m.Max16)
	n24 = int(m.Share24 * float64(n))
	n32 = n - n16 - n24
	return n16, n24, n32
}

// benchRange is 198.18.0.0/15, where every address the benchmark sends traffic to lives.
// No drawn prefix overlaps it, so traffic to the server passes every filter and only the
// deliberately listed probe address is blocked.
var benchRange = Prefix{Addr: 198<<24 | 18<<16, Bits: 15}

// eligible reports whether prefix a/bits (a masked) may be drawn: global unicast space as
// the original generator (net.IP.IsGlobalUnicast: not 0/8, loopback, link-local, multicast
// or reserved), and not overlapping the benchmark's own range.
func eligible(a uint32, bits uint8) bool {
	first := a >> 24
	if first == 0 || first == 127 || first >= 224 {
		return false
	}
	if a&mask(16) == 169<<24|254<<16 {
		return false
	}
	// Overlap with the /15: either contains the other.
	short := min(bits, benchRange.Bits)
	return a&mask(short) != benchRange.Addr&mask(short)
}

// Generate draws n-1 distinct prefixes with the mix, from seed, and appends probe (a /32 the
// benchmark's "world" namespace answers on) as the n-th, as the original benchmark appends
// its test address to the list. Drawn prefixes never overlap each other (a /24 is never
// inside a drawn /16, a /32 never inside a drawn /16 or /24): every filter then holds
// exactly n entries (an nftables interval set refuses overlapping elements), and none of
// them is redundant. The same n, mix and seed always give the same list, in a shuffled
// order. probe must be inside the benchmark range.
func Generate(n int, mix Mix, seed uint64, probe netip.Addr) ([]Prefix, error) {
	n16, n24, n32 := mix.Counts(n - 1)
	if err := checkGenerate(n, probe, benchRange.NetIP(), mix, n16, n24, n32); err != nil {
		return nil, err
	}
	if n24 > 1<<23 || n32 > 1<<31 {
		return nil, fmt.Errorf("%d prefixes: too many for IPv4", n)
	}
	rng := rand.New(rand.NewPCG(seed, 0x65677265737321)) // "egress!"
	out := make([]Prefix, 0, n)

	// Bitmaps of drawn /16s (by a>>16) and /24s (by a>>8): 8 KiB and 2 MiB.
	in16 := make([]uint64, 1<<16/64)
	in24 := make([]uint64, 1<<24/64)
	has := func(b []uint64, i uint32) bool { return b[i/64]&(1<<(i%64)) != 0 }
	set := func(b []uint64, i uint32) { b[i/64] |= 1 << (i % 64) }

	for drawn, tries := 0, 0; drawn < n16; tries++ {
		if tries > 100*n16+1000 {
			return nil, fmt.Errorf("could not draw %d distinct /16s", n16)
		}
		a := rng.Uint32() & mask(16)
		if !eligible(a, 16) || has(in16, a>>16) {
			continue
		}
		set(in16, a>>16)
		out = append(out, Prefix{a, 16})
		drawn++
	}
	for drawn, tries := 0, 0; drawn < n24; tries++ {
		if tries > 100*n24+1000 {
			return nil, fmt.Errorf("could not draw %d distinct /24s", n24)
		}
		a := rng.Uint32() & mask(24)
		if !eligible(a, 24) || has(in16, a>>16) || has(in24, a>>8) {
			continue
		}
		set(in24, a>>8)
		out = append(out, Prefix{a, 24})
		drawn++
	}
	// /32s: draw in rounds, then sort and drop repeats (a bitmap of every address would
	// take 512 MiB); the result depends only on the seed.
	addrs := make([]uint32, 0, n32)
	for round := 0; len(addrs) < n32; round++ {
		if round > 50 {
			return nil, fmt.Errorf("could not draw %d distinct /32s", n32)
		}
		for len(addrs) < n32 {
			a := rng.Uint32()
			if eligible(a, 32) && !has(in16, a>>16) && !has(in24, a>>8) {
				addrs = append(addrs, a)
			}
		}
		slices.Sort(addrs)
		addrs = slices.Compact(addrs)
	}
	for _, a := range addrs {
		out = append(out, Prefix{a, 32})
	}
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	p4 := probe.As4()
	return append(out, Prefix{binary.BigEndian.Uint32(p4[:]), 32}), nil
}

// checkGenerate checks a generator's arguments: n prefixes (drawn: the counts by length
// the mix gives for n-1), the probe address in the benchmark's range of its family.
func checkGenerate(n int, probe netip.Addr, benchRange netip.Prefix, mix any, counts ...int) error {
	if n < 1 {
		return errors.New("a list needs at least one prefix (the probe address)")
	}
	if probe.Is4In6() || !benchRange.Contains(probe) {
		return fmt.Errorf("probe address %v is not in %v", probe, benchRange)
	}
	if slices.Min(counts) < 0 {
		return fmt.Errorf("mix %+v does not fit %d prefixes", mix, n-1)
	}
	return nil
}

// Covers reports whether any prefix of list contains addr.
func Covers(list []Prefix, addr netip.Addr) bool {
	a4 := addr.As4()
	a := binary.BigEndian.Uint32(a4[:])
	for _, p := range list {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// WriteLines writes one line per prefix to w: before(p) + "a.b.c.d/n" (or an IPv6 prefix)
// + after. It is how every filter's input (plain list, iptables-restore, ipset restore,
// nft) is written.
func WriteLines[P interface{ Append([]byte) []byte }](w io.Writer, list []P, before, after string) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	buf := make([]byte, 0, 64)
	for _, p := range list {
		buf = append(buf[:0], before...)
		buf = p.Append(buf)
		buf = append(buf, after...)
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// writeFile creates path and fills it with write.
func writeFile(path string, write func(w io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// ReadList reads a list of one IPv4 prefix per line (a.b.c.d/n), as WriteLines writes it
// with no before or after: the LPM peer parses the same file the others load, so that its
// set-up time includes reading the list as theirs does.
func ReadList(path string) ([]Prefix, error) { return readList(path, 16, parsePrefix) }

// readList reads a list of one prefix per line with parse; lineBytes is about how long a
// line is, to size the result from the file's size.
func readList[P any](path string, lineBytes int64, parse func([]byte) (P, error)) ([]P, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening list: %w", err)
	}
	defer f.Close()
	var out []P
	if st, err := f.Stat(); err == nil {
		out = make([]P, 0, st.Size()/lineBytes)
	}
	sc := bufio.NewScanner(bufio.NewReaderSize(f, 1<<20))
	for line := 1; sc.Scan(); line++ {
		p, err := parse(sc.Bytes())
		if err != nil {
			return nil, fmt.Errorf("list line %d: %w", line, err)
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading list: %w", err)
	}
	return out, nil
}

// parsePrefix parses a.b.c.d/n quickly (netip.ParsePrefix allocates nothing either, but
// this keeps ten million lines at a few hundred milliseconds).
func parsePrefix(b []byte) (Prefix, error) {
	var a uint32
	var part, dots int
	bits := -1
	digits := 0
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			part = part*10 + int(c-'0')
			digits++
			if part > 255 && bits < 0 || digits > 3 {
				return Prefix{}, fmt.Errorf("bad prefix %q", b)
			}
		case c == '.' && bits < 0 && dots < 3 && digits > 0:
			a = a<<8 | uint32(part)
			part, digits = 0, 0
			dots++
		case c == '/' && bits < 0 && dots == 3 && digits > 0:
			a = a<<8 | uint32(part)
			part, digits = 0, 0
			bits = 0
		default:
			return Prefix{}, fmt.Errorf("bad prefix %q", b)
		}
	}
	if bits < 0 || digits == 0 || part > 32 {
		return Prefix{}, fmt.Errorf("bad prefix %q", b)
	}
	p := Prefix{Addr: a, Bits: uint8(part)}
	if a&^mask(p.Bits) != 0 {
		return Prefix{}, fmt.Errorf("prefix %q has host bits set", b)
	}
	return p, nil
}
