// Package benchkit holds what Rampart's benchmarks share: starting a benchmark's own agent
// (rampartd) with its own instance, node namespace and pins, creating endpoints through the
// CLI, running commands inside endpoints, tracking and stopping long-running processes by
// process group, pinning processes to CPUs, CPU accounting from /proc/stat, and small
// statistics helpers (medians, ranges, nearest-rank percentiles), and for the benchmarks' unit
// tests the state the agent computes for generated policies (ComputePolicyWorld).
//
// It is for benchmark commands run as root; nothing in it asserts speed.
package benchkit
