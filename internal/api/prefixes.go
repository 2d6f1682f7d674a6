package api

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
)

// PrefixList is a compact list of prefixes, the form in which CIDR sets travel between the
// CLI and the agent and are kept by the agent: 8 bytes per IPv4 prefix instead of the 32 of
// a netip.Prefix, and no per-prefix allocation.
type PrefixList struct {
	// V4 holds IPv4 prefixes as V4Key values: the address (big-endian, host bits clear) in
	// bits 8..39 and the length in bits 0..7, so that sorting the keys sorts the prefixes
	// by address, then length.
	V4 []uint64
	// V6 holds IPv6 prefixes, masked (IPv4-mapped ones are unmapped into V4).
	V6 []netip.Prefix
}

// V4Key packs an IPv4 prefix (which must be valid and IPv4) into a PrefixList key.
func V4Key(p netip.Prefix) uint64 {
	p = p.Masked()
	a := p.Addr().As4()
	return uint64(binary.BigEndian.Uint32(a[:]))<<8 | uint64(p.Bits())
}

// V4Prefix unpacks a PrefixList key.
func V4Prefix(k uint64) netip.Prefix {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], uint32(k>>8))
	return netip.PrefixFrom(netip.AddrFrom4(a), int(k&0xff))
}

// Len is the number of prefixes.
func (l *PrefixList) Len() int { return len(l.V4) + len(l.V6) }

// Add appends p, masked; an IPv4-mapped IPv6 prefix of length 96 or more is added as IPv4.
// Invalid prefixes are ignored.
func (l *PrefixList) Add(p netip.Prefix) {
	if !p.IsValid() {
		return
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if p.Addr().Is4() {
		l.V4 = append(l.V4, V4Key(p))
		return
	}
	l.V6 = append(l.V6, p.Masked())
}

// Prefixes returns the prefixes as netip values, IPv4 first.
func (l *PrefixList) Prefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, l.Len())
	for _, k := range l.V4 {
		out = append(out, V4Prefix(k))
	}
	return append(out, l.V6...)
}

// Contains reports whether p (masked) is in the list. The list must be normalised.
func (l *PrefixList) Contains(p netip.Prefix) bool {
	if !p.IsValid() {
		return false
	}
	if p.Addr().Is4() {
		_, ok := slices.BinarySearch(l.V4, V4Key(p))
		return ok
	}
	_, ok := slices.BinarySearchFunc(l.V6, p.Masked(), comparePrefix)
	return ok
}

// Normalize sorts the list and removes duplicates, returning how many were removed.
func (l *PrefixList) Normalize() int {
	n := l.Len()
	SortKeys(l.V4)
	l.V4 = slices.Compact(l.V4)
	slices.SortFunc(l.V6, comparePrefix)
	l.V6 = slices.Compact(l.V6)
	return n - l.Len()
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// SortKeys sorts IPv4 keys (40 significant bits) with a least-significant-digit radix sort:
// five passes over the data, about ten times faster than a comparison sort at ten million
// keys, which is what makes loading large sets take seconds.
func SortKeys(keys []uint64) {
	if len(keys) < 256 {
		slices.Sort(keys)
		return
	}
	tmp := make([]uint64, len(keys))
	src, dst := keys, tmp
	for shift := uint(0); shift < 40; shift += 8 {
		var count [256]int
		for _, k := range src {
			count[(k>>shift)&0xff]++
		}
		if count[(src[0]>>shift)&0xff] == len(src) {
			continue // every key has the same digit: nothing to reorder
		}
		pos := 0
		for i, c := range count {
			count[i] = pos
			pos += c
		}
		for _, k := range src {
			d := (k >> shift) & 0xff
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}

// The wire form of a PrefixList (also the body of the agent's CIDR set files):
//
//	"RPFX" version(1) 0 0 0      8 bytes
//	IPv4 count, IPv6 count       little-endian uint64 each
//	IPv4 prefixes                4 address bytes (network order) + 1 length byte each
//	IPv6 prefixes                16 address bytes + 1 length byte each
const (
	prefixMagic   = "RPFX"
	prefixVersion = 1
	// PrefixContentType is the media type of the wire form in API requests.
	PrefixContentType = "application/x-rampart-prefixes"
	// MaxPrefixes bounds the IPv4 prefixes of one list on the wire: the largest host table
	// a node can be given (cidrtable.MaxHostSlots, 2^27 addresses from /25../32
	// prefixes); shorter prefixes take at most 2^25 more, which this leaves out.
	MaxPrefixes = 1 << 27
	// MaxPrefixesV6 bounds the IPv6 prefixes of one list: the capacity of the dataplane's
	// IPv6 trie (datapath.DefaultCIDR6MaxEntries), which all sets share.
	MaxPrefixesV6 = 1 << 20
	// MaxPrefixBodyBytes is the largest wire form ReadPrefixList accepts (about 690 MB).
	MaxPrefixBodyBytes = 24 + 5*MaxPrefixes + 17*MaxPrefixesV6
	// prefixPrealloc is how many IPv4 prefixes the reader makes room for at once (32 MiB):
	// beyond it, room grows fourfold with the prefixes that arrive, never with the count a
	// header claims (a load of 10M grows once, which costs about 10 ms).
	prefixPrealloc = 1 << 22
)

// EncodedSize is the size of l's wire form.
func (l *PrefixList) EncodedSize() int64 {
	return 24 + 5*int64(len(l.V4)) + 17*int64(len(l.V6))
}

// WriteTo writes l's wire form.
func (l *PrefixList) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	var hdr [24]byte
	copy(hdr[:], prefixMagic)
	hdr[4] = prefixVersion
	binary.LittleEndian.PutUint64(hdr[8:], uint64(len(l.V4)))
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(l.V6)))
	bw.Write(hdr[:])
	var rec [17]byte
	for _, k := range l.V4 {
		binary.BigEndian.PutUint32(rec[:4], uint32(k>>8))
		rec[4] = byte(k)
		bw.Write(rec[:5])
	}
	for _, p := range l.V6 {
		a := p.Addr().As16()
		copy(rec[:16], a[:])
		rec[16] = byte(p.Bits())
		bw.Write(rec[:17])
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("writing prefixes: %w", err)
	}
	return l.EncodedSize(), nil
}

// ErrBadPrefixList is wrapped by ReadPrefixList's errors about the content.
var ErrBadPrefixList = errors.New("malformed prefix list")

// ReadPrefixList reads a wire form written by WriteTo, checking every prefix (length in
// range, host bits clear). It buffers its reads, so the list must end its stream (or r be
// a *bufio.Reader of at least 64 KiB, which it then reads through).
func ReadPrefixList(r io.Reader) (PrefixList, error) {
	var l PrefixList
	br := bufio.NewReaderSize(r, 1<<16)
	var hdr [24]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return l, fmt.Errorf("%w: reading header: %v", ErrBadPrefixList, err)
	}
	if string(hdr[:4]) != prefixMagic || hdr[4] != prefixVersion {
		return l, fmt.Errorf("%w: bad header", ErrBadPrefixList)
	}
	n4, n6 := binary.LittleEndian.Uint64(hdr[8:]), binary.LittleEndian.Uint64(hdr[16:])
	if n4 > MaxPrefixes {
		return l, fmt.Errorf("%w: %d IPv4 prefixes exceed the limit of %d", ErrBadPrefixList, n4, MaxPrefixes)
	}
	if n6 > MaxPrefixesV6 {
		return l, fmt.Errorf("%w: %d IPv6 prefixes exceed the limit of %d", ErrBadPrefixList, n6, MaxPrefixesV6)
	}
	l.V4 = make([]uint64, 0, min(n4, prefixPrealloc))
	buf := make([]byte, 5*4096)
	for i := uint64(0); i < n4; {
		n := min(n4-i, 4096)
		b := buf[:5*n]
		if _, err := io.ReadFull(br, b); err != nil {
			return PrefixList{}, fmt.Errorf("%w: reading IPv4 prefix %d: %v", ErrBadPrefixList, i, err)
		}
		if uint64(cap(l.V4)) < i+n {
			grown := make([]uint64, i, min(n4, 4*uint64(cap(l.V4))))
			copy(grown, l.V4)
			l.V4 = grown
		}
		l.V4 = l.V4[:i+n]
		for j := uint64(0); j < n; j++ {
			rec := b[5*j : 5*j+5]
			addr, bits := binary.BigEndian.Uint32(rec), rec[4]
			if bits > 32 || bits < 32 && addr&(1<<(32-bits)-1) != 0 {
				return PrefixList{}, fmt.Errorf("%w: IPv4 prefix %d: length %d or host bits set", ErrBadPrefixList, i+j, bits)
			}
			l.V4[i+j] = uint64(addr)<<8 | uint64(bits)
		}
		i += n
	}
	l.V6 = make([]netip.Prefix, 0, min(n6, 1<<12))
	var rec [17]byte
	for i := uint64(0); i < n6; i++ {
		if _, err := io.ReadFull(br, rec[:]); err != nil {
			return PrefixList{}, fmt.Errorf("%w: reading IPv6 prefix %d: %v", ErrBadPrefixList, i, err)
		}
		p, err := netip.AddrFrom16([16]byte(rec[:16])).Prefix(int(rec[16]))
		if err != nil || rec[16] > 128 || p.Addr() != netip.AddrFrom16([16]byte(rec[:16])) {
			return PrefixList{}, fmt.Errorf("%w: IPv6 prefix %d: length %d or host bits set", ErrBadPrefixList, i, rec[16])
		}
		l.V6 = append(l.V6, p)
	}
	return l, nil
}
