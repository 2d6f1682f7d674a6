// Package policyoverhead measures what Rampart's policy enforcement costs on the data path:
// TCP throughput (iperf3) and request/response latency between two endpoints, with no agent
// (a topology of the same shape built without the dataplane) and with the agent enforcing
// allow-all, one L3 rule, one L4 rule, and 1,000 and 10,000 rules of which only the last
// one matches. Every case is reported as a ratio to the no-agent baseline measured in the
// same run, with cases interleaved round by round so that drift of a noisy machine hits
// all of them alike.
//
// It is a benchmark, not a test: speed targets are printed (PASS/MISS against
// TargetThroughputRatio), never asserted. The command is bench/cmd/policyoverhead.
package policyoverhead
