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

// flowCacheEntryBytes is sizeof(struct flow_cache_entry), flowCache6EntryBytes
// sizeof(struct flow_cache6_entry).
const (
	flowCacheEntryBytes  = 32
	flowCache6EntryBytes = 56
	cacheLineBytes       = 64
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
	header, err := arrayHeaderBytes()
	if err != nil {
		// Entries then may straddle two cache lines: slower at low rates, still correct.
		header = 0
	}
	if err := setVariable(spec, rampartVarFlowCacheOffset, flowCacheSlotOffset(header, flowCacheEntryBytes)); err != nil {
		return fmt.Errorf("flow cache: %w", err)
	}
	if err := setVariable(spec, rampartVarFlowCache6Offset, flowCacheSlotOffset(header, flowCache6EntryBytes)); err != nil {
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

// arrayHeaderBytes returns the size of the kernel's struct bpf_array, from its BTF: an
// array map's values follow that header, in memory the kernel allocates cache-line aligned
// (the flow caches are under 32 KiB, so kmalloc'd and aligned to their power-of-two size),
// so it is each slot's offset from a line boundary (both caches' slots are whole lines).
func arrayHeaderBytes() (uint32, error) {
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
	return uint32(arr.Members[len(arr.Members)-1].Offset.Bytes()), nil
}

// flowCacheSlotOffset is the offset within a slot at which an entry of entry bytes does
// not cross a cache line, for slots that start header bytes past a line boundary: 0 when
// it fits in the rest of the first line, else the start of the next line.
func flowCacheSlotOffset(header, entry uint32) uint32 {
	start := header % cacheLineBytes
	if start+entry <= cacheLineBytes {
		return 0
	}
	return cacheLineBytes - start
}
