package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// DefaultCIDR6MaxEntries is the default capacity of the IPv6 CIDR set trie (entries are
// allocated as used, about 160 bytes each).
const DefaultCIDR6MaxEntries = 1 << 20

// CIDRMaps are the tc object's CIDR set maps, which internal/cidrtable fills (the programs
// read them on every new flow). They belong to the Datapath: close the tables over them
// before the Datapath.
type CIDRMaps struct {
	// Config is cidr4_config: one BPF_F_MMAPABLE element, struct cidr_config.
	Config *ebpf.Map
	// Top and Host are cidr4_top and cidr4_host: the map-in-maps that hold each bank's
	// tables; TopInner and HostInner the layout of the tables they take.
	Top, Host           *ebpf.Map
	TopInner, HostInner *ebpf.MapSpec
	// V6 is cidr6, the IPv6 LPM trie.
	V6 *ebpf.Map
}

// CIDRMaps returns the CIDR set maps (cidrtable.Open takes them as cidrtable.Maps).
func (d *Pins) CIDRMaps() CIDRMaps {
	return CIDRMaps{
		Config: d.objs.Cidr4Config, Top: d.objs.Cidr4Top, Host: d.objs.Cidr4Host, V6: d.objs.Cidr6,
		TopInner: d.cidrInner[0], HostInner: d.cidrInner[1],
	}
}

// sizeCIDRMaps sizes the IPv6 trie in spec from cfg.CIDR6MaxEntries, unless it is pinned
// already, whose size is kept (a map cannot be resized under the programs using it; a new
// size takes effect once the pins are removed), and returns the specs of the tables that
// cidr4_top and cidr4_host hold.
func sizeCIDRMaps(spec *ebpf.CollectionSpec, cfg Config) ([2]*ebpf.MapSpec, error) {
	var inner [2]*ebpf.MapSpec
	v6 := cfg.CIDR6MaxEntries
	if v6 == 0 {
		v6 = DefaultCIDR6MaxEntries
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinDir, rampartMapCidr6), nil)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return inner, fmt.Errorf("opening pinned map %s: %w", rampartMapCidr6, err)
	default:
		v6 = m.MaxEntries()
		m.Close()
	}
	ms, ok := spec.Maps[rampartMapCidr6]
	if !ok {
		return inner, fmt.Errorf("sizing map %s: not in the BPF object", rampartMapCidr6)
	}
	ms.MaxEntries = v6
	for i, name := range []string{rampartMapCidr4Top, rampartMapCidr4Host} {
		ms, ok := spec.Maps[name]
		if !ok || ms.InnerMap == nil {
			return inner, fmt.Errorf("map %s: not a map-in-map of the BPF object", name)
		}
		inner[i] = ms.InnerMap
	}
	return inner, nil
}
