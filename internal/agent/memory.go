package agent

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
)

// MapMemories report the memory of the dataplane's maps.
type MapMemories interface {
	// MapMemory returns the memory of the dataplane's maps, by name, with those that the
	// programs extra use without pinning them.
	MapMemory(extra ...*ebpf.Program) ([]datapath.MapUsage, error)
}

// memoryStatus reads the dataplane maps' memory (from the kernel) and the agent's RSS. What
// cannot be read is said in its Error: the rest of the status is worth having anyway.
func (a *Agent) memoryStatus() *api.MemoryStatus {
	mem := &api.MemoryStatus{}
	var errs []string
	// The send-side verdict's programs too, when it is loaded: their maps are the
	// dataplane's.
	maps, err := a.dp.MapMemory(a.dp.Programs()...)
	if err != nil {
		errs = append(errs, fmt.Sprintf("reading the dataplane's map memory: %v", err))
	}
	for _, m := range maps {
		mem.Maps = append(mem.Maps, api.MapMemory(m))
		mem.MapBytes += m.Bytes
	}
	if mem.RSSBytes, mem.RSSAnonBytes, err = processRSS(); err != nil {
		errs = append(errs, err.Error())
	}
	mem.Error = strings.Join(errs, "; ")
	return mem
}

// processRSS returns the agent process's resident memory and its anonymous part (VmRSS
// and RssAnon of /proc/self/status).
func processRSS() (rss, anon uint64, err error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, fmt.Errorf("reading the agent's memory: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "RssAnon") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("reading the agent's memory: %s: %w", name, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			anon = kb << 10
		}
	}
	return rss, anon, nil
}

// releaseAfter is the size of a CIDR set change (prefixes of all sets, before or after)
// after which the agent gives its free heap back to the kernel.
const releaseAfter = 100_000

var releasing atomic.Bool

// releaseMemory returns the heap a large CIDR set change left behind (the request, sort
// buffers, the replaced sets' prefixes: hundreds of MiB for ten million prefixes) to the
// kernel in the background, so that the agent's RSS follows the sets it holds rather than
// its largest load. Go's scavenger would return it only minutes later. It waits for the
// change (which holds a.mu) to finish, when nothing refers to the old sets any more. One
// at a time.
func (a *Agent) releaseMemory() {
	if !releasing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer releasing.Store(false)
		a.mu.Lock()
		a.mu.Unlock() // only waits for the change in progress to finish
		debug.FreeOSMemory()
	}()
}

// totalPrefixes counts the prefixes of all sets.
func totalPrefixes(sets map[string]*cidrSet) int {
	n := 0
	for _, s := range sets {
		n += s.prefixes.Len()
	}
	return n
}
