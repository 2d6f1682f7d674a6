// Package churn measures what one endpoint change costs the agent: `endpoint add` and
// `endpoint delete` through the API (the Go client) and through the CLI (the rampart
// binary as a process), with 1, 100 and 1,000 endpoints already present, beside a plain
// baseline that makes the same kernel objects directly through netlink (namespace, veth,
// addresses, routes, a clsact qdisc) with no agent. The baseline is measured twice, as two
// series taking turns with everything else, so their difference is the noise band (the A/A
// control). At the largest size it also reads the idle agent's anonymous memory, the memory
// of its BPF maps and its CPU time over an idle interval. bench/run-churn.sh runs it.
package churn
