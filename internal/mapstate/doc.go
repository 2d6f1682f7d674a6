// Package mapstate computes the desired dataplane state (per-endpoint policy entries,
// enforcement flags, the ipcache, and the L7 proxy's rules) from rules, endpoints and
// identities, and explains verdicts (Lookup, Trace) from that same state. It is pure Go
// with no BPF or netlink import, so it is tested without root; internal/datapath applies
// its output to the kernel and internal/proxy turns State.L7 into proxy configuration.
//
// Entries carry one of three actions, which the dataplane's lookups combine as
// deny > redirect > allow: a redirect sends the connection through the L7 proxy, which
// checks each request against the State.L7 rules for that endpoint, direction and port.
//
// CIDR sets (cidrGroupRef peers) select the set's identity, identity.CIDRSet(index), in
// policy keys; set membership is not in the ipcache but computed by the dataplane per
// packet, so LookupSets and Trace take the peer's set mask (Input.CIDRSetMembership).
package mapstate
