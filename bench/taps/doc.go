// Package taps is the flow tap benchmark (issue 18, docs/benchmarks.md): the FlowTap
// paper's Table II (raw TCP throughput between endpoints A and B with A's outgoing traffic
// mirrored to a monitor endpoint S, for its four placements of A, B and S on one, two or
// three nodes of an agent cluster, bench/cluster) and Table III (a web server's request
// rate with its traffic mirrored), redirect through Suricata inline (throughput and
// latency percentiles), and the copies lost when the monitor falls behind, each against no
// tap in pairs measured back to back, with an A/A control. S runs Suricata, passive or
// inline.
package taps
