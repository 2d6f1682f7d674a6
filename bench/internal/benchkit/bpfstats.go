package benchkit

import (
	"fmt"
	"os"
	"strings"
)

// bpfStatsSysctl switches the kernel's BPF run-time statistics on for every program. While
// it is on, each run of any BPF program reads the clock twice (about 60 ns a run on the
// 2-CPU VM the reference results come from; BPF_PROG_RUN of Rampart's established path went
// from about 95 to 160 ns), a cost that the no-filter baseline and the netfilter peers
// never pay. A machine left with it on (by a profiling session, say) makes every BPF
// filter look dearer than it is.
var bpfStatsSysctl = "/proc/sys/kernel/bpf_stats_enabled"

// BPFStatsOff switches the sysctl kernel.bpf_stats_enabled off for a benchmark run if it
// is on, and returns what it found and did (for the results) and a function that puts
// it back. Statistics enabled by another process through BPF_ENABLE_STATS cannot be seen
// or switched off from here: the sysctl reads only its own setting.
func BPFStatsOff() (state string, restore func() error, err error) {
	restore = func() error { return nil }
	b, err := os.ReadFile(bpfStatsSysctl)
	if os.IsNotExist(err) {
		return "unknown (no " + bpfStatsSysctl + ")", restore, nil
	}
	if err != nil {
		return "", restore, fmt.Errorf("reading %s: %w", bpfStatsSysctl, err)
	}
	if strings.TrimSpace(string(b)) == "0" {
		return "off", restore, nil
	}
	if err := os.WriteFile(bpfStatsSysctl, []byte("0\n"), 0o644); err != nil {
		return "", restore, fmt.Errorf("switching BPF statistics off (%s was %s): %w", bpfStatsSysctl, strings.TrimSpace(string(b)), err)
	}
	restore = func() error {
		if err := os.WriteFile(bpfStatsSysctl, b, 0o644); err != nil {
			return fmt.Errorf("switching BPF statistics back on: %w", err)
		}
		return nil
	}
	return "switched off for the run (kernel.bpf_stats_enabled was on)", restore, nil
}
