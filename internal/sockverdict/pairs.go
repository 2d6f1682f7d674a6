package sockverdict

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"structs"
	"unsafe"

	"github.com/cilium/ebpf"
)

// Pairs is tc's list of the pairs of local endpoints whose connections the verdict checks:
// the tc object's map sv_pairs (bpf/rampart.c reads it on a redirected flow's first
// packet), which the datapath hands out (datapath.(*Datapath).SockPairsMap).
type Pairs struct {
	m *ebpf.Map
}

// pairKey is struct sv_pair_key (bpf/include), as bpf2go writes it for the tc object;
// NewPairs checks its size against the map's key.
type pairKey struct {
	_     structs.HostLayout
	Saddr uint32
	Daddr uint32
	Dport uint16
	Pad   uint16
}

// NewPairs returns the pair list kept in m (sv_pairs).
func NewPairs(m *ebpf.Map) (*Pairs, error) {
	if m == nil {
		return nil, errors.New("send-side pairs: no sv_pairs map")
	}
	if got, want := m.KeySize(), uint32(unsafe.Sizeof(pairKey{})); got != want {
		return nil, fmt.Errorf("send-side pairs: sv_pairs keys have %d bytes, want %d", got, want)
	}
	return &Pairs{m: m}, nil
}

// Set tells tc that connections from client to server's port are checked by the
// send-side verdict (slot: the pair's slot, for diagnostics): they go straight to the
// server, and their data must come from the socket the verdict checks. Write the pair's
// table and targets first.
func (p *Pairs) Set(client, server netip.Addr, port uint16, slot uint32) error {
	k := svPairKey(client, server, port)
	if err := p.m.Put(&k, slot); err != nil {
		return fmt.Errorf("setting send-side pair %s-%s port %d: %w", client, server, port, err)
	}
	return nil
}

// Delete sends the pair's new connections to the proxy again.
func (p *Pairs) Delete(client, server netip.Addr, port uint16) error {
	k := svPairKey(client, server, port)
	if err := p.m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting send-side pair %s-%s port %d: %w", client, server, port, err)
	}
	return nil
}

func svPairKey(client, server netip.Addr, port uint16) pairKey {
	var p [2]byte
	binary.BigEndian.PutUint16(p[:], port)
	return pairKey{Saddr: ip4(client), Daddr: ip4(server), Dport: binary.NativeEndian.Uint16(p[:])}
}

// PairKey is a pair of local endpoints and the server port, as tc lists it.
type PairKey struct {
	Client, Server netip.Addr
	Port           uint16
}

// List returns the pairs tc lists now, with their slots (a restarted agent keeps them:
// open connections hold their slots).
func (p *Pairs) List() (map[PairKey]uint32, error) {
	out := map[PairKey]uint32{}
	var k pairKey
	var slot uint32
	it := p.m.Iterate()
	for it.Next(&k, &slot) {
		var c, s [4]byte
		binary.NativeEndian.PutUint32(c[:], k.Saddr)
		binary.NativeEndian.PutUint32(s[:], k.Daddr)
		var pb [2]byte
		binary.NativeEndian.PutUint16(pb[:], k.Dport)
		out[PairKey{netip.AddrFrom4(c), netip.AddrFrom4(s), binary.BigEndian.Uint16(pb[:])}] = slot
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading send-side pairs: %w", err)
	}
	return out, nil
}
