// Package propagation is the policy propagation benchmark (docs/benchmarks.md,
// "Policy propagation"): a real control plane and N simulated nodes (clustertest, VXLAN),
// pods created through the API and the CNI, then (1) identity allocation: the time until
// every node knows every new pod's cluster identity, for pods with distinct label sets and
// for pods sharing a few; (2) propagation: one NetworkPolicy written again and again
// through the API, and per node and per selected endpoint the time until the pinned policy
// map the dataplane consults holds the new rule, confirmed by real packets.
//
// It is a Go test because clustertest needs a testing.TB: `go test` runs the quick
// version (CI); RAMPART_BENCH_FULL=1 the full one (bench/run-propagation.sh).
package propagation
