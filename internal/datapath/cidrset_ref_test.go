package datapath

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// Shared by the CIDR set tests: a reference model of the sets, random prefix sets with the
// interesting edges, and addresses worth asking about.

// refSets is the reference: set index -> its prefixes (canonical). An address is in a set
// when one of the set's prefixes contains it; checked by trying every prefix length.
type refSets map[uint8]map[netip.Prefix]bool

func canonical(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

func (r refSets) mask(a netip.Addr) uint32 {
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

func (r refSets) add(i uint8, ps ...netip.Prefix) {
	if r[i] == nil {
		r[i] = map[netip.Prefix]bool{}
	}
	for _, p := range ps {
		r[i][canonical(p)] = true
	}
}

func (r refSets) remove(i uint8, ps ...netip.Prefix) {
	for _, p := range ps {
		delete(r[i], canonical(p))
	}
}

func (r refSets) lists() map[uint8][]netip.Prefix {
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

func (r refSets) clone() refSets {
	out := refSets{}
	for i, set := range r {
		out[i] = map[netip.Prefix]bool{}
		for p := range set {
			out[i][p] = true
		}
	}
	return out
}

func v4addrOf(a uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], a)
	return netip.AddrFrom4(b)
}

// Hot ranges: most random prefixes fall into a few /16s so that they overlap, within a set
// and across sets.
var hot4 = []uint32{0x0A000000, 0xC6120000, 0xCB007100, 0x00000000, 0xFFFF0000}

// randPrefix4 draws an IPv4 prefix: lengths weighted towards the edges of the two tables
// (/24, /25, /31, /32) and /0 and /8 now and then.
func randPrefix4(r *rand.Rand) netip.Prefix {
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
	p, _ := v4addrOf(a).Prefix(l)
	return p
}

func randPrefix6(r *rand.Rand) netip.Prefix {
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

// samples returns addresses at and around the edges of every prefix of r, and random ones.
func samples(r refSets, rnd *rand.Rand, random int) []netip.Addr {
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
			last := lastAddr(p)
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
		add(v4addrOf(a))
		p, _ := randPrefix6(rnd).Addr().Prefix(128)
		add(p.Addr())
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// memTrie is an LPM trie in Go memory recording every single write, for tests of the
// order of IPv6 changes: check runs after each element written or deleted.
type memTrie struct {
	m     map[v6key]uint32
	lens  [129]int // entries by prefix length, so lookups try only lengths in use
	check func()
}

func newMemTrie() *memTrie { return &memTrie{m: map[v6key]uint32{}} }

func (t *memTrie) set(k v6key, v uint32) {
	if _, ok := t.m[k]; !ok {
		t.lens[k.bits]++
	}
	t.m[k] = v
}

func (t *memTrie) del(k v6key) {
	if _, ok := t.m[k]; ok {
		t.lens[k.bits]--
		delete(t.m, k)
	}
}

func (t *memTrie) BatchUpdate(keys, values any, _ *ebpf.BatchOptions) (int, error) {
	ks, vs := keys.([]rampartCidr6Key), values.([]uint32)
	for i, k := range ks {
		t.set(v6fromMapKey(k), vs[i])
		if t.check != nil {
			t.check()
		}
	}
	return len(ks), nil
}

func (t *memTrie) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
	ks := keys.([]rampartCidr6Key)
	for _, k := range ks {
		t.del(v6fromMapKey(k))
		if t.check != nil {
			t.check()
		}
	}
	return len(ks), nil
}

func (t *memTrie) Delete(key any) error {
	t.del(v6fromMapKey(*key.(*rampartCidr6Key)))
	if t.check != nil {
		t.check()
	}
	return nil
}

func (t *memTrie) lookup(a netip.Addr) uint32 {
	k := v6of(netip.PrefixFrom(a, 128))
	for l := 128; l >= 0; l-- {
		if t.lens[l] == 0 {
			continue
		}
		if v, ok := t.m[k.masked(l)]; ok {
			return v
		}
	}
	return 0
}

// newMemCIDR returns CIDR set state over Go memory (the same code as over the mmapped
// maps) with a recording trie; host tables have at most capacity slots.
func newMemCIDR(t *testing.T, capacity uint32) (*cidrState, *memTrie) {
	t.Helper()
	trie := newMemTrie()
	c := &cidrState{
		t:       v4Tables{cfg: &rampartCidrConfig{Ready: 1}},
		store:   &memStore{},
		maxHost: capacity,
		w6:      trie,
		v6max:   1 << 20,
		loaded:  true,
	}
	c.v6.known = true
	return c, trie
}

// memStore keeps the tables in Go memory.
type memStore struct {
	top  [2][]uint32
	host [2][]uint64
}

func (s *memStore) newTop(b uint32) ([]uint32, error) {
	s.top[b] = make([]uint32, cidrTopRows)
	return s.top[b], nil
}

func (s *memStore) newHost(b, slots uint32) ([]uint64, error) {
	s.host[b] = make([]uint64, slots)
	return s.host[b], nil
}

func (s *memStore) free(b uint32) error {
	s.top[b], s.host[b] = nil, nil
	return nil
}

func (s *memStore) usage(b uint32) []MapUsage {
	var out []MapUsage
	if s.top[b] != nil {
		out = append(out, MapUsage{Name: "top", Bytes: uint64(len(s.top[b])) * 4})
	}
	if s.host[b] != nil {
		out = append(out, MapUsage{Name: "host", Bytes: uint64(len(s.host[b])) * 8})
	}
	return out
}

func (s *memStore) close() {}

// memMembership is CIDRSetMembership over newMemCIDR's state.
func memMembership(c *cidrState, trie *memTrie, a netip.Addr) uint32 {
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		return c.t.lookup(binary.BigEndian.Uint32(b[:]))
	}
	return trie.lookup(a)
}
