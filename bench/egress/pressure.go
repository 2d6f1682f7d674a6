package egress

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Pressure stall information (PSI): how long some task on the machine waited for a CPU,
// for memory (reclaim, faults) or for IO. On a small shared machine a set-up time can
// grow because the machine was busy; the stalls during the set-up tell that apart from
// the filter's own work.

var stallResources = []string{"cpu", "memory", "io"}

// readStalls returns the cumulative "some" stall time of each resource in microseconds
// (nil without /proc/pressure).
func readStalls() map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range stallResources {
		b, err := os.ReadFile("/proc/pressure/" + r)
		if err != nil {
			return nil
		}
		if v, ok := someTotal(string(b)); ok {
			out[r] = v
		}
	}
	return out
}

// someTotal reads total= of the "some" line of a /proc/pressure file, e.g.
// "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345".
func someTotal(s string) (uint64, bool) {
	for line := range strings.SplitSeq(s, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "some" {
			continue
		}
		for _, f := range fields[1:] {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// stallsSince returns the stall time of each resource since before (from readStalls), in
// milliseconds; nil when either reading failed.
func stallsSince(before map[string]uint64) map[string]float64 {
	after := readStalls()
	if before == nil || after == nil {
		return nil
	}
	out := map[string]float64{}
	for r, a := range after {
		if b, ok := before[r]; ok && a >= b {
			out[r] = float64(a-b) / 1000
		}
	}
	return out
}

// stallNote is the stalls for the log line: ", stalls cpu 12 ms, memory 0 ms, io 3 ms".
func stallNote(ms map[string]float64) string {
	if ms == nil {
		return ""
	}
	parts := make([]string, 0, len(stallResources))
	for _, r := range stallResources {
		parts = append(parts, fmt.Sprintf("%s %.0f ms", r, ms[r]))
	}
	return ", stalls " + strings.Join(parts, ", ")
}
