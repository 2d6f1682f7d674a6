// Package egress is Rampart's egress filtering benchmark: it reproduces the methodology of
// the egress filtering benchmark the issue cites (../shared/seeds/003; the original compared
// iptables, ipset, a tc-eBPF filter, Calico and Cilium) on one machine. A client and a
// server namespace are joined through a node namespace, as two machines through a network;
// a blocklist of N IPv4 prefixes (about 10 % /24, 1 % /16, the rest /32, seeded, never
// covering the benchmark's own addresses) is enforced on the client's egress by one filter
// at a time: none, iptables (one rule per prefix), ipset hash:net, an nftables interval
// set, a plain tc-eBPF LPM trie (bpf/lpm.c, this package's own raw peer), and Rampart
// (agent, CIDR set, egressDeny policy). For N = 10 ... 10M it measures TCP and UDP
// throughput (iperf3), CPU at a fixed 1 Gbit/s, latency (ping at a 1 ms interval and a TCP
// request/response probe) and set-up time (from the command until a stream of probes to a
// listed address in a "world" namespace stops being answered), each measurement paired
// with the no-filter baseline measured right next to it.
//
// A filter predicted to take over the time budget or memory limit at a count is skipped
// and reported as such, with the prediction; one that cannot hold a list is reported as
// failed; Rampart before CIDR sets exist is reported as not available. It is a benchmark,
// not a test: the targets are printed (PASS/MISS), never asserted. The command is
// bench/cmd/egressbench; see docs/benchmarks.md.
package egress
