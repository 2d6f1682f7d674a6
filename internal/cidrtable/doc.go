// Package cidrtable keeps the CIDR set tables of the dataplane: up to 32 named prefix
// lists (identity.CIDRSet(i), `rampart cidrset`) whose membership the tc programs compute
// in constant time per packet, at millions of prefixes.
//
// It is apart from internal/datapath because it is a concept of its own with its own
// costs: the tables are built in Go (sorting, hashing, planning a host table that fits),
// written through memory mappings, switched between two banks and freed after an RCU
// grace period, while the rest of the dataplane applies small diffs to hash and LPM maps.
// The maps themselves are part of the tc object (bpf/rampart.c), which reads them, so the
// datapath creates them and hands them over (datapath.(*Datapath).CIDRMaps, as Maps); this
// package imports no other Rampart package.
//
// IPv4 membership comes from two banks of mmapped arrays (a top table: a mask per /24; a
// host table: a hash table of /25../32 addresses), IPv6 from the LPM trie cidr6. Each
// bank's tables are maps of their own, held by the map-in-maps cidr4_top and cidr4_host and
// created only when a load needs them, at the size it needs. ReplaceCIDRSets builds the
// inactive bank's tables, switches banks with one store, and frees the old bank's tables
// after an RCU grace period; AddCIDRs and RemoveCIDRs change the active bank in place. The
// Tables keep each set's prefixes (8 bytes per IPv4 prefix) to recompute what a removal
// changes. Open's hostSlots bounds the host table. See docs/architecture.md, "CIDR sets".
package cidrtable
