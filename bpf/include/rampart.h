/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Rampart dataplane: structures and maps shared by the BPF programs and the agent.
 * Every struct here is exported to Go by bpf2go (-type), so Go and C share one definition.
 * Addresses are stored in 16 bytes (IPv4 in the first 4, network byte order) so the key
 * layouts stay the same when IPv6 is added. */
#ifndef __RAMPART_H
#define __RAMPART_H

#include <linux/types.h>

#ifndef RAMPART_MAX_ENDPOINTS
#define RAMPART_MAX_ENDPOINTS 4096
#endif
/* Slots of endpoint_slots (a power of two; see maps.h). */
#ifndef RAMPART_EP_SLOTS
#define RAMPART_EP_SLOTS 1024
#endif
#if RAMPART_EP_SLOTS & (RAMPART_EP_SLOTS - 1)
#error "RAMPART_EP_SLOTS must be a power of two"
#endif
#ifndef RAMPART_POLICY_MAX
#define RAMPART_POLICY_MAX 1048576
#endif
#ifndef RAMPART_IPCACHE_MAX
#define RAMPART_IPCACHE_MAX 1048576
#endif
#ifndef RAMPART_CT_MAX
#define RAMPART_CT_MAX 65536
#endif
#ifndef RAMPART_FRAG_MAX
#define RAMPART_FRAG_MAX 8192
#endif
/* Most other nodes the VXLAN overlay reaches over an IPv6 fabric (map tunnel_remote6). */
#ifndef RAMPART_MAX_NODES
#define RAMPART_MAX_NODES 4096
#endif
/* CIDR sets (see cidrset.h). Slots of the smallest IPv4 host table: the agent creates each
 * bank's table at the size its load needs (datapath.Config.CIDRHostSlots bounds it), in
 * buckets of CIDR_HOST_BUCKET slots (one array element each). */
#define CIDR_HOST_MIN_SLOTS 64
#define CIDR_HOST_BUCKET 64
/* Most IPv6 prefixes in all CIDR sets together (LPM trie, allocated as used). */
#ifndef RAMPART_CIDR6_MAX
#define RAMPART_CIDR6_MAX 1048576
#endif

#define RAMPART_FAMILY_V4 4
#define RAMPART_FAMILY_V6 6

/* Reserved identities (same numbers as Cilium). */
#define ID_UNKNOWN 0 /* also "any identity" in policy keys */
#define ID_HOST 1
#define ID_WORLD 2
#define ID_UNMANAGED 3
#define ID_HEALTH 4
#define ID_INIT 5
#define ID_REMOTE_NODE 6
#define ID_KUBE_APISERVER 7
/* The first node-local CIDR identity (identity.FirstCIDR): endpoints' identities are below
 * it, the numbers the 24-bit VNI carries. */
#define ID_FIRST_CIDR (1u << 24)
/* Secondary identity flag: a CIDR identity matched against an endpoint's or the host's
 * own address (so ipBlock/toCIDR peers can select pods), distinct from the same CIDR
 * identity seen as a plain remote address. */
#define ID_FLAG_ENDPOINT_CIDR 0x80000000u
/* CIDR set i (0..RAMPART_CIDR_SETS-1) has the fixed identity ID_CIDR_SET_FIRST + i: a peer
 * address in set i is also looked up in policy with that identity. */
#define ID_CIDR_SET_FIRST 0x7FFFFF00u
#define RAMPART_CIDR_SETS 32
/* Longest probe sequence in the host table: the agent places every entry within this many
 * slots of its home slot (or rebuilds the table larger), so a lookup stops after it. */
#define CIDR_MAX_PROBE 32
/* Rows of one bank of the top table: one per /24 of the IPv4 space. */
#define CIDR_TOP_ROWS (1u << 24)

/* The flow vocabulary: the codes of struct flow_event, as enums so that they reach BTF and
 * bpf2go exports them (-type) to Go, where internal/flow generates its types and names from
 * them (a code's name is its enumerator without the prefix, in lower case with '-' for '_';
 * verdicts in upper case). Each enum has the fixed underlying type __u8 (a clang extension
 * in C) so that it is one byte, like the flow_event field it types: that field puts the enum
 * in BTF through the existing unused_flow_event anchor (rampart.c), with no new map or
 * variable and no instruction changed. Rename an enumerator and its name changes for users
 * (observe output, the API). */

/* Directions, from the endpoint's point of view (policy.Direction in Go). */
enum flow_direction : __u8 {
	DIR_INGRESS = 1, /* into the endpoint: tc egress on its host-side veth */
	DIR_EGRESS = 2,  /* out of the endpoint: tc ingress on its host-side veth */
};

/* endpoint_info.flags */
#define EP_ENFORCE_INGRESS (1u << 0)
#define EP_ENFORCE_EGRESS (1u << 1)
/* The endpoint has tap rules for packets entering (EP_TAP_INGRESS) or leaving
 * (EP_TAP_EGRESS) it in tap_sets (tap.h): endpoints without them pay no tap lookup. */
#define EP_TAP_INGRESS (1u << 2)
#define EP_TAP_EGRESS (1u << 3)
/* A monitor endpoint: no new flow may enter it (REASON_TAP_MONITOR_DESTINATION). */
#define EP_MONITOR (1u << 4)
/* The endpoint has Admin tier entries (ClusterNetworkPolicy) for the direction: new flows
 * are looked up in them first (policy_decide), under the direction | DIR_ADMIN_FLAG. */
#define EP_ADMIN_INGRESS (1u << 5)
#define EP_ADMIN_EGRESS (1u << 6)
/* The endpoint's egress DNS queries (UDP and TCP to port 53) that policy allows go through
 * the DNS proxy's observing socket, which forwards every name and learns the answers:
 * ClusterNetworkPolicy domainNames peers select what it learns. */
#define EP_DNS_OBSERVE (1u << 7)
#define DNS_PORT 53
/* The node's own endpoint (host policy): its info sits on the host devices (the fabric
 * interfaces, rampart_to_host and rampart_from_host) and under HOST_EP_ID in
 * endpoints_by_id, where the endpoints' veths find it for traffic between them and the
 * node. Its address check is host_traffic's, not the endpoints' anti-spoofing. */
#define EP_HOST (1u << 8)
/* A policy in audit mode applies to the endpoint: a new flow its policy lets through in
 * the direction is looked up again in the entries under ep_id | AUDIT_EP_FLAG (the policy
 * with the audited rules too, mapstate.EndpointPolicy.Audit), and one that those would
 * drop is forwarded with verdict VERDICT_AUDIT, the reason and rule that would have
 * dropped it (policy_audit). EP_AUDIT_ENFORCE_*: those entries enforce the direction
 * (default deny). */
#define EP_AUDIT_INGRESS (1u << 9)
#define EP_AUDIT_EGRESS (1u << 10)
#define EP_AUDIT_ENFORCE_INGRESS (1u << 11)
#define EP_AUDIT_ENFORCE_EGRESS (1u << 12)
#define AUDIT_EP_FLAG (1u << 31)
#define HOST_EP_ID 4095 /* RAMPART_MAX_ENDPOINTS - 1 */
#if HOST_EP_ID != RAMPART_MAX_ENDPOINTS - 1
#error "HOST_EP_ID must be the last endpoint ID"
#endif
/* The rule ID of a host flow that host_safe admits whatever host policy says (the API
 * server connection): mapstate.HostSafeRuleID. */
#define HOST_SAFE_RULE_ID 0xFFFFFFFEu
/* The VXLAN overlay's UDP port (overlay.Port). */
#define VXLAN_PORT 4789

/* Verdicts in flow events. */
enum flow_verdict : __u8 {
	VERDICT_FORWARDED = 1,
	VERDICT_DROPPED = 2,
	VERDICT_REDIRECTED = 3, /* new flow steered to the L7 proxy */
	VERDICT_AUDIT = 4,      /* new flow forwarded that a policy in audit mode would drop */
};

/* Drop reasons (flow_event.reason). REASON_NONE: no drop, the only code 0 of the
 * vocabulary (named "none"). */
enum drop_reason : __u8 {
	REASON_NONE = 0,
	REASON_POLICY_DENY = 1,         /* matched a deny rule */
	REASON_POLICY_DEFAULT_DENY = 2, /* enforcement on, no rule allows */
	REASON_MALFORMED = 3,           /* truncated or invalid header */
	REASON_FRAGMENT_UNKNOWN = 4,    /* non-first fragment whose first fragment was not seen */
	REASON_UNKNOWN_ENDPOINT = 5,    /* packet on an interface with no endpoint_info (fail closed) */
	REASON_UNSUPPORTED_L3 = 6,      /* not IPv4, ARP or IPv6, or IPv6 of an endpoint without an
	                                 * IPv6 address */
	REASON_PROXY_UNAVAILABLE = 7,   /* L7 policy applies, but no proxy socket to hand it to */
	REASON_PROXY_BYPASS = 8,        /* L7 policy applies, but the packet did not come from the proxy */
	REASON_L7_UNCHECKED = 9,        /* send-side verdict flow: data from a socket it does not check */
	REASON_SPOOFED_SOURCE = 10,     /* source (IPv4 or ARP sender) not the sending endpoint's own
	                                 * address, or a local endpoint's address that did not come
	                                 * from that endpoint's interface */
	REASON_TUNNEL_UNTRUSTED_SOURCE = 11, /* overlay packet whose outer source is not a known
	                                      * node's address: its VNI (identity) is not believed */
	REASON_TUNNEL_NO_ENDPOINT = 12,      /* sent into the overlay to an address no known node
	                                      * hosts (no tunnel endpoint in the ipcache) */
	REASON_TAP_MONITOR_UNAVAILABLE = 13, /* a redirect tap matched, but its monitor is down or
	                                      * its interface gone (fail closed, tap.h) */
	REASON_TAP_NOT_DIVERTED = 14,        /* sent by a monitor, but not a packet of a flow the
	                                      * dataplane diverted to it on that interface (tap.h) */
	REASON_TAP_MONITOR_DESTINATION = 15, /* a new flow addressed to a monitor endpoint, which
	                                      * is not a destination (tap.h) */
	REASON_PEER_IDENTITY_CHANGED = 16,   /* packet of an established flow (or a later
	                                      * fragment) whose peer now has another identity,
	                                      * which policy does not allow */
	REASON_IPV6_EXTENSION = 17,          /* an IPv6 extension header the dataplane does not
	                                      * follow: a routing header with segments left (the
	                                      * destination is not the final one), a jumbogram,
	                                      * more than IPV6_MAX_EXT_HDRS headers, or a
	                                      * hop-by-hop header after the first */
};

/* Flow event types. */
enum flow_event_type : __u8 {
	EVENT_NEW = 1, /* first packet of a connection, allowed */
	EVENT_DROP = 2,
};

/* flow_event.flags, a bit mask: how the L7 proxy or the send-side verdict is involved in
 * the flow, and whether it is an ARP frame. */
enum flow_flag : __u8 {
	FLOW_F_NONE = 0,
	FLOW_F_L7_EGRESS = 1 << 0,  /* the source endpoint's egress policy redirects it */
	FLOW_F_L7_INGRESS = 1 << 1, /* the destination endpoint's ingress policy redirects it */
	FLOW_F_FROM_PROXY = 1 << 2, /* the proxy's upstream connection (socket mark) */
	FLOW_F_SEND_SIDE = 1 << 3,  /* L7 checked by the send-side verdict, not the proxy */
	FLOW_F_ARP = 1 << 4,        /* an ARP frame (addresses: sender and target IP) */
	FLOW_F_TUNNEL = 1 << 5,     /* arrived through the overlay: the source identity is the VNI's */
	FLOW_F_TAPPED = 1 << 6,     /* a tap rule matched: mirrored to or diverted through a monitor */
	FLOW_F_DNS_OBSERVE = 1 << 7, /* a DNS query policy allowed, handed to the DNS proxy to learn
				      * its answer's names (EP_DNS_OBSERVE) */
};

/* endpoints map: key = ifindex of the host-side veth (u32). */
/* host_safe: a peer of the node and its port (network order) that the node's own flows
 * reach whatever host policy says, both ways (the API server). */
struct host_safe_key {
	__be32 addr;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/* host_safe6: host_safe for an IPv6 peer. */
struct host_safe6_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct endpoint_info {
	__u32 ep_id;    /* agent-assigned endpoint number, 1..RAMPART_MAX_ENDPOINTS-1 */
	__u32 identity; /* security identity of the endpoint */
	__u32 flags;    /* EP_ENFORCE_* */
	/* Policy revision: the agent bumps it after changing the endpoint's policy entries.
	 * A conntrack entry records the revision its flow was last checked against; an
	 * established packet whose entry has another one is checked again (conntrack.h). */
	__u32 revision;
	/* The endpoint's IPv4 address (network order): the only source its packets and ARP
	 * frames may carry (anti-spoofing, see handle in rampart.c). 0 drops every packet it
	 * sends. */
	__be32 addr;
};

/* endpoint_slots value: the endpoint on interface ifindex, in slot ifindex mod
 * RAMPART_EP_SLOTS. ifindex is last: the agent writes a slot with one copy of the whole
 * value, and a program that finds the slot's ifindex equal to its packet's has, on x86
 * (stores seen in order, copies forward), the info written before it. */
struct endpoint_slot {
	struct endpoint_info info;
	__u32 ifindex; /* 0: an empty slot */
};

/* flow_cache: see flowcache.h. Slots of 64 bytes; each holds one struct
 * flow_cache_entry at byte flow_cache_offset (set by the agent from the kernel's array
 * layout, so that the entry sits in one cache line). The slot count keeps the whole array
 * (with the kernel's header of about 300 bytes) under 32 KiB, the size the kernel
 * allocates from its linear mapping. */
#ifndef RAMPART_FLOW_CACHE_SLOTS
#define RAMPART_FLOW_CACHE_SLOTS 448
#endif
#define RAMPART_FLOW_CACHE_SLOT_BYTES 64

struct flow_cache_entry {
	__u32 seq;      /* even: stable; odd: being written (flowcache.h) */
	__u32 synced;   /* low 32 bits of the jiffy when conntrack last confirmed the flow */
	__u32 ifindex;  /* interface of the policy point; 0: empty */
	__u32 revision; /* the check revision the flow was last checked against (ct_value) */
	__be32 laddr;   /* the flow, oriented as in struct ct4_key */
	__be32 raddr;
	__be16 lport;
	__be16 rport;
	/* The protocol (low 8 bits) and, for a packet that entered the endpoint from the
	 * overlay, the identity its VNI carried (upper 24 bits, pkt.tunnel_id): a packet
	 * with another VNI is another entry. */
	__u32 proto_tunnel;
};

struct flow_cache_slot {
	__u8 bytes[RAMPART_FLOW_CACHE_SLOT_BYTES];
};

/* flow_cache6: the flow cache of IPv6 flows (flowcache.h). An entry is 56 bytes, so a
 * slot is two lines: wherever the kernel's array header puts the slot's start within a
 * line, an entry at byte flow_cache6_offset of its slot sits in one. As many slots as keep
 * the array under 32 KiB, as flow_cache's. */
#ifndef RAMPART_FLOW_CACHE6_SLOTS
#define RAMPART_FLOW_CACHE6_SLOTS 224
#endif
#define RAMPART_FLOW_CACHE6_SLOT_BYTES 128

/* struct flow_cache_entry with 16-byte addresses: the same first two words and the same
 * last one. */
struct flow_cache6_entry {
	__u32 seq;
	__u32 synced;
	__u32 ifindex;
	__u32 revision;
	__u8 laddr[16]; /* the flow, oriented as in struct ct6_key */
	__u8 raddr[16];
	__be16 lport;
	__be16 rport;
	__u32 proto_tunnel;
};

struct flow_cache6_slot {
	__u8 bytes[RAMPART_FLOW_CACHE6_SLOT_BYTES];
};

/* ipcache: LPM trie from address to identity. prefixlen counts bits of family+pad (32)
 * plus the address prefix length. */
struct ipcache_key {
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct ipcache_value {
	__u32 identity;      /* endpoint, reserved or CIDR identity of the longest prefix */
	__u32 cidr_identity; /* for endpoint/host addresses: ID_FLAG_ENDPOINT_CIDR | CIDR
	                      * identity of the longest policy prefix containing it, or 0 */
	__u32 ep_id;         /* for a local endpoint's /32: its ep_id (its ingress policy is
	                      * evaluated at the sender's veth for L7 steering), else 0 */
	__be32 tunnel_endpoint; /* for a pod on another node: that node's IPv4 address, where
	                         * the overlay sends its packets; 0: local, or no tunnel */
};

/* policy: LPM trie. Exact match on ep_id, identity and direction; then protocol; then the
 * destination port as a bit prefix (port ranges are split into prefixes by the agent).
 * Full key = 32+32+8+8+16 = 96 bits after prefixlen.
 *   prefixlen 72: any protocol (and any port)
 *   prefixlen 80: this protocol, any port
 *   prefixlen 80+k: this protocol, ports sharing the first k bits of dport
 * identity 0 means "any peer"; it is looked up separately from the peer's own identity.
 * For ICMP, dport holds the ICMP type (upper byte 0). */
struct policy_key {
	__u32 prefixlen;
	__u32 ep_id;
	__u32 identity;
	__u8 direction;
	__u8 protocol;
	__be16 dport;
};

#define POLICY_ALLOW 1
#define POLICY_DENY 2
#define POLICY_REDIRECT 3 /* allowed only through the L7 proxy (TCP) */
#define POLICY_PASS 4     /* ClusterNetworkPolicy Pass: no decision in this tier */

/* policy_key.direction | DIR_ADMIN_FLAG: an Admin tier entry (ClusterNetworkPolicy). */
#define DIR_ADMIN_FLAG 0x10

/* policy_value.proxy: which proxy a POLICY_REDIRECT entry steers to. */
#define PROXY_KIND_L7 0  /* the L7 (HTTP) proxy, map proxy */
#define PROXY_KIND_DNS 1 /* the DNS proxy, map dns_proxy (UDP and TCP) */

/* policy_value.prec orders entries that several lookups of one packet find: the lower
 * value wins, then the higher action (deny > redirect > allow > pass). NetworkPolicy and
 * Cilium entries are all 0, so among them only the action counts; ClusterNetworkPolicy
 * entries carry 1 + their rule's place in the tier's order (priority, then rule order), and
 * Baseline entries lose to every NetworkPolicy-tier entry. */
struct policy_value {
	__u8 action; /* POLICY_ALLOW, POLICY_DENY, POLICY_REDIRECT or POLICY_PASS */
	__u8 proxy;  /* PROXY_KIND_*, for POLICY_REDIRECT */
	__u16 prec;
	__u32 rule_id; /* agent's rule number, for flow events and explanations */
};

/* Connection tracking of IPv4 flows. One entry per (endpoint, flow) as seen at that
 * endpoint's policy point, keyed from the endpoint's side: its own address and port
 * first, then the peer's. A packet of the flow in either direction builds the same key
 * (leaving the endpoint, the source is the endpoint's side; entering it, the destination),
 * so every packet, reply or not, costs one lookup. The entry's direction is that of the
 * flow's first packet: a packet in that direction is established, in the other a reply.
 * IPv6 flows will get a map of their own (16-byte addresses): every packet hashes and
 * compares its key, and a 20-byte key costs an IPv4 packet less than one sized for IPv6. */
struct ct4_key {
	__be32 laddr; /* the endpoint's side */
	__be32 raddr; /* the peer's side */
	__be16 lport;
	__be16 rport;
	__u32 ep_id;
	__u8 protocol;
	__u8 pad[3];
};

/* Connection tracking of IPv6 flows (map conntrack6): struct ct4_key with 16-byte
 * addresses, the same values and rules (conntrack.h, ipv6.h). */
struct ct6_key {
	__u8 laddr[16]; /* the endpoint's side */
	__u8 raddr[16]; /* the peer's side */
	__be16 lport;
	__be16 rport;
	__u32 ep_id;
	__u8 protocol;
	__u8 pad[3];
};

/* endpoints6: an endpoint's IPv6 addresses, by ep_id. An endpoint without an entry has no
 * IPv6: all of its IPv6 traffic drops (REASON_UNSUPPORTED_L3). */
struct endpoint6 {
	__u8 addr[16];    /* its address: the source its packets carry */
	__u8 lladdr[16];  /* its interface's link-local address: also a source, for the link */
};

struct ct_value {
	/* Times in jiffies (bpf_jiffies64: the kernel's tick counter, HZ a second); see
	 * conntrack.h. */
	__u64 created;
	__u64 last_seen;
	__u32 rule_id;
	__u32 flags;    /* CT_F_* */
	/* The check revision the flow was last checked against: the endpoint's policy
	 * revision (endpoint_info.revision) plus the ipcache generation (ipcache_gen), so
	 * that a policy change and an address's identity changing both differ from it. */
	__u32 revision;
	/* The VNI's identity of the flow's packets when last checked (pkt.tunnel_id; 0: not
	 * from the overlay). revision and tunnel_id are compared as one 8-byte word. */
	__u32 tunnel_id;
	/* The peer's identity the flow was admitted with (last checked with), as the new
	 * flow path derived it: the destination's for a flow leaving the endpoint, the
	 * source's (the VNI's through the overlay) for one entering it. 0: not recorded (a
	 * flow migrated from an earlier version): taken on the next check. */
	__u32 peer_identity;
	__u8 direction; /* DIR_* of the flow's first packet */
	__u8 pad[3];
};

#define CT_F_SEEN_REPLY (1u << 0)
#define CT_F_CLOSING (1u << 1)
#define CT_F_FIN_FWD (1u << 2) /* FIN seen in the flow's own direction */
#define CT_F_FIN_REV (1u << 3) /* FIN seen in the reply direction */
/* Set at the client's egress entry of a connection steered to the proxy: its forward
 * packets go to the proxy's accepted socket. */
#define CT_F_TO_PROXY (1u << 4)
/* Set at the server's ingress entry of the proxy's upstream connection: the server's
 * replies go to the proxy's upstream socket. */
#define CT_F_FROM_PROXY (1u << 5)
/* Set on both entries of a connection between local endpoints whose L7 rules the
 * send-side verdict checks on the client's socket (sockverdict.c): it goes straight to
 * the server, and its data must come from the socket the verdict checks. */
#define CT_F_SOCKVERDICT (1u << 6)
/* With CT_F_TO_PROXY: the flow is steered to the DNS proxy (map dns_proxy), not the L7
 * proxy. */
#define CT_F_DNS_PROXY (1u << 7)
/* With CT_F_DNS_PROXY: the flow goes to the DNS proxy's observing socket (dns_proxy index
 * 1), which judges no name (policy allowed the flow at L4). */
#define CT_F_DNS_OBSERVE (1u << 8)

/* IP fragments: the ports of the first fragment, so later fragments of an allowed
 * datagram get the same verdict. Keyed per endpoint and direction like conntrack, because
 * a datagram between two local endpoints passes two policy points with their own verdicts. */
struct frag_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 id;
	__u32 ep_id;
	__u8 protocol;
	__u8 family;
	__u8 direction;
	__u8 pad;
};

struct frag_value {
	__be16 sport;
	__be16 dport;
	__u8 allowed; /* verdict of the first fragment */
	__u8 reason;  /* REASON_* of the first fragment when it was dropped */
	__u8 pad[2];
	__u32 rule_id; /* rule that decided the first fragment */
	/* What the first fragment was judged as: its peer's identity, the VNI's identity it
	 * carried (pkt.tunnel_id) and the ipcache generation then. A later fragment of an
	 * allowed datagram with the same tunnel_id and generation passes; any other is
	 * judged on its own peer identity, which must be peer_identity. */
	__u32 peer_identity;
	__u32 tunnel_id;
	__u32 ipcache_gen;
};

/* Per-endpoint counters of what only the programs know: PERCPU_ARRAY endpoint_counters,
 * indexed by ep_id. Forwarded packets and bytes are not among them: the kernel counts
 * every packet on the endpoint's host-side interface anyway, and the agent derives them
 * from those statistics (datapath.Counters: the interface's counts less the drops), so
 * the packets of established flows, nearly all packets, update no counter here. */
struct ep_counters {
	__u64 ingress_drops;
	__u64 ingress_drop_bytes;
	__u64 egress_drops;
	__u64 egress_drop_bytes;
	__u64 to_proxy_packets;   /* handed to a proxy socket at this endpoint's veth */
	__u64 from_proxy_packets; /* into this endpoint from the proxy's upstream socket */
};

/* An interface's statistics when the endpoint was installed on it (map iface_base, by
 * ifindex, written and read by the agent only): forwarded counts are counted from there. */
struct iface_stats {
	__u64 rx_packets;
	__u64 rx_bytes;
	__u64 tx_packets;
	__u64 tx_bytes;
	__u64 tx_dropped;
};

/* The L7 proxy: where steered connections go, and the socket marks. One entry (index 0)
 * in the map proxy, written by the agent; port 0 means no proxy (steering fails closed). */
struct proxy_config {
	__u8 addr[16];       /* listener address in the node namespace (IPv4 in the first 4) */
	__be16 port;         /* listener port, network order */
	__u8 family;         /* RAMPART_FAMILY_V4 */
	__u8 pad;
	__u32 steer_mark;    /* set on steered packets; the node routes it to the local table */
	__u32 upstream_mark; /* socket mark of the proxy's upstream connections */
};

#define PROXY_DEFAULT_PORT 15001
#define PROXY_STEER_MARK 0x1
#define PROXY_UPSTREAM_MARK 0x2

/* The overlay (tunnel.h, ipip.h). One entry (index 0) in the map tunnel, written by the
 * agent when it attaches the overlay's programs; both 0: no overlay. */
struct tunnel_config {
	__u32 ifindex;      /* the VXLAN device, in the node namespace (0: not VXLAN) */
	__be32 ipip_local;  /* IP-in-IP: this node's address on the fabric, the outer source
	                     * of the packets it encapsulates and the outer destination of
	                     * those it decapsulates (0: not IP-in-IP) */
};

/* The VXLAN overlay over an IPv6 fabric (tunnel.h): the value of map tunnel_remote6, keyed
 * by a node's IPv4 address (ipcache_value.tunnel_endpoint, which names the node): its IPv6
 * fabric address, the outer destination of the packets and tap copies sent to it. */
struct tunnel_addr6 {
	__u8 addr[16];
};

/* Flow events, sent through the ring buffer. */
struct flow_event {
	__u64 timestamp_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 ep_id;
	__u32 src_identity;
	__u32 dst_identity;
	__u32 rule_id;
	__u32 ifindex;
	__u32 length;
	enum flow_event_type type;
	enum flow_verdict verdict;
	enum drop_reason reason;
	enum flow_direction direction;
	__u8 protocol;
	__u8 family;
	__u8 icmp_type; /* for ICMP */
	enum flow_flag flags; /* FLOW_F_* bits */
	/* The identity whose policy entry decided (peer, any = 0, flagged CIDR, or a CIDR set
	 * identity); 0 also when nothing matched (rule_id 0). */
	__u32 match_identity;
};

/* CIDR sets: which bank of the IPv4 tables is active and how each bank is laid out. One
 * entry (index 0) in the mmapable array cidr4_config, written by the agent through mmap
 * with 4-byte stores: a bank's fields (and its tables in cidr4_top and cidr4_host) are
 * written before bank switches to it. */
struct cidr_config {
	__u32 bank;          /* active bank, 0 or 1 */
	__u32 ready;         /* 1 once the agent set the maps up (0: maps just created) */
	__u32 host_slots[2]; /* hash table size used in each bank; 0: no host entries */
	__u32 seed[2];       /* hash seed of each bank */
	__u32 zero_mask[2];  /* set mask of the host entry 0.0.0.0 (0 marks an empty slot) */
};

/* IPv6 CIDR sets: LPM trie keyed by prefix; the value is the u32 mask of the sets that
 * contain every address of the prefix (its own sets and those of every shorter prefix
 * containing it), so the longest match gives an address's full membership. */
struct cidr6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Flow taps (tap.h): per endpoint, up to RAMPART_TAP_RULES rules in the hash tap_sets
 * (by ep_id), first match wins. A small fixed array keeps the per-packet cost (and the
 * verifier's) bounded; the agent refuses more rules per endpoint. */
#ifndef RAMPART_TAP_RULES
#define RAMPART_TAP_RULES 16
#endif
/* Contract IDs index tap_counters: 1 .. RAMPART_TAP_CONTRACTS-1 (0: packets a monitor
 * returned that belong to no diverted flow). */
#ifndef RAMPART_TAP_CONTRACTS
#define RAMPART_TAP_CONTRACTS 4096
#endif
#ifndef RAMPART_TAP_FLOWS_MAX
#define RAMPART_TAP_FLOWS_MAX 65536
#endif

#define TAP_ACTION_MIRROR 1   /* a copy to the monitor, the original goes on */
#define TAP_ACTION_REDIRECT 2 /* the packet goes through the monitor */

/* tap_rule.flags */
#define TAP_F_MONITOR_UP (1u << 0) /* the agent says the monitor is ready */
#define TAP_F_FAIL_OPEN (1u << 1)  /* redirect, monitor unavailable: pass untapped */
#define TAP_F_ICMP_TYPE (1u << 2)  /* match icmp_type (ICMP only) */
#define TAP_F_ICMP_CODE (1u << 3)  /* match icmp_code (ICMP only) */
#define TAP_F_REMOTE (1u << 4)     /* mirror to a monitor on another node: rx_ifindex is
                                    * the tap tunnel device, remote_node and monitor_key
                                    * the copy's tunnel key */

struct tap_rule {
	__be32 src_addr; /* the packet's source within src_addr/src_mask (network order) */
	__be32 src_mask;
	__be32 dst_addr; /* the packet's destination within dst_addr/dst_mask */
	__be32 dst_mask;
	__u16 sport_lo; /* port ranges, host order, inclusive (TCP, UDP, SCTP; 0-65535: any) */
	__u16 sport_hi;
	__u16 dport_lo;
	__u16 dport_hi;
	__u32 contract_id; /* index of tap_counters */
	__u32 rx_ifindex;  /* host side of the monitor's receive veth: copies and diverted
	                    * packets leave through it into the monitor */
	__u32 tx_ifindex;  /* host side of the monitor's return veth (redirect) */
	__u8 direction;    /* DIR_*: packets entering or leaving the endpoint */
	__u8 protocol;     /* 0: any */
	__u8 action;       /* TAP_ACTION_* */
	__u8 flags;        /* TAP_F_* */
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 pad[2];
	__be32 remote_node; /* TAP_F_REMOTE: the monitor's node address (network order) */
	__u32 monitor_key;  /* TAP_F_REMOTE: the VNI naming the monitor on its node (the low
	                     * 24 bits of its address; tap_monitor_keys there) */
};

struct tap_set {
	__u32 count; /* rules in use, from the first */
	__u32 pad;
	struct tap_rule rules[RAMPART_TAP_RULES];
};

/* An endpoint's tap rules for IPv6 packets (tap_sets6, tap6.h): the IPv6 prefixes a packet's
 * addresses must be in, and the rest of the rule as for IPv4 (r: its IPv4 addresses and
 * masks zero; protocol IPPROTO_ICMPV6 for ICMP). */
struct tap_rule6 {
	__be32 src_addr[4]; /* network order, masked */
	__be32 src_mask[4];
	__be32 dst_addr[4];
	__be32 dst_mask[4];
	struct tap_rule r;
};

struct tap_set6 {
	__u32 count;
	__u32 pad;
	struct tap_rule6 rules[RAMPART_TAP_RULES];
};

/* tap_flows: a packet diverted to a monitor, by its own 5-tuple and the monitor's return
 * interface. Only a packet that comes back on that interface with the same tuple finds it. */
struct tap_flow_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport; /* fragment: the datagram's IP ID */
	__be16 dport; /* fragment: 0 */
	__u32 ifindex; /* tap_rule.tx_ifindex */
	__u8 protocol;
	__u8 fragment; /* 1: a later fragment of a diverted datagram (no ports: by IP ID) */
	__u8 pad[2];
};

/* tap_flows6: tap_flow_key for IPv6; a later fragment is found by its datagram's
 * identification (frag_id), with no ports. */
struct tap_flow_key6 {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 frag_id;
	__u32 ifindex;
	__u8 protocol;
	__u8 fragment;
	__u8 pad[2];
};

struct tap_flow_value {
	__u64 last_seen;        /* jiffies of the last divert */
	__u32 src_identity;     /* the packet's source identity at the policy point */
	__u32 ep_id;            /* the endpoint whose tap diverted it */
	__u32 deliver_ifindex;  /* ingress taps: the endpoint's veth, where it goes back to;
	                         * 0 (egress taps): the node routes it as it would have */
	__u32 contract_id;
	__u8 direction;         /* DIR_* of the tap */
	__u8 verdict;           /* VERDICT_FORWARDED: what the policy point decided */
	__u8 pad[2];
};

/* Per contract, per CPU (tap_counters). */
struct tap_stats {
	__u64 mirrored_packets;
	__u64 mirrored_bytes;
	__u64 copies_lost;       /* copies the monitor's interface did not take (or monitor down) */
	__u64 redirected_packets;
	__u64 redirected_bytes;
	__u64 returned_packets;  /* came back from the monitor and went on */
	__u64 returned_bytes;
	__u64 unavailable_drops; /* redirect with the monitor unavailable: dropped */
	__u64 unavailable_passed; /* the same with fail-open: passed untapped */
	__u64 rejected;          /* contract 0: sent by a monitor, not diverted (dropped) */
	__u64 remote_delivered;  /* contract 0: copies from other nodes given to a monitor */
	__u64 remote_lost;       /* contract 0: copies from other nodes for no monitor here, or
	                          * that its interface did not take */
};

/* tap_frags: what the tap of a first fragment did, for the datagram's later fragments
 * (which carry no ports to match rules with), by the frag_key of the policy point. */
struct tap_frag_value {
	struct tap_rule rule; /* the rule the first fragment matched, as it was then */
	__u8 tapped;          /* 0: no rule matched the first fragment */
	__u8 pad[3];
};

/* tap_ifaces: the host sides of monitors' veths, by ifindex. */
#define TAP_IF_RX 1
#define TAP_IF_TX 2

struct tap_iface {
	__u32 role;          /* TAP_IF_* */
	__u32 monitor_ep_id; /* the monitor endpoint, for drop counters and events (0: none) */
};

#endif /* __RAMPART_H */
