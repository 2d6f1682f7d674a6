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
	list, err := ReadList(f.listPath)
	if err != nil {
		return in, err
	}
	spec, err := loadLpm()
	if err != nil {
		return in, fmt.Errorf("loading the LPM program spec: %w", err)
	}
	spec.Maps[lpmMapDeny].MaxEntries = uint32(max(1, len(list)))
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
		f.link, err = link.AttachTCX(link.TCXOptions{Interface: eth.Attrs().Index, Program: f.objs.EgressLpm, Attach: ebpf.AttachTCXEgress})
		return err
	})
	if err != nil {
		return in, fmt.Errorf("attaching the LPM program to the client's eth0: %w", err)
	}
	n, err := fillLPM(f.objs.Deny, list)
	in.Commands = append(in.Commands, Command{Argv: fmt.Sprintf("in process: read %s, load, attach (TCX egress), BatchUpdate %d prefixes", f.listPath, len(list)),
		Seconds: time.Since(t0).Seconds()})
	in.Entries = n
	return in, err
}

// fillLPM writes every prefix of list into the trie, in batches.
func fillLPM(m *ebpf.Map, list []Prefix) (int, error) {
	keys := make([]lpmLpmKey, 0, min(lpmBatch, len(list)))
	vals := make([]uint8, min(lpmBatch, len(list)))
	for i := range vals {
		vals[i] = 1
	}
	total := 0
	for start := 0; start < len(list); start += lpmBatch {
		keys = keys[:0]
		for _, p := range list[start:min(start+lpmBatch, len(list))] {
			var a [4]byte
			binary.BigEndian.PutUint32(a[:], p.Addr)
			// The key's address is in network byte order: its bytes as they are in the packet.
			keys = append(keys, lpmLpmKey{Prefixlen: uint32(p.Bits), Addr: binary.NativeEndian.Uint32(a[:])})
		}
		n, err := m.BatchUpdate(keys, vals[:len(keys)], nil)
		total += n
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
