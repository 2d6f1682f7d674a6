package cidrtable

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

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
	ks, vs := keys.([]v6MapKey), values.([]uint32)
	for i, k := range ks {
		t.set(v6fromMapKey(k), vs[i])
		if t.check != nil {
			t.check()
		}
	}
	return len(ks), nil
}

func (t *memTrie) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
	ks := keys.([]v6MapKey)
	for _, k := range ks {
		t.del(v6fromMapKey(k))
		if t.check != nil {
			t.check()
		}
	}
	return len(ks), nil
}

func (t *memTrie) Delete(key any) error {
	t.del(v6fromMapKey(*key.(*v6MapKey)))
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
		t:       v4Tables{cfg: &config{Ready: 1}},
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

func (s *memStore) memlock(b uint32) uint64 {
	return uint64(len(s.top[b]))*4 + uint64(len(s.host[b]))*8
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
