// Command policyoverhead is Rampart's policy overhead benchmark: TCP throughput and
// request/response latency between two endpoints with no agent, and with the agent
// enforcing allow-all, one L3 rule, one L4 rule, and 1,000 and 10,000 rules of which only
// the last matches. It prints every case as a ratio to the no-agent baseline of the same
// run, and writes a JSON report and a PNG plot. Run it as root from the repository:
//
//	bench/run-policy-overhead.sh            # full run, about three minutes
//	bench/run-policy-overhead.sh --quick    # smoke run, under a minute
//
// See docs/benchmarks.md.
package main
