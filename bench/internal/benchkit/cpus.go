package benchkit

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
)

// ParseCPUList parses a CPU list such as "1", "0,1" or "0-1" ("" is none) and checks the
// CPUs exist.
func ParseCPUList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("CPU list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("CPU list %q: %w", s, err)
			}
		}
		if a < 0 || b < a || b >= runtime.NumCPU() {
			return nil, fmt.Errorf("CPU list %q: this machine has CPUs 0-%d", s, runtime.NumCPU()-1)
		}
		for x := a; x <= b; x++ {
			out = append(out, x)
		}
	}
	return out, nil
}

// CPUFlag is how a CPU list is shown as a flag value: "none" for no pinning ("").
func CPUFlag(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// CPUArg is the CPU list a flag value means: "none" is no pinning ("").
func CPUArg(s string) string {
	if s == "none" {
		return ""
	}
	return s
}
