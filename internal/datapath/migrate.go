package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/policy"
)

// legacyCT4Pin is the conntrack map of versions before conntrack4: one entry per
// direction and tuple, the tuple as the packet carried it (replies were found by a second
// lookup of the reversed tuple).
const legacyCT4Pin = "ct4"

// legacyCT4Key is the key layout of legacyCT4Pin (struct ct4_key before conntrack4).
type legacyCT4Key struct {
	Saddr, Daddr uint32
	Sport, Dport uint16
	EpID         uint32
	Protocol     uint8
	Direction    uint8
	_            uint16
}

// nsConntrackPin is the conntrack map of versions that kept conntrack times in
// nanoseconds of the coarse monotonic clock: the layout of jiffiesConntrackPin otherwise.
const nsConntrackPin = "conntrack4"

// jiffiesConntrackPin is the conntrack map of versions whose entries did not record the
// peer identity of their flow (legacyCtValue, times in jiffies).
const jiffiesConntrackPin = "conntrack4_jiffies"

// legacyCtValue is the value layout of the conntrack maps before conntrack4_peer (struct
// ct_value without tunnel_id and peer_identity).
type legacyCtValue struct {
	Created, LastSeen uint64
	RuleID, Flags     uint32
	Revision          uint32
	Direction         uint8
	_                 [3]uint8
}

// migrateConntrack moves the flows of the conntrack maps of earlier versions pinned in
// pinDir into ct (the current map: keyed from the endpoint's side, times in jiffies, the
// peer identity recorded), then unpins them: conntrack4_jiffies (no peer identity),
// conntrack4 (also times in nanoseconds) and ct4 (also one entry per direction and
// tuple). Without it, an upgrade would make every open flow new again: re-evaluated, so
// never allowed beyond policy, but replies to an endpoint that enforces ingress would be
// dropped and its open connections broken. Times keep their age: an entry last seen a
// minute ago is last seen a minute ago in jiffies. A moved flow's peer identity is its
// peer address's in ipcache now (peerIdentity), so that a later change of it is seen. The
// old programs keep their maps alive until their links take the new ones. Returns the
// number of flows moved.
func migrateConntrack(pinDir string, ct, ipcache *ebpf.Map, tick time.Duration) (int, error) {
	var conv *nsToJiffies
	converter := func() (nsToJiffies, error) {
		if conv == nil {
			c, err := newNsToJiffies(tick)
			if err != nil {
				return c, fmt.Errorf("migrating conntrack entries: %w", err)
			}
			conv = &c
		}
		return *conv, nil
	}
	moved := 0
	peer := func(k *rampartCt4Key) uint32 { return peerIdentity(ipcache, k.Raddr) }
	for _, pin := range []string{jiffiesConntrackPin, nsConntrackPin, legacyCT4Pin} {
		path := filepath.Join(pinDir, pin)
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return moved, fmt.Errorf("opening earlier conntrack map %s: %w", path, err)
		}
		var n int
		same := func(k *rampartCt4Key, _ *legacyCtValue) rampartCt4Key { return *k }
		switch pin {
		case legacyCT4Pin:
			n, err = moveFlows(old, ct, legacyKey, converter, peer)
		case nsConntrackPin:
			n, err = moveFlows(old, ct, same, converter, peer)
		default: // times in jiffies already
			n, err = moveFlows(old, ct, same, nil, peer)
		}
		old.Close()
		moved += n
		if err != nil {
			return moved, fmt.Errorf("moving the flows of earlier conntrack map %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return moved, fmt.Errorf("unpinning earlier conntrack map %s: %w", path, err)
		}
	}
	return moved, nil
}

// legacyKey converts a ct4 key (the tuple as the packet carried it, with its direction)
// to the current key, from the endpoint's side, and moves the direction into the value.
func legacyKey(k *legacyCT4Key, v *legacyCtValue) rampartCt4Key {
	nk := rampartCt4Key{Laddr: k.Saddr, Raddr: k.Daddr, Lport: k.Sport, Rport: k.Dport, EpId: k.EpID, Protocol: k.Protocol}
	if policy.Direction(k.Direction) != policy.Egress {
		nk.Laddr, nk.Raddr, nk.Lport, nk.Rport = k.Daddr, k.Saddr, k.Dport, k.Sport
	}
	v.Direction = k.Direction
	return nk
}

// moveFlows copies the entries of old (keys of type K, converted by key; values of
// legacyCtValue's layout, with times in nanoseconds converted by converter, or in jiffies
// when it is nil) into ct, each with the peer identity peer gives its key. A map of
// another layout moves nothing: its flows are evaluated again.
func moveFlows[K any](old, ct *ebpf.Map, key func(*K, *legacyCtValue) rampartCt4Key,
	converter func() (nsToJiffies, error), peer func(*rampartCt4Key) uint32) (int, error) {
	var (
		k  K
		ov legacyCtValue
	)
	if old.KeySize() != uint32(binary.Size(&k)) || old.ValueSize() != uint32(binary.Size(&ov)) {
		return 0, nil
	}
	var conv *nsToJiffies
	if converter != nil {
		c, err := converter()
		if err != nil {
			return 0, err
		}
		conv = &c
	}
	moved := 0
	it := old.Iterate()
	for it.Next(&k, &ov) {
		nk := key(&k, &ov)
		v := rampartCtValue{Created: ov.Created, LastSeen: ov.LastSeen, RuleId: ov.RuleID, Flags: ov.Flags,
			Revision: ov.Revision, PeerIdentity: peer(&nk), Direction: ov.Direction}
		if conv != nil {
			v.Created, v.LastSeen = conv.jiffies(v.Created), conv.jiffies(v.LastSeen)
		}
		// NoExist: a flow the new programs created meanwhile is newer than its old entry.
		if err := ct.Update(&nk, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return moved, fmt.Errorf("moving a flow into %s: %w", ct, err)
		}
		moved++
	}
	return moved, it.Err()
}

// peerIdentity is the identity the programs give peer address raddr (network order) from
// ipcache: its longest prefix's, world without one (as ipcache_resolve). The host's
// identity gives 0, not recorded, which the flow's next check fills in: a packet from the
// host's address is judged as the host or as world depending on where it came from
// (judge_local_source), which the address alone does not say.
func peerIdentity(ipcache *ebpf.Map, raddr uint32) uint32 {
	var a [4]byte
	binary.NativeEndian.PutUint32(a[:], raddr)
	k, err := ipcacheKey(netip.PrefixFrom(netip.AddrFrom4(a), 32))
	if err != nil {
		return uint32(identity.World)
	}
	var v rampartIpcacheValue
	if err := ipcache.Lookup(&k, &v); err != nil {
		return uint32(identity.World)
	}
	if v.Identity == uint32(identity.Host) {
		return 0
	}
	return v.Identity
}

// legacyPins are maps of earlier versions that nothing reads any more: endpoints_ifx, the
// array by interface index that endpoint_slots replaced, the CIDR set tables allocated
// in full for both banks (cidr_banks, cidr_top, cidr_host), which cidr4_config, cidr4_top
// and cidr4_host replaced, and frags, whose first-fragment verdicts did not record the
// peer identity (frags_peer replaced it; the fragments in flight at the upgrade are lost).
var legacyPins = []string{"endpoints_ifx", "cidr_banks", "cidr_top", "cidr_host", "frags"}

// removeLegacyPins unpins legacyPins from pinDir. The programs of the earlier version
// still hold their maps until their links take the new programs; the pins only kept the
// maps alive after that.
func removeLegacyPins(pinDir string) error {
	for _, name := range legacyPins {
		if err := os.Remove(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpinning legacy map %s: %w", name, err)
		}
	}
	return nil
}

// legacyEndpointInfoSize is the size of struct endpoint_info before it held the endpoint's
// address (ep_id, identity, flags, revision).
const legacyEndpointInfoSize = 16

// endpointPins are the maps whose values hold a struct endpoint_info.
var endpointPins = []string{"endpoints", "endpoint_slots", "endpoints_by_id"}

// takeLegacyEndpoints reads the endpoints map pinned in pinDir when it has the layout of
// before endpoint_info.addr, and unpins it with the other maps of that layout, so that the
// programs being loaded get maps of the current one (restoreEndpoints fills them). It
// returns nil when there is nothing to migrate. The programs still attached keep their
// maps, and enforce with them, until the agent attaches the new ones.
func takeLegacyEndpoints(pinDir string) (map[uint32]rampartEndpointInfo, error) {
	path := filepath.Join(pinDir, "endpoints")
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening endpoints map %s: %w", path, err)
	}
	defer m.Close()
	if m.ValueSize() != legacyEndpointInfoSize {
		return nil, nil
	}
	out := make(map[uint32]rampartEndpointInfo)
	var (
		ifindex uint32
		v       [4]uint32 // ep_id, identity, flags, revision
	)
	it := m.Iterate()
	for it.Next(&ifindex, &v) {
		out[ifindex] = rampartEndpointInfo{EpId: v[0], Identity: v[1], Flags: v[2], Revision: v[3]}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading earlier endpoints map %s: %w", path, err)
	}
	for _, name := range endpointPins {
		if err := os.Remove(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("unpinning earlier endpoint map %s: %w", name, err)
		}
	}
	return out, nil
}

// restoreEndpoints writes the endpoints takeLegacyEndpoints read into the endpoints map,
// each with its address from the ipcache (a local endpoint's /32 names its ep_id), so the
// upgraded programs know every endpoint and its address from their first packet. An
// endpoint whose address the ipcache does not give gets none: it can send nothing until the
// agent applies it again (fail closed). readState then rebuilds the slots and the map by
// ep_id from it.
func (d *handle) restoreEndpoints(old map[uint32]rampartEndpointInfo) error {
	if len(old) == 0 {
		return nil
	}
	addrs := make(map[uint32]uint32)
	var (
		k rampartIpcacheKey
		v rampartIpcacheValue
	)
	it := d.objs.Ipcache.Iterate()
	for it.Next(&k, &v) {
		if p, ok := ipcachePrefix(k); ok && v.EpId != 0 && p.Addr().Is4() && p.Bits() == 32 {
			a := p.Addr().As4()
			addrs[v.EpId] = binary.NativeEndian.Uint32(a[:])
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading ipcache map: %w", err)
	}
	for ifindex, info := range old {
		info.Addr = addrs[info.EpId]
		if err := d.objs.Endpoints.Update(&ifindex, &info, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("migrating endpoint info of ifindex %d: %w", ifindex, err)
		}
	}
	return nil
}
