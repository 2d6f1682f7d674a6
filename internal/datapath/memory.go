package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/pin"
)

// MapUsage is the memory of one BPF map, as the kernel accounts it.
type MapUsage struct {
	// Name is the map's pin name, or OUTER[i] for the map at index i of the map-in-map
	// OUTER (the CIDR set tables of bank i).
	Name       string
	ID         uint32
	Type       string // the kernel's map type (Array, Hash, LPMTrie...)
	MaxEntries uint32
	// Bytes is the map's memlock in /proc/PID/fdinfo: exact for arrays (the values' pages,
	// what an mmapped array adds to a process's RSS once mapped) and for preallocated hash
	// maps; for an LPM trie it counts its nodes' key and value bytes only (the kernel's real
	// memory is several times that).
	Bytes uint64
}

// mapUsage describes m under name.
func mapUsage(m *ebpf.Map, name string) MapUsage {
	u := MapUsage{Name: name, Type: m.Type().String(), MaxEntries: m.MaxEntries()}
	if info, err := m.Info(); err == nil {
		if id, ok := info.ID(); ok {
			u.ID = uint32(id)
		}
		u.Bytes, _ = info.Memlock()
	}
	return u
}

// MapMemory returns the memory of the dataplane's maps: every map pinned in its directory
// (the send-side verdict's too, when it is loaded), the maps inside its map-in-maps, and the
// maps its programs and extra (the send-side verdict's, sockverdict.(*Verdict).Programs)
// use without pinning them (the flow cache, the programs' constants, scratch space),
// sorted by name.
func (d *Pins) MapMemory(extra ...*ebpf.Program) ([]MapUsage, error) {
	out, err := MapMemory(d.pinDir)
	if err != nil {
		return nil, err
	}
	progs := append([]*ebpf.Program{d.objs.RampartFromEp, d.objs.RampartToEp}, extra...)
	seen := map[uint32]bool{}
	for _, u := range out {
		seen[u.ID] = true
	}
	for _, p := range progs {
		if p == nil {
			continue
		}
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("reading program %s: %w", p, err)
		}
		ids, _ := info.MapIDs()
		for _, id := range ids {
			if seen[uint32(id)] {
				continue
			}
			seen[uint32(id)] = true
			m, err := ebpf.NewMapFromID(id)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("opening map %d of program %s: %w", id, p, err)
			}
			name := ""
			if mi, err := m.Info(); err == nil {
				name = mi.Name
			}
			out = append(out, mapUsage(m, name))
			m.Close()
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MapMemory returns the memory of every map pinned in pinDir and of the maps inside its
// map-in-maps, sorted by name. Pins of programs and links are skipped.
func MapMemory(pinDir string) ([]MapUsage, error) {
	ents, err := os.ReadDir(pinDir)
	if err != nil {
		return nil, fmt.Errorf("reading pin directory: %w", err)
	}
	var out []MapUsage
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		// No read-only flag: the kernel refuses it for pins of programs and links (EINVAL).
		obj, err := pin.Load(filepath.Join(pinDir, e.Name()), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue // unpinned meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("opening pin %s: %w", e.Name(), err)
		}
		m, ok := obj.(*ebpf.Map)
		if !ok {
			obj.Close()
			continue
		}
		out = append(out, mapUsage(m, e.Name()))
		if t := m.Type(); t == ebpf.ArrayOfMaps || t == ebpf.HashOfMaps {
			inner, err := innerUsage(m, e.Name())
			if err != nil {
				m.Close()
				return nil, err
			}
			out = append(out, inner...)
		}
		m.Close()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// innerUsage describes the maps held by the map-in-map outer (u32 keys).
func innerUsage(outer *ebpf.Map, name string) ([]MapUsage, error) {
	var (
		out    []MapUsage
		key, v uint32
	)
	it := outer.Iterate()
	for it.Next(&key, &v) {
		m, err := ebpf.NewMapFromID(ebpf.MapID(v))
		if errors.Is(err, os.ErrNotExist) {
			continue // replaced meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("opening %s[%d] (map %d): %w", name, key, v, err)
		}
		out = append(out, mapUsage(m, fmt.Sprintf("%s[%d]", name, key)))
		m.Close()
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return out, nil
}
