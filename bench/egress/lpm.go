package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/endpoint"
)

// lpmBatch is how many prefixes one BatchUpdate call writes: large enough that the
// system call overhead disappears, small enough that the key buffers stay a few MiB.
const lpmBatch = 1 << 17

// lpmFilter is the raw tc-eBPF peer (bpf/lpm.c): an LPM trie on the client's eth0 egress,
// loaded in this process. As in the original benchmark the program is attached first and
// the map filled after, so the listed address is blocked once its prefix is written.
type lpmFilter struct {
	topo     *topology
	listPath string
	objs     *lpmObjects
	link     link.Link
}

func (f *lpmFilter) Name() string        { return FilterLPM }
func (f *lpmFilter) Topology() *topology { return f.topo }

func (f *lpmFilter) Prepare(ctx context.Context, list List, listPath, dir string) error {
	// The set-up reads the plain list itself: parsing is part of its set-up time, as it is
	// for the commands that read theirs.
	f.listPath = listPath
	return nil
}

func (f *lpmFilter) Install(ctx context.Context) (install, error) {
	t0 := time.Now()
	in := install{Entries: -1}
	tab, err := f.readTable()
	if err != nil {
		return in, err
	}
	spec, err := loadLpm()
	if err != nil {
		return in, fmt.Errorf("loading the LPM program spec: %w", err)
	}
	spec.Maps[tab.mapName].MaxEntries = uint32(max(1, tab.n))
	f.objs = &lpmObjects{}
	if err := spec.LoadAndAssign(f.objs, nil); err != nil {
		f.objs = nil
		return in, fmt.Errorf("loading the LPM program: %w", err)
	}
	// Attach inside the client namespace: the interface index is resolved in the
	// namespace of the thread that creates the link.
	err = endpoint.Do(f.topo.Client.Netns, func() error {
		eth, err := netlink.LinkByName(endpoint.PodIfName)
		if err != nil {
			return err
		}
		f.link, err = link.AttachTCX(link.TCXOptions{Interface: eth.Attrs().Index, Program: tab.prog(f.objs), Attach: ebpf.AttachTCXEgress})
		return err
	})
	if err != nil {
		return in, fmt.Errorf("attaching the LPM program to the client's eth0: %w", err)
	}
	n, err := tab.fill(f.objs)
	in.Commands = append(in.Commands, Command{Argv: fmt.Sprintf("in process: read %s, load, attach (TCX egress), BatchUpdate %d prefixes", f.listPath, tab.n),
		Seconds: time.Since(t0).Seconds()})
	in.Entries = n
	return in, err
}

// lpmTable is the list read for the trie of the topology's family: its length, the map
// and program of that family, and how to write it into the map.
type lpmTable struct {
	mapName string
	n       int
	prog    func(*lpmObjects) *ebpf.Program
	fill    func(*lpmObjects) (int, error)
}

// readTable reads the list file: IPv4 prefixes for deny and egress_lpm, or in a topology
// over IPv6 IPv6 prefixes for deny6 and egress_lpm6.
func (f *lpmFilter) readTable() (lpmTable, error) {
	if f.topo.IPv6 {
		list, err := ReadList6(f.listPath)
		return lpmTable{mapName: lpmMapDeny6, n: len(list),
			prog: func(o *lpmObjects) *ebpf.Program { return o.EgressLpm6 },
			fill: func(o *lpmObjects) (int, error) {
				return fillLPM(o.Deny6, len(list), func(i int) lpmLpm6Key {
					return lpmLpm6Key{Prefixlen: uint32(list[i].Bits), Addr: list[i].Addr().As16()}
				})
			},
		}, err
	}
	list, err := ReadList(f.listPath)
	return lpmTable{mapName: lpmMapDeny, n: len(list),
		prog: func(o *lpmObjects) *ebpf.Program { return o.EgressLpm },
		fill: func(o *lpmObjects) (int, error) {
			return fillLPM(o.Deny, len(list), func(i int) lpmLpmKey {
				var a [4]byte
				binary.BigEndian.PutUint32(a[:], list[i].Addr)
				// The key's address is in network byte order: its bytes as they are in the packet.
				return lpmLpmKey{Prefixlen: uint32(list[i].Bits), Addr: binary.NativeEndian.Uint32(a[:])}
			})
		},
	}, err
}

// fillLPM writes the keys of n prefixes (key(i) of the i-th) into the trie, in batches.
func fillLPM[K any](m *ebpf.Map, n int, key func(i int) K) (int, error) {
	keys := make([]K, 0, min(lpmBatch, n))
	vals := make([]uint8, min(lpmBatch, n))
	for i := range vals {
		vals[i] = 1
	}
	total := 0
	for start := 0; start < n; start += lpmBatch {
		keys = keys[:0]
		for i := start; i < min(start+lpmBatch, n); i++ {
			keys = append(keys, key(i))
		}
		got, err := m.BatchUpdate(keys, vals[:len(keys)], nil)
		total += got
		if err != nil {
			return total, fmt.Errorf("writing prefixes %d-%d into the LPM trie: %w", start, start+len(keys), err)
		}
	}
	return total, nil
}

func (f *lpmFilter) Remove(ctx context.Context) error {
	var errs []error
	if f.link != nil {
		errs = append(errs, f.link.Close())
		f.link = nil
	}
	if f.objs != nil {
		// The trie is freed by the kernel when its last reference (this one) goes.
		errs = append(errs, f.objs.Close())
		f.objs = nil
	}
	return errors.Join(errs...)
}

func (f *lpmFilter) Version(ctx context.Context) string {
	return "bench/egress/bpf/lpm.c (BPF_MAP_TYPE_LPM_TRIE, TCX egress), cilium/ebpf"
}
