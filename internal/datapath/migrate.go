package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

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

// migrateCT4 moves the flows of a legacy conntrack map pinned in pinDir into ct (the
// current layout, keyed from the endpoint's side), then unpins the legacy map. Without
// it, an upgrade would make every open flow new again: re-evaluated, so never allowed
// beyond policy, but replies to an endpoint that enforces ingress would be dropped and its
// open connections broken. The old programs keep the legacy map alive until their links
// take the new ones. Returns the number of flows moved.
func migrateCT4(pinDir string, ct *ebpf.Map) (int, error) {
	path := filepath.Join(pinDir, legacyCT4Pin)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("opening legacy conntrack map %s: %w", path, err)
	}
	defer old.Close()
	if old.KeySize() != uint32(binary.Size(legacyCT4Key{})) || old.ValueSize() != ct.ValueSize() {
		// Not a layout this code knows: drop it; its flows are evaluated again.
		return 0, os.Remove(path)
	}
	var (
		k     legacyCT4Key
		v     rampartCtValue
		moved int
	)
	it := old.Iterate()
	for it.Next(&k, &v) {
		nk := rampartCt4Key{Laddr: k.Saddr, Raddr: k.Daddr, Lport: k.Sport, Rport: k.Dport, EpId: k.EpID, Protocol: k.Protocol}
		if policy.Direction(k.Direction) != policy.Egress {
			nk.Laddr, nk.Raddr, nk.Lport, nk.Rport = k.Daddr, k.Saddr, k.Dport, k.Sport
		}
		v.Direction = k.Direction
		// NoExist: a flow the new programs created meanwhile is newer than its old entry.
		if err := ct.Update(&nk, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return moved, fmt.Errorf("moving a flow into %s: %w", ct, err)
		}
		moved++
	}
	if err := it.Err(); err != nil {
		return moved, fmt.Errorf("reading legacy conntrack map %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return moved, fmt.Errorf("unpinning legacy conntrack map: %w", err)
	}
	return moved, nil
}

// legacyPins are maps of earlier versions that nothing reads any more: endpoints_ifx, the
// array by interface index that endpoint_slots replaced.
var legacyPins = []string{"endpoints_ifx"}

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
