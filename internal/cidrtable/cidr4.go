package cidrtable

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
)

// IPv4 CIDR set tables (bpf/include/cidrset.h): a set's prefixes /0../24 are expanded into
// the rows of the top table (one u32 mask per /24), /25../32 into the addresses of the host
// hash table. This file holds the encoding of prefixes, the hash, the builder of a whole
// bank and the in-place changes of the active bank; it works on plain slices, so the same
// code runs over the mmapped BPF arrays and over Go memory in unit tests.

// Constants mirrored from rampart.h (checked by TestHeaderConstants).
const (
	cidrSetFirst = 0x7FFFFF00
	cidrSets     = 32
	cidrMaxProbe = 32
	cidrTopRows  = 1 << 24
	// cidrHostBucket is the number of host table slots per element of its map.
	cidrHostBucket = 64
	// cidrTopBits is the longest prefix that goes into the top table.
	cidrTopBits = 24
)

// v4 prefixes are kept as addr<<8 | bits (a uint64), so a set's prefixes sort by address
// and then by length: a prefix comes before every prefix it contains.
func v4enc(a uint32, bits int) uint64 { return uint64(a)<<8 | uint64(bits) }
func v4addr(e uint64) uint32          { return uint32(e >> 8) }
func v4bits(e uint64) int             { return int(e & 0xff) }

// v4range returns the addresses [start, end) of an encoded prefix.
func v4range(e uint64) (start, end uint64) {
	start = e >> 8
	return start, start + 1<<(32-v4bits(e))
}

func v4mask(bits int) uint32 {
	if bits == 0 {
		return 0
	}
	return ^uint32(0) << (32 - bits)
}

// cidrHash is cidr_hash in cidrset.h: lowbias32 of the address xor the bank's seed.
func cidrHash(a, seed uint32) uint32 {
	x := a ^ seed
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}

// Multiplicative inverses (mod 2^32) of lowbias32's constants, for cidrUnhash.
var (
	inv7feb352d = modInverse(0x7feb352d)
	inv846ca68b = modInverse(0x846ca68b)
)

// modInverse returns the inverse of an odd a modulo 2^32 (Newton's iteration: each step
// doubles the number of correct low bits, starting from 3).
func modInverse(a uint32) uint32 {
	x := a
	for range 4 {
		x *= 2 - a*x
	}
	return x
}

// cidrUnhash inverts cidrHash: the builder sorts hashes (their order is the table order for
// any table size) and recovers each address from its hash, so the sort key stays small.
func cidrUnhash(h, seed uint32) uint32 {
	x := h
	x ^= x >> 16
	x *= inv846ca68b
	x ^= x>>15 ^ x>>30
	x *= inv7feb352d
	x ^= x >> 16
	return x ^ seed
}

// cidrHome is a hash's home slot in a table of size slots (multiply-shift, as in BPF).
func cidrHome(h, size uint32) uint32 { return uint32(uint64(h) * uint64(size) >> 32) }

// v4Tables is the IPv4 part of the dataplane's CIDR set state: cidr4_config[0], and the
// tables of both banks (those of cidr4_top and cidr4_host, mapped into memory). A bank has
// a top table only when some set has a prefix of /24 or shorter, and a host table only
// when some set has a longer one.
type v4Tables struct {
	cfg  *config
	top  [2][]uint32 // bank b's top table (cidrTopRows rows), nil if it has none
	host [2][]uint64 // bank b's host table, nil if it has none
}

func (t *v4Tables) active() uint32 { return atomic.LoadUint32(&t.cfg.Bank) & 1 }

func (t *v4Tables) topBank(b uint32) []uint32 { return t.top[b] }

func (t *v4Tables) hostBank(b uint32) []uint64 { return t.host[b] }

// lookup is cidr_sets4 of the BPF program: the sets containing address a (host order).
func (t *v4Tables) lookup(a uint32) uint32 {
	b := t.active()
	var mask uint32
	if top := t.topBank(b); top != nil {
		mask = atomic.LoadUint32(&top[a>>8])
	}
	if a == 0 {
		return mask | atomic.LoadUint32(&t.cfg.ZeroMask[b])
	}
	size := atomic.LoadUint32(&t.cfg.HostSlots[b])
	if size == 0 || uint64(size) > uint64(len(t.hostBank(b))) {
		return mask
	}
	if i, v := t.find(b, a, size); i >= 0 {
		mask |= uint32(v >> 32)
	}
	return mask
}

// find returns the slot holding address a (!= 0) in bank b of size slots and its value, or
// -1 when a has no slot.
func (t *v4Tables) find(b, a, size uint32) (int, uint64) {
	host := t.hostBank(b)
	slot := cidrHome(cidrHash(a, atomic.LoadUint32(&t.cfg.Seed[b])), size)
	for range cidrMaxProbe {
		v := atomic.LoadUint64(&host[slot])
		if v == 0 {
			return -1, 0
		}
		if uint32(v) == a {
			return int(slot), v
		}
		if slot++; slot == size {
			slot = 0
		}
	}
	return -1, 0
}

// errNeedRebuild: an in-place addition does not fit the active bank (an address found no
// free slot within cidrMaxProbe of its home slot, or the bank has no table of the class the
// prefix needs); the caller rebuilds the tables instead.
var (
	errNeedRebuild = errors.New("the active tables cannot take the addition in place")
	errHostProbe   = fmt.Errorf("host table: no free slot within the probe bound: %w", errNeedRebuild)
	errNoTop       = fmt.Errorf("no top table in the active bank: %w", errNeedRebuild)
)

// hostAdd adds set bit to address a's entry in the active bank, creating the entry in the
// first removed or empty slot of its probe sequence. One aligned 8-byte store makes it
// visible, so the program sees the slot before or after, never half of it.
func (t *v4Tables) hostAdd(a, bit uint32) error {
	b := t.active()
	if a == 0 {
		atomic.OrUint32(&t.cfg.ZeroMask[b], bit)
		return nil
	}
	size := atomic.LoadUint32(&t.cfg.HostSlots[b])
	host := t.hostBank(b)
	if size == 0 || uint64(size) > uint64(len(host)) {
		return errHostProbe
	}
	slot := cidrHome(cidrHash(a, atomic.LoadUint32(&t.cfg.Seed[b])), size)
	free := -1
	for range cidrMaxProbe {
		v := atomic.LoadUint64(&host[slot])
		if uint32(v) == a && v != 0 {
			atomic.StoreUint64(&host[slot], v|uint64(bit)<<32)
			return nil
		}
		if v>>32 == 0 && free < 0 {
			free = int(slot) // empty, or a removed entry that probes pass over
		}
		if v == 0 {
			break // the end of the probe sequence: a is not further on
		}
		if slot++; slot == size {
			slot = 0
		}
	}
	if free < 0 {
		return errHostProbe
	}
	atomic.StoreUint64(&host[free], uint64(a)|uint64(bit)<<32)
	return nil
}

// hostClear removes set bit from address a's entry in the active bank. An entry left with
// no set keeps its address: lookups of other addresses probe past it, and hostAdd reuses it.
func (t *v4Tables) hostClear(a, bit uint32) {
	b := t.active()
	if a == 0 {
		atomic.AndUint32(&t.cfg.ZeroMask[b], ^bit)
		return
	}
	size := atomic.LoadUint32(&t.cfg.HostSlots[b])
	if size == 0 || uint64(size) > uint64(len(t.hostBank(b))) {
		return
	}
	if i, v := t.find(b, a, size); i >= 0 {
		atomic.StoreUint64(&t.hostBank(b)[i], v&^(uint64(bit)<<32))
	}
}

// topSet sets (on) or clears set bit in rows [r0, r1) of the active bank's top table. A
// bank without a top table has no bit to clear, and cannot take one (errNoTop).
func (t *v4Tables) topSet(r0, r1 uint64, bit uint32, on bool) error {
	top := t.topBank(t.active())
	if top == nil {
		if on {
			return errNoTop
		}
		return nil
	}
	for r := r0; r < r1; r++ {
		if on {
			atomic.OrUint32(&top[r], bit)
		} else {
			atomic.AndUint32(&top[r], ^bit)
		}
	}
	return nil
}

// hasAncestor reports whether sorted list holds a prefix of length lo..min(hi, bits(e)-1)
// containing e.
func hasAncestor(list []uint64, e uint64, lo, hi int) bool {
	a, n := v4addr(e), v4bits(e)
	hi = min(hi, n-1)
	for l := lo; l <= hi; l++ {
		if _, ok := slices.BinarySearch(list, v4enc(a&v4mask(l), l)); ok {
			return true
		}
	}
	return false
}

// within returns the part of sorted list whose addresses lie in e's range (e's
// descendants, and prefixes at e's address).
func within(list []uint64, e uint64) []uint64 {
	start, end := v4range(e)
	i, _ := slices.BinarySearch(list, start<<8)
	j, _ := slices.BinarySearch(list, end<<8)
	return list[i:j]
}

// addV4 applies the additions adds (sorted, not in the set before) of set index to the
// active bank; list is the set's prefixes with adds merged in. Prefixes with an ancestor of
// their own class (top: /0../24, host: /25../32) in list change nothing: the ancestor's
// rows or addresses have the bit already, or get it from its own addition.
func (t *v4Tables) addV4(index uint8, list, adds []uint64) error {
	bit := uint32(1) << index
	for _, e := range adds {
		start, end := v4range(e)
		if v4bits(e) <= cidrTopBits {
			if !hasAncestor(list, e, 0, cidrTopBits) {
				if err := t.topSet(start>>8, end>>8, bit, true); err != nil {
					return err
				}
			}
			continue
		}
		if hasAncestor(list, e, cidrTopBits+1, 32) {
			continue
		}
		for a := start; a < end; a++ {
			if err := t.hostAdd(uint32(a), bit); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeV4 applies the removals dels (sorted, in the set before) of set index to the
// active bank; list is the set's remaining prefixes. A row (address) keeps the bit when a
// remaining prefix of the top (host) class still covers it, so overlapping prefixes of the
// set and the other sets' bits are untouched. Removal only ever clears bits.
func (t *v4Tables) removeV4(index uint8, list, dels []uint64) {
	bit := uint32(1) << index
	for _, e := range dels {
		start, end := v4range(e)
		top := v4bits(e) <= cidrTopBits
		if top && hasAncestor(list, e, 0, cidrTopBits) ||
			!top && hasAncestor(list, e, cidrTopBits+1, 32) {
			continue
		}
		// Walk the remaining prefixes of the same class inside e: clear the gaps between them.
		next := start
		for _, d := range within(list, e) {
			if (v4bits(d) <= cidrTopBits) != top {
				continue
			}
			ds, de := v4range(d)
			if de <= next {
				continue // inside a prefix already skipped
			}
			t.clearRange(next, ds, bit, top)
			next = de
		}
		t.clearRange(next, end, bit, top)
	}
}

func (t *v4Tables) clearRange(start, end uint64, bit uint32, top bool) {
	if start >= end {
		return
	}
	if top {
		t.topSet(start>>8, end>>8, bit, false) // clearing never fails
		return
	}
	for a := start; a < end; a++ {
		t.hostClear(uint32(a), bit)
	}
}

// buildTop writes the top table of sets into top (zeroed, as a new table is): each row
// gets the bits of the sets with a /0../24 prefix covering it. Each set's prefixes are
// sorted, so a prefix inside an earlier one is skipped and each row is written once per
// set.
func buildTop(top []uint32, sets *[cidrSets][]uint64) {
	for i, list := range sets {
		bit := uint32(1) << i
		var covered uint64
		for _, e := range list {
			if v4bits(e) > cidrTopBits {
				continue
			}
			start, end := v4range(e)
			if end <= covered {
				continue
			}
			covered = end
			rows := top[start>>8 : end>>8]
			for r := range rows {
				rows[r] |= bit
			}
		}
	}
}

// needsTop reports whether some set has a prefix of the top class (/0../24).
func needsTop(sets *[cidrSets][]uint64) bool {
	for _, list := range sets {
		for _, e := range list {
			if v4bits(e) <= cidrTopBits {
				return true
			}
		}
	}
	return false
}

// hostKeys returns one key per (address, set) of the host class (/25../32 prefixes,
// expanded), hash<<5 | set, unsorted, and the mask of the sets containing 0.0.0.0 (which
// cannot be stored in the table, where 0 marks an empty slot).
func hostKeys(sets *[cidrSets][]uint64, seed uint32, keys []uint64) ([]uint64, uint32) {
	var zero uint32
	keys = keys[:0]
	hostRanges(sets, func(i int, start, end uint64) {
		for a := start; a < end; a++ {
			if a == 0 {
				zero |= 1 << i
				continue
			}
			keys = append(keys, uint64(cidrHash(uint32(a), seed))<<5|uint64(i))
		}
	})
	return keys, zero
}

// countHostKeys is the number of keys hostKeys will return.
func countHostKeys(sets *[cidrSets][]uint64) int {
	n := 0
	hostRanges(sets, func(_ int, start, end uint64) { n += int(end - start) })
	return n
}

// hostRanges calls f with each set's host-class (/25../32) prefixes as address ranges
// [start, end), in order, leaving out a prefix that an earlier one of its set covers.
func hostRanges(sets *[cidrSets][]uint64, f func(set int, start, end uint64)) {
	for i, list := range sets {
		var covered uint64
		for _, e := range list {
			if v4bits(e) <= cidrTopBits {
				continue
			}
			start, end := v4range(e)
			if end <= covered {
				continue
			}
			covered = end
			f(i, start, end)
		}
	}
}

// distinctHashes counts the distinct addresses in sorted keys.
func distinctHashes(keys []uint64) int {
	n := 0
	for i, k := range keys {
		if i == 0 || k>>5 != keys[i-1]>>5 {
			n++
		}
	}
	return n
}

// placeHost lays sorted keys out in a table of size slots: entries in hash order, each in
// its home slot or the next free one (which is the Robin Hood layout: probe lengths stay
// short and even), entries pushed past the end into the first free slots from 0. Keys of
// the same address merge into one entry. With out nil it only computes the layout. ok is
// false when an entry would land cidrMaxProbe or more slots after its home.
func placeHost(keys []uint64, size, seed uint32, out []uint64) (maxProbe int, ok bool) {
	var (
		next     uint64 // every slot below next is taken
		low      uint64 // bit p: slot p (< 64) taken, for entries that wrap around
		longest  uint64
		wrapHome []uint32
		wrapVal  []uint64
	)
	for i := 0; i < len(keys); {
		h := uint32(keys[i] >> 5)
		mask := uint32(0)
		for ; i < len(keys) && uint32(keys[i]>>5) == h; i++ {
			mask |= 1 << (keys[i] & 31)
		}
		val := uint64(cidrUnhash(h, seed)) | uint64(mask)<<32
		home := uint64(cidrHome(h, size))
		pos := max(home, next)
		if pos >= uint64(size) {
			wrapHome = append(wrapHome, uint32(home))
			wrapVal = append(wrapVal, val)
			continue
		}
		longest = max(longest, pos-home)
		if longest >= cidrMaxProbe {
			return 0, false
		}
		if pos < 64 {
			low |= 1 << pos
		}
		if out != nil {
			out[pos] = val
		}
		next = pos + 1
	}
	for j, home := range wrapHome {
		pos := uint64(bits.TrailingZeros64(^low)) // the first free slot from 0
		if pos >= 64 || pos >= uint64(size) {
			return 0, false
		}
		low |= 1 << pos
		longest = max(longest, uint64(size)-uint64(home)+pos)
		if longest >= cidrMaxProbe {
			return 0, false
		}
		if out != nil {
			out[pos] = wrapVal[j]
		}
	}
	return int(longest) + 1, true
}
