/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The dataplane's maps. All are pinned by name under the agent's pin directory, so a
 * restarted agent (and a reloaded program) sees the same state. */
#ifndef __RAMPART_MAPS_H
#define __RAMPART_MAPS_H

#include "common.h"
#include "sockverdict.h"

/* ifindex of the host-side veth -> endpoint. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

/* ifindex -> endpoint, direct-mapped: slot ifindex mod RAMPART_EP_SLOTS holds one of the
 * endpoints whose interface falls there (the agent's choice), tagged with its ifindex.
 * Every packet looks here first and goes to the endpoints hash only on a miss.
 *
 * Why not an array indexed by ifindex, as before: interface indexes grow with every
 * interface a node creates, so such an array has to be large (it was 65,536 entries,
 * 1 MiB), and the kernel places a map that large in vmalloc memory, mapped in 4 KiB
 * pages. At low packet rates (a ping every millisecond) the page-table walk of that
 * first lookup was a large part of what a packet cost (docs/benchmarks.md). This table
 * is 24 KiB, small enough to be allocated from the kernel's linear mapping (at most
 * 32 KiB, bpf_map_area_alloc), whose large pages are nearly always in the TLB. Interface
 * indexes are handed out in sequence, so endpoints created together rarely share a
 * slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RAMPART_EP_SLOTS);
	__type(key, __u32);
	__type(value, struct endpoint_slot);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoint_slots SEC(".maps");

/* ep_id -> endpoint (the same info as in endpoints): lets the sender's veth evaluate a
 * local destination's ingress policy, found through ipcache_value.ep_id, to decide L7
 * steering before the packet leaves for the destination. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints_by_id SEC(".maps");

/* The node's flows that host policy never cuts (struct host_safe_key -> 1): the agent
 * writes the API server's address and port there. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct host_safe_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} host_safe SEC(".maps");

/* host_safe for IPv6 peers (struct host_safe6_key -> 1). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct host_safe6_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} host_safe6 SEC(".maps");

/* Address -> identity (longest prefix). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RAMPART_IPCACHE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipcache SEC(".maps");

/* {ep_id, identity, direction, protocol, port prefix} -> allow/deny. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RAMPART_POLICY_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct policy_key);
	__type(value, struct policy_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} policy SEC(".maps");

/* Connection tracking. LRU: when full, the least recently used flow is evicted; its next
 * packet is then evaluated against policy again (never allowed without a check). Its key
 * is the endpoint's side first, its times are in jiffies (conntrack.h), and each entry
 * records the peer identity its flow was admitted with. Earlier versions' maps are
 * migrated into it when the agent opens the datapath: conntrack4_jiffies (no peer
 * identity), conntrack4 (also times in nanoseconds) and ct4 (also one entry per direction
 * and tuple); see datapath.migrateConntrack. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RAMPART_CT_MAX);
	__type(key, struct ct4_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conntrack4_peer SEC(".maps");

/* Connection tracking of IPv6 flows: conntrack4_peer's twin with 16-byte addresses (a key
 * of their size would cost every IPv4 packet more hashing). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RAMPART_CT_MAX);
	__type(key, struct ct6_key);
	__type(value, struct ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conntrack6 SEC(".maps");

/* ep_id -> the endpoint's IPv6 addresses (struct endpoint6). Apart from endpoint_info, so
 * that IPv4 packets load no more than before and endpoint_slots stays in the kernel's
 * linear mapping (maps.h, endpoint_slots). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct endpoint6);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints6 SEC(".maps");

/* The ipcache generation (index 0): the agent adds one after every change of the ipcache
 * map, so that a conntrack entry checked before an address's identity changed no longer
 * matches (see ct_check_revision). Pinned: it only grows, across restarts too, because the
 * conntrack entries that recorded it outlive the programs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ipcache_gen SEC(".maps");

/* The flow cache in front of conntrack (flowcache.h). Not pinned: each load of the
 * programs starts with an empty one, written only by those programs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RAMPART_FLOW_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct flow_cache_slot);
} flow_cache SEC(".maps");

/* The flow cache of IPv6 flows, as flow_cache. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RAMPART_FLOW_CACHE6_SLOTS);
	__type(key, __u32);
	__type(value, struct flow_cache6_slot);
} flow_cache6 SEC(".maps");

/* First-fragment verdicts, for the later fragments of the same datagram. It replaced
 * frags, whose values did not record the peer identity (unpinned on upgrade: only the
 * fragments in flight then are lost). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RAMPART_FRAG_MAX);
	__type(key, struct frag_key);
	__type(value, struct frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frags_peer SEC(".maps");

/* Per-endpoint, per-CPU drop and proxy counters, indexed by ep_id (struct ep_counters:
 * forwarded packets come from the interface's statistics). It replaced the map counters,
 * which also counted every forwarded packet: that per-packet update of a per-CPU line was
 * about 80 ns of a round trip's cost at a ping every millisecond (docs/benchmarks.md). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct ep_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoint_counters SEC(".maps");

/* ifindex -> the interface's statistics when its endpoint was installed (struct
 * iface_stats). Kept by the agent, pinned so that a restarted agent counts from the same
 * point; no program reads it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct iface_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} iface_base SEC(".maps");

/* The L7 proxy: listener and socket marks (struct proxy_config at index 0). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct proxy_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} proxy SEC(".maps");

/* The L7 proxy's IPv6 listener (index 0; family RAMPART_FAMILY_V6 once set; its marks are
 * the map proxy's). Unset, IPv6 connections that L7 rules apply to drop. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct proxy_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} proxy6 SEC(".maps");

/* dns_proxy for IPv6 queries: the DNS proxy's IPv6 sockets (index 0: judging, 1:
 * observing). Unset, IPv6 queries that DNS rules apply to drop. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct proxy_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dns_proxy6 SEC(".maps");

/* The DNS proxy: its UDP socket and TCP listener (same address and port; struct
 * proxy_config, marks unused): index 0 judges names (rules.dns), index 1 only observes
 * (EP_DNS_OBSERVE). A map of its own rather than more entries of proxy, so that a pinned
 * proxy map of an earlier version keeps its layout. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct proxy_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} dns_proxy SEC(".maps");

/* Flow events (struct flow_event) for new flows and drops. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RAMPART_EVENTS_RING_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events SEC(".maps");

/* Events that could not be sent because the ring buffer was full (index 0). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events_lost SEC(".maps");

/* Pairs of local endpoints whose L7 rules the send-side verdict checks, by client
 * address, server address and server port (written by the agent; see sockverdict.h). A
 * new connection of such a pair goes straight to the server instead of to the proxy. */
struct sv_pair_key {
	__u32 saddr;
	__u32 daddr;
	__be16 dport;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SV_SLOTS);
	__type(key, struct sv_pair_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_pairs SEC(".maps");

/* sv_flows (sockverdict.h): the client socket each such connection is pinned to. */

#endif /* __RAMPART_MAPS_H */
