// Package dns is the benchmark of DNS-aware egress (docs/benchmarks.md, "DNS-aware
// egress"): what the agent's transparent DNS proxy (rules.dns) costs a pod's queries, and
// how long the answer of a name that a toFQDNs rule selects takes when the agent must first
// admit its address, with whether the pod's first packet to that address passes.
//
// One agent, endpoints bench/dns (the benchmark's own DNS server, miekg/dns, answering A
// records for names under bench.example), bench/direct and bench/proxy (the same L4 allow
// to the server, without and with rules.dns) and bench/learner, and a "world" namespace
// behind the node that accepts TCP 80 on every address of 198.19.0.0/16. Part one measures
// query latency (sequential queries) and rate (concurrent clients) through the proxy and
// direct, in interleaved rounds with an A/A control. Part two resolves new names, each
// answered with an address of its own, and connects to the address at once: with toFQDNs
// (the agent learns the address and commits a policy change before the proxy answers) and
// with a toCIDR rule of the whole range (nothing to learn), at few and at thousands of
// learnt addresses.
//
// Everything lives in namespaces and an agent instance the run creates and removes.
package dns
