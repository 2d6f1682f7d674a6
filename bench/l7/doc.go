// Package l7 is Rampart's L7 benchmark: it repeats the second experiment of the paper on
// Cilium API filtering (../shared/seeds/004) at this machine's scale. A small HTTP server
// answers GET /v1 in one endpoint, and fortio, a constant-rate load generator, calls it
// from another, for five configurations of the server's ingress policy: none, one L3 rule,
// one L4 rule, one L7 rule, and forty L7 rules of which only the last matches. For each it
// measures the latency distribution (p50, p90, p99, p99.9, max) at a fixed rate and the
// highest rate the configuration sustains, round by round with the configurations
// interleaved, and reports the ratios L7/L4 (throughput) and 40 rules/1 rule against the
// issue's targets. Configurations the agent cannot enforce yet (L7 before the proxy path
// exists) are reported as not available, with the reason, never with made-up numbers.
//
// It is a benchmark, not a test: targets are printed (PASS/MISS), never asserted. The
// command is bench/cmd/l7bench; see docs/benchmarks.md.
package l7
