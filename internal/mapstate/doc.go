// Package mapstate computes the desired dataplane state (per-endpoint policy entries,
// enforcement flags and the ipcache) from rules, endpoints and identities, and explains
// verdicts (Trace) from that same state. It is pure Go with no BPF or netlink import, so
// it is tested without root; internal/datapath applies its output to the kernel.
package mapstate
