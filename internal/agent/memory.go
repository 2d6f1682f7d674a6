package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
)

// memoryStatus reads the dataplane maps' memory (from the kernel) and the agent's RSS.
func (a *Agent) memoryStatus() (*api.MemoryStatus, error) {
	maps, err := a.dp.MapMemory()
	if err != nil {
		return nil, fmt.Errorf("reading the dataplane's map memory: %w", err)
	}
	mem := &api.MemoryStatus{Maps: maps}
	for _, m := range maps {
		mem.MapBytes += m.Bytes
	}
	if mem.RSSBytes, mem.RSSAnonBytes, err = processRSS(); err != nil {
		return nil, err
	}
	return mem, nil
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
