package datapath

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// The flow cache (bpf/include/flowcache.h) serves the packets of established flows
// without a conntrack lookup for up to a window after conntrack last confirmed the flow.

// flowCacheWindowDivisor: the window is this fraction of the shortest conntrack timeout,
// so a flow's conntrack entry outlives what the cache says about it.
const flowCacheWindowDivisor = 16

// flowCacheMaxWindow bounds the window: the longest a flow evicted from a full conntrack
// table is still served from the cache.
const flowCacheMaxWindow = time.Second

// flowCacheOrdered says whether this machine sees loads in order and stores in order, as
// the flow cache's sequence count needs (bpf/include/flowcache.h): x86's memory model.
const flowCacheOrdered = runtime.GOARCH == "amd64" || runtime.GOARCH == "386"

// flowCacheEntryBytes is sizeof(struct flow_cache_entry).
const (
	flowCacheEntryBytes = 32
	cacheLineBytes      = 64
)

// setFlowCache sets the flow cache's window, from the conntrack timeouts that setTimeouts
// set (in jiffies of tick), and its entries' offset in their slots, from the kernel's
// array layout.
func setFlowCache(spec *ebpf.CollectionSpec, tick time.Duration) error {
	shortest := uint64(0)
	for _, name := range []string{rampartVarCtTimeoutTcpSyn, rampartVarCtTimeoutTcpEstablished, rampartVarCtTimeoutTcpClosing, rampartVarCtTimeoutOther} {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("flow cache: conntrack timeout %s not in the BPF object", name)
		}
		var j uint64
		if err := vs.Get(&j); err != nil {
			return fmt.Errorf("flow cache: reading conntrack timeout %s: %w", name, err)
		}
		if shortest == 0 || j < shortest {
			shortest = j
		}
	}
	window := min(shortest/flowCacheWindowDivisor, toJiffies(flowCacheMaxWindow, tick))
	if !flowCacheOrdered {
		// The entries' sequence count needs loads and stores seen in order (x86):
		// elsewhere a reader could take a torn entry for a flow it does not hold, so
		// the cache stays off (window 0) and every packet takes the conntrack path.
		window = 0
	}
	if err := setVariable(spec, rampartVarFlowCacheWindow, uint32(window)); err != nil {
		return fmt.Errorf("flow cache: %w", err)
	}
	off, err := flowCacheOffset()
	if err != nil {
		// Entries then may straddle two cache lines: slower at low rates, still correct.
		off = 0
	}
	if err := setVariable(spec, rampartVarFlowCacheOffset, off); err != nil {
		return fmt.Errorf("flow cache: %w", err)
	}
	return nil
}

func setVariable(spec *ebpf.CollectionSpec, name string, v uint32) error {
	vs, ok := spec.Variables[name]
	if !ok {
		return fmt.Errorf("%s not in the BPF object", name)
	}
	if err := vs.Set(v); err != nil {
		return fmt.Errorf("setting %s: %w", name, err)
	}
	return nil
}

// flowCacheOffset returns where in its slot an entry must start to sit in one cache line.
// An array map's values follow the kernel's struct bpf_array header, in memory the kernel
// allocates cache-line aligned (the array is under 32 KiB, so kmalloc'd and aligned to its
// power-of-two size); the header's size, from the kernel's BTF, is therefore each slot's
// offset from a line boundary.
func flowCacheOffset() (uint32, error) {
	kspec, err := btf.LoadKernelSpec()
	if err != nil {
		return 0, fmt.Errorf("loading kernel BTF: %w", err)
	}
	var arr *btf.Struct
	if err := kspec.TypeByName("bpf_array", &arr); err != nil {
		return 0, fmt.Errorf("finding struct bpf_array: %w", err)
	}
	if len(arr.Members) == 0 {
		return 0, errors.New("struct bpf_array has no members")
	}
	// The values are the last member (a union of flexible arrays).
	header := uint32(arr.Members[len(arr.Members)-1].Offset.Bytes())
	return flowCacheSlotOffset(header), nil
}

// flowCacheSlotOffset is the offset within a 64-byte slot, at most 32, at which an entry
// of 32 bytes does not cross a cache line, for slots that start header bytes past a line
// boundary.
func flowCacheSlotOffset(header uint32) uint32 {
	start := header % cacheLineBytes
	if start+flowCacheEntryBytes <= cacheLineBytes {
		return 0
	}
	return cacheLineBytes - start
}
