package cidrtable

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The IPv4 CIDR set tables of each bank are array maps of their own, reached by the
// programs through the map-in-map arrays cidr4_top and cidr4_host (index: the bank). They
// are created when a load needs them, at the size it needs, and freed when the bank they
// belong to is switched away from, so the tables' memory follows what is loaded: none with
// no sets, the host table alone for sets of long prefixes only.

// v4Store makes and frees the tables of a bank: BPF array maps installed in cidr4_top and
// cidr4_host (mapStore), or Go memory in unit tests.
type v4Store interface {
	// newTop returns a new, zeroed top table (cidrTopRows rows), installed as bank b's.
	newTop(b uint32) ([]uint32, error)
	// newHost returns a new, zeroed host table of slots slots, installed as bank b's.
	newHost(b, slots uint32) ([]uint64, error)
	// free uninstalls and releases bank b's tables. The caller makes sure that no program
	// run still reads them (bank b is inactive and an RCU grace period has passed since).
	free(b uint32) error
	// memlock returns the kernel's memlock of bank b's tables (0 for tables it does not
	// have).
	memlock(b uint32) uint64
	// close releases the store's handles (the installed tables stay with the outer maps).
	close()
}

// Kinds of table, the index into mapStore's arrays.
const (
	tableTop = iota
	tableHost
)

var tableNames = [2]string{"cidr4_top", "cidr4_host"}

// mapStore keeps the tables in BPF array maps (BPF_F_MMAPABLE), mapped into the agent's
// memory, installed in the outer maps.
type mapStore struct {
	outer [2]*ebpf.Map     // cidr4_top, cidr4_host
	inner [2]*ebpf.MapSpec // the tables' spec (max entries set per table)
	maps  [2][2]*ebpf.Map  // [kind][bank]
	mem   [2][2][]byte     // the tables' mappings
	// fail, when set (tests), is called before a table is created: an error it returns
	// stands for the kernel's (an allocation that fails).
	fail func(kind string, entries uint32) error
}

// openMapStore opens the tables the outer maps hold (pinned maps of an earlier run) and
// maps them into memory.
func openMapStore(top, host *ebpf.Map, topSpec, hostSpec *ebpf.MapSpec) (*mapStore, error) {
	s := &mapStore{outer: [2]*ebpf.Map{top, host}, inner: [2]*ebpf.MapSpec{topSpec, hostSpec}}
	for kind := range s.outer {
		for b := range uint32(2) {
			var id uint32
			err := s.outer[kind].Lookup(b, &id)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			if err != nil {
				s.close()
				return nil, fmt.Errorf("reading %s[%d]: %w", tableNames[kind], b, err)
			}
			m, err := ebpf.NewMapFromID(ebpf.MapID(id))
			if err != nil {
				s.close()
				return nil, fmt.Errorf("opening %s[%d] (map %d): %w", tableNames[kind], b, id, err)
			}
			mem, err := mmapArray(m)
			if err != nil {
				m.Close()
				s.close()
				return nil, err
			}
			s.maps[kind][b], s.mem[kind][b] = m, mem
		}
	}
	return s, nil
}

// create makes a table of kind for bank b with entries elements, maps it and installs it
// in the outer map. On error nothing is installed.
func (s *mapStore) create(kind int, b, entries uint32) ([]byte, error) {
	if s.maps[kind][b] != nil {
		return nil, fmt.Errorf("creating %s[%d]: the bank still has one", tableNames[kind], b)
	}
	size := fmt.Sprintf("%d entries, %.1f MiB", entries, float64(entries)*float64(s.inner[kind].ValueSize)/(1<<20))
	if s.fail != nil {
		if err := s.fail(tableNames[kind], entries); err != nil {
			return nil, fmt.Errorf("creating %s[%d] (%s): %w", tableNames[kind], b, size, err)
		}
	}
	spec := s.inner[kind].Copy()
	spec.Name = fmt.Sprintf("%s%d", tableNames[kind], b)
	spec.MaxEntries = entries
	spec.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("creating %s[%d] (%s): %w", tableNames[kind], b, size, err)
	}
	mem, err := mmapArray(m)
	if err != nil {
		m.Close()
		return nil, err
	}
	if err := s.outer[kind].Put(b, m); err != nil {
		unix.Munmap(mem)
		m.Close()
		return nil, fmt.Errorf("installing %s[%d]: %w", tableNames[kind], b, err)
	}
	s.maps[kind][b], s.mem[kind][b] = m, mem
	return mem, nil
}

func (s *mapStore) newTop(b uint32) ([]uint32, error) {
	mem, err := s.create(tableTop, b, cidrTopRows/2)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&mem[0])), cidrTopRows), nil
}

func (s *mapStore) newHost(b, slots uint32) ([]uint64, error) {
	mem, err := s.create(tableHost, b, (slots+cidrHostBucket-1)/cidrHostBucket)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), slots), nil
}

// tables returns bank b's tables as they are in memory (after openMapStore).
func (s *mapStore) tables(b uint32) (top []uint32, host []uint64, err error) {
	if m := s.maps[tableTop][b]; m != nil {
		if m.MaxEntries() != cidrTopRows/2 || m.ValueSize() != 8 {
			return nil, nil, fmt.Errorf("%s[%d] has %d entries of %d bytes, want %d of 8", tableNames[tableTop], b, m.MaxEntries(), m.ValueSize(), cidrTopRows/2)
		}
		top = unsafe.Slice((*uint32)(unsafe.Pointer(&s.mem[tableTop][b][0])), cidrTopRows)
	}
	if m := s.maps[tableHost][b]; m != nil {
		if m.ValueSize() != 8*cidrHostBucket {
			return nil, nil, fmt.Errorf("%s[%d] has values of %d bytes, want %d", tableNames[tableHost], b, m.ValueSize(), 8*cidrHostBucket)
		}
		host = unsafe.Slice((*uint64)(unsafe.Pointer(&s.mem[tableHost][b][0])), uint64(m.MaxEntries())*cidrHostBucket)
	}
	return top, host, nil
}

func (s *mapStore) free(b uint32) error {
	var errs []error
	for kind := range s.maps {
		m := s.maps[kind][b]
		if m == nil {
			continue
		}
		if err := s.outer[kind].Delete(b); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("removing %s[%d]: %w", tableNames[kind], b, err))
			continue
		}
		unix.Munmap(s.mem[kind][b])
		m.Close()
		s.maps[kind][b], s.mem[kind][b] = nil, nil
	}
	return errors.Join(errs...)
}

func (s *mapStore) memlock(b uint32) uint64 {
	var n uint64
	for kind := range s.maps {
		if m := s.maps[kind][b]; m != nil {
			n += memlockOf(m)
		}
	}
	return n
}

// memlockOf returns m's memlock in /proc/PID/fdinfo (0 if the kernel does not say).
func memlockOf(m *ebpf.Map) uint64 {
	info, err := m.Info()
	if err != nil {
		return 0
	}
	n, _ := info.Memlock()
	return n
}

func (s *mapStore) close() {
	for kind := range s.maps {
		for b := range s.maps[kind] {
			if s.maps[kind][b] != nil {
				unix.Munmap(s.mem[kind][b])
				s.maps[kind][b].Close()
				s.maps[kind][b], s.mem[kind][b] = nil, nil
			}
		}
	}
}

// mmapArray maps a BPF_F_MMAPABLE array's values into memory, shared with the programs.
func mmapArray(m *ebpf.Map) ([]byte, error) {
	size := int(m.MaxEntries()) * int((m.ValueSize()+7)&^7)
	page := os.Getpagesize()
	size = (size + page - 1) &^ (page - 1)
	b, err := unix.Mmap(m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %s into memory: %w", m, err)
	}
	return b, nil
}
