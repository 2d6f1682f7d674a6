package cidrtable

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"structs"

	"github.com/cilium/ebpf"
)

// IPv6 CIDR sets live in the LPM trie cidr6. A trie lookup gives only the longest prefix
// containing an address, so each entry's value is the mask of every set with a prefix
// containing the entry's prefix (its own sets and those of its ancestors): the effective
// mask. One trie is changed in an order that never unlists an address listed before and
// after a change (see writeV6Diff), so no second bank is needed.

// v6key is a masked IPv6 prefix.
type v6key struct {
	hi, lo uint64
	bits   uint8
}

func v6of(p netip.Prefix) v6key {
	b := p.Masked().Addr().As16()
	return v6key{
		hi:   uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 | uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7]),
		lo:   uint64(b[8])<<56 | uint64(b[9])<<48 | uint64(b[10])<<40 | uint64(b[11])<<32 | uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15]),
		bits: uint8(p.Bits()),
	}
}

func (k v6key) prefix() netip.Prefix {
	var b [16]byte
	for i := range 8 {
		b[i] = byte(k.hi >> (56 - 8*i))
		b[8+i] = byte(k.lo >> (56 - 8*i))
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), int(k.bits))
}

// v6MapKey is struct cidr6_key (bpf/include), the trie's key as bpf2go writes it for the tc
// object; Open checks its size against the map's key.
type v6MapKey struct {
	_         structs.HostLayout
	Prefixlen uint32
	Addr      [16]uint8
}

func (k v6key) mapKey() v6MapKey {
	out := v6MapKey{Prefixlen: uint32(k.bits)}
	for i := range 8 {
		out.Addr[i] = byte(k.hi >> (56 - 8*i))
		out.Addr[8+i] = byte(k.lo >> (56 - 8*i))
	}
	return out
}

func v6fromMapKey(m v6MapKey) v6key {
	var k v6key
	for i := range 8 {
		k.hi |= uint64(m.Addr[i]) << (56 - 8*i)
		k.lo |= uint64(m.Addr[8+i]) << (56 - 8*i)
	}
	k.bits = uint8(min(m.Prefixlen, 128))
	return k.masked(int(k.bits))
}

// masked returns k's address cut to n bits, with length n.
func (k v6key) masked(n int) v6key {
	out := v6key{bits: uint8(n)}
	switch {
	case n == 0:
	case n <= 64:
		out.hi = k.hi & (^uint64(0) << (64 - n))
	default:
		out.hi = k.hi
		out.lo = k.lo & (^uint64(0) << (128 - n))
	}
	return out
}

// contains reports whether prefix k contains prefix o (or is o).
func (k v6key) contains(o v6key) bool { return k.bits <= o.bits && o.masked(int(k.bits)) == k }

// cmpV6 orders by address, then length: a prefix comes before everything it contains, so a
// sorted list is a pre-order walk of the prefix tree and a stack finds ancestors.
func cmpV6(a, b v6key) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(a.lo, b.lo); c != 0 {
		return c
	}
	return cmp.Compare(a.bits, b.bits)
}

// v6entry is one trie entry: own is the mask of sets listing exactly this prefix, eff the
// effective mask (the value in the trie).
type v6entry struct {
	k        v6key
	own, eff uint32
}

// v6State is the Tables' copy of the trie.
type v6State struct {
	entries []v6entry // sorted by cmpV6
	// known is false after Open until the first ReplaceCIDRSets: entries were read back
	// from the trie, with effective masks but not the sets' own prefixes.
	known bool
	// lengths counts entries by prefix length, so ancestors are searched only at lengths
	// that exist.
	lengths [129]int
}

func (s *v6State) reset(entries []v6entry, known bool) {
	s.entries, s.known = entries, known
	s.lengths = [129]int{}
	for _, e := range entries {
		s.lengths[e.k.bits]++
	}
}

func (s *v6State) search(k v6key) (int, bool) {
	return slices.BinarySearchFunc(s.entries, k, func(e v6entry, k v6key) int { return cmpV6(e.k, k) })
}

// parentEff is the effective mask of the longest entry strictly containing k.
func (s *v6State) parentEff(k v6key) uint32 {
	for n := int(k.bits) - 1; n >= 0; n-- {
		if s.lengths[n] == 0 {
			continue
		}
		if i, ok := s.search(k.masked(n)); ok {
			return s.entries[i].eff
		}
	}
	return 0
}

// computeEff fills in the effective masks of sorted entries from their own masks.
func computeEff(entries []v6entry) {
	var stack []int
	for i := range entries {
		for len(stack) > 0 && !entries[stack[len(stack)-1]].k.contains(entries[i].k) {
			stack = stack[:len(stack)-1]
		}
		entries[i].eff = entries[i].own
		if len(stack) > 0 {
			entries[i].eff |= entries[stack[len(stack)-1]].eff
		}
		stack = append(stack, i)
	}
}

// buildV6 turns the sets' IPv6 prefixes into sorted trie entries with own and effective
// masks.
func buildV6(sets *[cidrSets][]v6key) []v6entry {
	n := 0
	for _, l := range sets {
		n += len(l)
	}
	all := make([]v6entry, 0, n)
	for i, l := range sets {
		for _, k := range l {
			all = append(all, v6entry{k: k, own: 1 << i})
		}
	}
	out := mergeV6(all)
	computeEff(out)
	return slices.Clip(out)
}

// mergeV6 sorts entries by prefix and makes the entries of one prefix one, with their
// own masks joined; it reuses the storage of entries.
func mergeV6(entries []v6entry) []v6entry {
	slices.SortFunc(entries, func(a, b v6entry) int { return cmpV6(a.k, b.k) })
	out := entries[:0]
	for _, e := range entries {
		if len(out) > 0 && out[len(out)-1].k == e.k {
			out[len(out)-1].own |= e.own
			continue
		}
		out = append(out, e)
	}
	return out
}

// trieWriter is the part of *ebpf.Map the IPv6 updates use (tests check the order of the
// writes with a recording implementation).
type trieWriter interface {
	BatchUpdate(keys, values any, opts *ebpf.BatchOptions) (int, error)
	BatchDelete(keys any, opts *ebpf.BatchOptions) (int, error)
	Delete(key any) error
}

// v6Batch collects trie writes.
type v6Batch struct {
	keys []v6MapKey
	vals []uint32
}

func (b *v6Batch) add(k v6key, v uint32) {
	b.keys = append(b.keys, k.mapKey())
	b.vals = append(b.vals, v)
}

func (b *v6Batch) update(m trieWriter) error {
	if len(b.keys) == 0 {
		return nil
	}
	if _, err := m.BatchUpdate(b.keys, b.vals, &ebpf.BatchOptions{}); err != nil {
		return fmt.Errorf("writing %d IPv6 CIDR set entries: %w", len(b.keys), err)
	}
	b.keys, b.vals = b.keys[:0], b.vals[:0]
	return nil
}

func (b *v6Batch) delete(m trieWriter) error {
	if len(b.keys) == 0 {
		return nil
	}
	if _, err := m.BatchDelete(b.keys, &ebpf.BatchOptions{}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting %d IPv6 CIDR set entries: %w", len(b.keys), err)
	}
	b.keys, b.vals = b.keys[:0], b.vals[:0]
	return nil
}

// writeV6Diff changes the trie from the entries old (their effective masks are what the
// trie holds) to next, in three steps, so that during the change an address's mask always
// contains the sets that list it both before and after, and only sets that list it before
// or after:
//
//  1. every entry of old or next gets old|new (its old and new effective masks; for an
//     entry that exists on one side only, the other side's mask is that of its nearest
//     ancestor there, which is what a lookup gave);
//  2. entries of next that must lose bits get their new mask;
//  3. entries of old only are deleted (a lookup then falls back to an ancestor in next,
//     whose mask is the new mask of every address the deleted entry covered).
//
// Entries whose value does not change are not written. It returns the number of writes
// and deletions.
func writeV6Diff(m trieWriter, maxEntries int, old, next []v6entry) (int, error) {
	type change struct {
		k              v6key
		inOld, inNew   bool
		oldEff, newEff uint32
	}
	var (
		changes            []change
		oldStack, newStack []v6entry
		i, j               int
	)
	ancestorEff := func(stack *[]v6entry, k v6key) uint32 {
		for len(*stack) > 0 && !(*stack)[len(*stack)-1].k.contains(k) {
			*stack = (*stack)[:len(*stack)-1]
		}
		if len(*stack) == 0 {
			return 0
		}
		return (*stack)[len(*stack)-1].eff
	}
	for i < len(old) || j < len(next) {
		var c change
		switch {
		case j == len(next) || i < len(old) && cmpV6(old[i].k, next[j].k) < 0:
			c = change{k: old[i].k, inOld: true}
		case i == len(old) || cmpV6(old[i].k, next[j].k) > 0:
			c = change{k: next[j].k, inNew: true}
		default:
			c = change{k: old[i].k, inOld: true, inNew: true}
		}
		c.oldEff = ancestorEff(&oldStack, c.k)
		c.newEff = ancestorEff(&newStack, c.k)
		if c.inOld {
			c.oldEff = old[i].eff
			oldStack = append(oldStack, old[i])
			i++
		}
		if c.inNew {
			c.newEff = next[j].eff
			newStack = append(newStack, next[j])
			j++
		}
		changes = append(changes, c)
	}
	if len(changes) > maxEntries {
		return 0, fmt.Errorf("IPv6 CIDR sets: %d prefixes before and after the change together, the trie holds %d (datapath.Config.CIDR6MaxEntries)", len(changes), maxEntries)
	}

	var b v6Batch
	writes := 0
	for _, c := range changes {
		if v := c.oldEff | c.newEff; !c.inOld || v != c.oldEff {
			b.add(c.k, v)
		}
	}
	writes += len(b.keys)
	if err := b.update(m); err != nil {
		return writes, err
	}
	for _, c := range changes {
		if c.inNew && c.oldEff&^c.newEff != 0 {
			b.add(c.k, c.newEff)
		}
	}
	writes += len(b.keys)
	if err := b.update(m); err != nil {
		return writes, err
	}
	for _, c := range changes {
		if c.inOld && !c.inNew {
			b.add(c.k, 0)
		}
	}
	writes += len(b.keys)
	return writes, b.delete(m)
}

// v6Change applies the addition (add) or removal of set index's prefixes ks (each a
// change: not yet in the set for an addition, in it for a removal) to the state and the
// trie, entry by entry: only the prefix's entry and the entries inside it are recomputed
// and written. An addition only adds bits; a removal only removes bits and deletes the
// entry once no set lists it, after its descendants lost the bit.
func (s *v6State) v6Change(m trieWriter, maxEntries int, index uint8, ks []v6key, add bool) error {
	bit := uint32(1) << index
	var b v6Batch
	for _, k := range ks {
		i, found := s.search(k)
		if add && !found {
			if len(s.entries) >= maxEntries {
				return fmt.Errorf("IPv6 CIDR sets: the trie is full (%d entries, datapath.Config.CIDR6MaxEntries)", maxEntries)
			}
			s.entries = slices.Insert(s.entries, i, v6entry{k: k})
			s.lengths[k.bits]++
			found = true
		}
		if !found {
			continue
		}
		e := &s.entries[i]
		if add {
			e.own |= bit
		} else {
			e.own &^= bit
		}
		// Recompute the entry and its descendants (the entries after it that it contains).
		stack := []v6entry{{k: v6key{}, eff: s.parentEff(k)}}
		end := i
		for ; end < len(s.entries) && k.contains(s.entries[end].k); end++ {
			x := &s.entries[end]
			for len(stack) > 1 && !stack[len(stack)-1].k.contains(x.k) {
				stack = stack[:len(stack)-1]
			}
			eff := x.own | stack[len(stack)-1].eff
			if eff != x.eff {
				x.eff = eff
				b.add(x.k, eff)
			}
			stack = append(stack, *x)
		}
		if err := b.update(m); err != nil {
			return err
		}
		if !add && s.entries[i].own == 0 {
			key := s.entries[i].k.mapKey()
			if err := m.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("deleting IPv6 CIDR set entry %v: %w", k.prefix(), err)
			}
			s.lengths[k.bits]--
			s.entries = slices.Delete(s.entries, i, i+1)
		}
	}
	return nil
}

// readV6 reads the trie back (after Open): entries with their effective masks.
func readV6(m *ebpf.Map) ([]v6entry, error) {
	var (
		k   v6MapKey
		v   uint32
		out []v6entry
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, v6entry{k: v6fromMapKey(k), eff: v})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading IPv6 CIDR sets: %w", err)
	}
	slices.SortFunc(out, func(a, b v6entry) int { return cmpV6(a.k, b.k) })
	return out, nil
}

// lookupV6 is the trie's longest-prefix lookup of one address.
func lookupV6(m *ebpf.Map, a netip.Addr) (uint32, error) {
	k := v6MapKey{Prefixlen: 128, Addr: a.As16()}
	var v uint32
	if err := m.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("looking up %v in the IPv6 CIDR sets: %w", a, err)
	}
	return v, nil
}
