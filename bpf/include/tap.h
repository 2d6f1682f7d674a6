/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow taps: chosen flows of an endpoint are copied to (mirror) or diverted through
 * (redirect) a security monitor, an endpoint with two extra veth pairs: it receives on
 * one (rx) and, for redirect, sends what it lets through back on the other (tx).
 *
 * Taps run at the endpoint's policy point after the policy verdict, and only for packets
 * it passes: a packet policy denies is never tapped, a monitor never sees it. The rules
 * of an endpoint (tap_sets, by ep_id, at most RAMPART_TAP_RULES, first match wins) are
 * looked at only when its endpoint_info has EP_TAP_INGRESS/EP_TAP_EGRESS for the
 * packet's direction, so untapped endpoints pay nothing.
 *
 *   mirror:   bpf_clone_redirect of the packet to the egress of the rx veth's host side
 *             (so it enters the monitor); the original goes on unchanged. A copy the
 *             monitor's interface does not take (gone, down, backlog full) is counted in
 *             copies_lost and changes nothing for the original.
 *   redirect: the packet is recorded in tap_flows (its own 5-tuple and the monitor's tx
 *             interface -> where it came from) and sent to the monitor instead of its
 *             destination. What the monitor sends back on tx goes through tap_return
 *             (rampart_from_monitor, tc ingress of the rx and tx host sides): a packet
 *             with no record for that tuple on that interface is dropped
 *             (REASON_TAP_NOT_DIVERTED), so a monitor can neither inject flows nor
 *             rewrite addresses or ports of a diverted one. A recorded packet continues
 *             as the original would have: an egress tap's packet is routed by the node
 *             (to a local destination's veth, whose ingress policy judges it with the
 *             source identity of the record, or into the overlay); an ingress tap's goes
 *             back to the endpoint's veth, whose conntrack entry admits it.
 *   fail closed: a redirect whose monitor the agent marked down (TAP_F_MONITOR_UP clear)
 *             or whose rx interface refuses the packet drops it
 *             (REASON_TAP_MONITOR_UNAVAILABLE), unless the rule has TAP_F_FAIL_OPEN: then
 *             it passes untapped.
 *
 * Monitors on other nodes receive copies only (mirror): a rule with TAP_F_REMOTE gives the
 * packet a tunnel key (the monitor's node, at its IPv6 fabric address when tunnel_remote6
 * has one, and as VNI the monitor's key, the low 24 bits of its address) and clones it into the node's tap tunnel device, a collect_md VXLAN
 * device of its own port with no program on its egress, so the key stays the rule's. On
 * the monitor's node rampart_from_tap_tunnel (tap_tunnel_ingress) takes what that device
 * decapsulates from known nodes only (either family: tunnel_from_node) and hands it to the monitor the key names
 * (tap_monitor_keys), or drops it: a copy is never delivered anywhere but into a
 * monitor. A redirect is never sent to another node: its packets would have to come back
 * with their identity, which the tunnel key has no room for; such a rule is unavailable
 * (fails closed). The original keeps the tunnel key it was given; it is harmless: the
 * node's routing and the VXLAN overlay replace it, and a veth drops it.
 *
 * A packet that came back from a monitor (skb->ingress_ifindex a monitor's tx interface)
 * is not tapped again, and a packet that a local sender's egress rule mirrored is not
 * mirrored to the same monitor again as it enters its destination
 * (tap_mirrored_by_sender). Packets handed to the L7 proxy socket at the client's veth
 * are mirrored but not diverted: they go to the proxy, not to their destination.
 *
 * Fragments: a later fragment has no ports to match rules with, so it goes where its
 * datagram's first fragment went. The tap of a first fragment is recorded in tap_frags (the
 * rule it matched, or none), and its later fragments, which the policy point passes by the
 * first fragment's verdict, are mirrored or diverted by that rule. A diverted later
 * fragment's record in tap_flows is keyed by the datagram's IP ID (tap_flow_key.fragment),
 * so the monitor can send it back. A monitor thus gets every fragment of a tapped datagram
 * and reassembles it (Suricata does); an inline monitor that drops one fragment keeps the
 * datagram from its destination. A later fragment whose first fragment's tap decision is
 * forgotten is dropped when a redirect rule could have diverted its datagram. */
#ifndef __RAMPART_TAP_H
#define __RAMPART_TAP_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "events.h"
#include "conntrack.h"

/* The tap functions are global subprograms: the verifier checks each once, whatever
 * state the endpoint program reaches them in, instead of at every call path (the tc
 * programs' verification stays under its 1M instruction limit). Their pointer
 * arguments are never NULL (__arg_nonnull, common.h). */
#include "tunnel.h"
#include "proxy.h"

#ifndef PACKET_HOST
#define PACKET_HOST 0
#endif

/* ep_id -> the endpoint's tap rules. A hash, not an array: the agent replaces a set with
 * one update, which a program sees whole (an array value would be rewritten in place
 * under a reader). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct tap_set);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_sets SEC(".maps");

/* Diverted flows (struct tap_flow_key). LRU: a record evicted while its packets are in the
 * monitor only makes those packets drop on return (fail closed). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RAMPART_TAP_FLOWS_MAX);
	__type(key, struct tap_flow_key);
	__type(value, struct tap_flow_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_flows SEC(".maps");

/* The tap decision of first fragments (struct tap_frag_value), for their datagrams' later
 * fragments; written for every first fragment at a policy point with tap rules in its
 * direction, so that a missing entry means "not known" rather than "not tapped". LRU, as
 * frags_peer. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RAMPART_FRAG_MAX);
	__type(key, struct frag_key);
	__type(value, struct tap_frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_frags SEC(".maps");

/* Per contract counters (struct tap_stats), indexed by contract ID. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RAMPART_TAP_CONTRACTS);
	__type(key, __u32);
	__type(value, struct tap_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_counters SEC(".maps");

/* ifindex of a monitor veth's host side -> its role. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct tap_iface);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_ifaces SEC(".maps");

/* The low 24 bits of a local monitor's address (tap_rule.monitor_key on the sending node)
 * -> the host side of its receive veth. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_monitor_keys SEC(".maps");

/* tap_rule_l4_match matches rule r's protocol, ports and ICMP fields (icmp: the packet is
 * ICMP of its family, whose protocol number the rule has) against a packet's, in either
 * family. */
static __always_inline int tap_rule_l4_match(const struct tap_rule *r, __u8 proto, int icmp,
					     __be16 sp, __be16 dp, __u8 icmp_type, __u8 icmp_code)
{
	__u16 sport, dport;

	if (!r->protocol)
		return 1;
	if (r->protocol != proto)
		return 0;
	if (icmp) {
		if ((r->flags & TAP_F_ICMP_TYPE) && r->icmp_type != icmp_type)
			return 0;
		if ((r->flags & TAP_F_ICMP_CODE) && r->icmp_code != icmp_code)
			return 0;
		return 1;
	}
	sport = bpf_ntohs(sp);
	dport = bpf_ntohs(dp);
	return sport >= r->sport_lo && sport <= r->sport_hi && dport >= r->dport_lo &&
	       dport <= r->dport_hi;
}

static __always_inline int tap_rule_match(const struct tap_rule *r, const struct pkt *p, __u8 dir)
{
	if (r->direction != dir)
		return 0;
	if ((p->t.saddr & r->src_mask) != r->src_addr || (p->t.daddr & r->dst_mask) != r->dst_addr)
		return 0;
	return tap_rule_l4_match(r, p->t.proto, p->t.proto == IPPROTO_ICMP, p->t.sport, p->t.dport,
				 p->icmp_type, p->icmp_code);
}

/* tap_find returns the index of the first of endpoint ep_id's rules that matches p in
 * direction dir, or -1. Out of line: one copy of the bounded loop for both callers. */
__noinline int tap_find(__u32 ep_id, const struct pkt *p __arg_nonnull, __u8 dir)
{
	struct tap_set *s = bpf_map_lookup_elem(&tap_sets, &ep_id);
	int i;

	if (!s)
		return -1;
	for (i = 0; i < RAMPART_TAP_RULES; i++) {
		if (i >= s->count)
			break;
		if (tap_rule_match(&s->rules[i], p, dir))
			return i;
	}
	return -1;
}

/* tap_same_mirror says whether a sender's rule r mirrors to the monitor at receive interface
 * rx (and key, for a monitor on another node). */
static __always_inline int tap_same_mirror(const struct tap_rule *r, __u32 rx, __u32 key)
{
	return r->action == TAP_ACTION_MIRROR && r->rx_ifindex == rx && r->monitor_key == key;
}

/* tap_sender_of is the endpoint whose veth the node received the packet on when it has
 * egress taps (tap_mirrored_by_sender), else NULL. */
static __always_inline struct endpoint_info *tap_sender_of(struct __sk_buff *skb)
{
	__u32 iif = skb->ingress_ifindex;
	struct endpoint_info *src;

	if (!iif)
		return NULL;
	src = bpf_map_lookup_elem(&endpoints, &iif);
	return src && (src->flags & EP_TAP_EGRESS) ? src : NULL;
}

/* tap_frag_rule is the rule the first fragment of p's datagram matched at endpoint ep_id in
 * direction dir (k: its frag_key), NULL when none did or it is not known. */
static __always_inline struct tap_rule *tap_frag_rule(const struct frag_key *k)
{
	struct tap_frag_value *v = bpf_map_lookup_elem(&tap_frags, k);

	return v && v->tapped ? &v->rule : NULL;
}

/* tap_mirrored_by_sender says whether a packet entering an endpoint, to be mirrored to
 * receive interface rx (and, for a monitor on another node, key), was mirrored to the same
 * monitor as it left its sender, a local endpoint: a contract whose source is both ends of
 * a connection (a selector that matches both) would otherwise hand the monitor every
 * packet twice, and the monitor would raise each alert twice. The packet entered the node
 * through the sender's veth (skb->ingress_ifindex), so that endpoint's egress tap rules
 * ran on this very tuple; its copy is the one kept (or counted lost there). Out of line:
 * only mirrored packets entering a tapped endpoint get here. */
static __noinline int tap_mirrored_by_sender(struct __sk_buff *skb, const struct pkt *p __arg_nonnull,
					     __u32 rx, __u32 key)
{
	struct endpoint_info *src = tap_sender_of(skb);
	struct tap_set *s;
	struct tap_rule *r;
	__u32 ep_id;
	int i;

	if (!src)
		return 0;
	ep_id = src->ep_id;
	if (p->frag == FRAG_LATER) {
		/* The sender's rule for a later fragment is its first fragment's. */
		struct frag_key k;

		frag_key_fill(&k, p, ep_id, DIR_EGRESS);
		r = tap_frag_rule(&k);
		if (!r)
			return 0;
	} else {
		i = tap_find(ep_id, p, DIR_EGRESS);
		if (i < 0 || i >= RAMPART_TAP_RULES)
			return 0;
		s = bpf_map_lookup_elem(&tap_sets, &ep_id);
		if (!s)
			return 0;
		r = &s->rules[i];
	}
	return tap_same_mirror(r, rx, key);
}

/* tap_from_monitor says whether the packet came back from a monitor (the interface the
 * node received it on is a monitor's). */
static __always_inline int tap_from_monitor(struct __sk_buff *skb)
{
	__u32 iif = skb->ingress_ifindex;

	return iif && bpf_map_lookup_elem(&tap_ifaces, &iif) != NULL;
}

/* tap_flow_key_of is the key of p's record on the monitor's return interface ifindex: its
 * 5-tuple, or for a later fragment (no ports) its datagram's IP ID. */
static __always_inline void tap_flow_key_of(struct tap_flow_key *k, const struct pkt *p, __u32 ifindex)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = p->t.saddr;
	k->daddr = p->t.daddr;
	if (p->frag == FRAG_LATER) {
		k->sport = p->ip_id;
		k->fragment = 1;
	} else {
		k->sport = p->t.sport;
		k->dport = p->t.dport;
	}
	k->ifindex = ifindex;
	k->protocol = p->t.proto;
}

/* tap_record_in returns the record at key k of map (tap_flows, tap_flows6), if it was
 * written recently enough. */
static __always_inline struct tap_flow_value *tap_record_in(void *map, const void *k)
{
	struct tap_flow_value *v = bpf_map_lookup_elem(map, k);

	if (!v || bpf_jiffies64() - v->last_seen > ct_timeout_other)
		return NULL;
	return v;
}

/* tap_record_of returns the record of a packet that a monitor sent back on ifindex, if the
 * dataplane diverted a packet with the same tuple to that monitor recently enough. */
static __always_inline struct tap_flow_value *tap_record_of(const struct pkt *p, __u32 ifindex)
{
	struct tap_flow_key k;

	tap_flow_key_of(&k, p, ifindex);
	return tap_record_in(&tap_flows, &k);
}

/* tap_returned_record gives peer the identity of record v, of a packet back from a monitor:
 * 1 when there is one, else 0. */
static __always_inline int tap_returned_record(const struct tap_flow_value *v, struct peer_identity *peer)
{
	if (!v)
		return 0;
	peer->identity = v->src_identity;
	return 1;
}

/* tap_returned_source: for a new flow entering an endpoint whose packet came back from a
 * monitor (judge_local_source), the identity the packet had when it was diverted. Returns
 * 1 (and sets peer's identity) when the packet has a record, else 0. Out of line: only for
 * new flows received on some interface. */
static __noinline int tap_returned_source(struct __sk_buff *skb, const struct pkt *p,
					  struct peer_identity *peer)
{
	__u32 iif = skb->ingress_ifindex;

	if (!bpf_map_lookup_elem(&tap_ifaces, &iif))
		return 0;
	return tap_returned_record(tap_record_of(p, iif), peer);
}

static __always_inline struct tap_stats *tap_counters_of(__u32 contract_id)
{
	return bpf_map_lookup_elem(&tap_counters, &contract_id);
}

/* tap_peer_identity resolves the identity at the other end of the packet (for records and
 * events): the destination's when it leaves the endpoint, else the source's. */
static __always_inline __u32 tap_peer_identity(struct __sk_buff *skb, const struct pkt *p, __u8 dir)
{
	struct peer_identity peer;
	struct decision scratch = {};

	ipcache_resolve(dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, &peer);
	if (dir == DIR_INGRESS)
		tunnel_source(skb, &peer, &scratch);
	return peer.identity;
}

/* tap_record_at writes (or refreshes, at most every tick) the record of a diverted packet
 * at key k of map (tap_flows, or tap_flows6); peer: its source identity when it enters the
 * endpoint. */
static __always_inline void tap_record_at(void *map, const void *k, struct __sk_buff *skb,
					  const struct endpoint_info *ep, __u8 dir,
					  const struct tap_rule *r, __u32 peer)
{
	struct tap_flow_value v = {}, *old;
	__u64 now = bpf_jiffies64();
	__u32 deliver = dir == DIR_INGRESS ? skb->ifindex : 0;

	old = bpf_map_lookup_elem(map, k);
	if (old && old->last_seen == now && old->ep_id == ep->ep_id &&
	    old->deliver_ifindex == deliver && old->contract_id == r->contract_id)
		return;
	v.last_seen = now;
	v.src_identity = dir == DIR_EGRESS ? ep->identity : peer;
	v.ep_id = ep->ep_id;
	v.deliver_ifindex = deliver;
	v.contract_id = r->contract_id;
	v.direction = dir;
	v.verdict = VERDICT_FORWARDED;
	bpf_map_update_elem(map, k, &v, BPF_ANY);
}

/* tap_record writes the record of a diverted IPv4 packet. */
static __always_inline void tap_record(struct __sk_buff *skb, const struct pkt *p,
				       const struct endpoint_info *ep, __u8 dir,
				       const struct tap_rule *r)
{
	struct tap_flow_key k;

	tap_flow_key_of(&k, p, r->tx_ifindex);
	tap_record_at(&tap_flows, &k, skb, ep, dir, r,
		      dir == DIR_INGRESS ? tap_peer_identity(skb, p, dir) : 0);
}

/* tap_fails_open counts a redirect whose monitor cannot take the packet, and says whether
 * it passes untapped (fail_open) rather than drops. */
static __always_inline int tap_fails_open(struct tap_stats *c, int fail_open)
{
	if (c) {
		if (fail_open)
			c->unavailable_passed++;
		else
			c->unavailable_drops++;
	}
	return fail_open;
}

/* tap_unavailable handles a redirect whose monitor cannot take the packet. */
static __always_inline int tap_unavailable(struct __sk_buff *skb, struct pkt *p,
					   const struct endpoint_info *ep, __u8 dir, int fail_open,
					   struct tap_stats *c)
{
	struct decision d = {.ep_id = ep->ep_id, .dir = dir, .ev_flags = FLOW_F_TAPPED};
	__u32 peer;

	if (tap_fails_open(c, fail_open))
		return TC_ACT_OK;
	peer = tap_peer_identity(skb, p, dir);
	d.src_identity = dir == DIR_EGRESS ? ep->identity : peer;
	d.dst_identity = dir == DIR_EGRESS ? peer : ep->identity;
	/* Drop: the redirect tap's monitor is down or gone; the flow must not pass unchecked
	 * (fail closed). */
	return drop(skb, p, &d, REASON_TAP_MONITOR_UNAVAILABLE);
}

/* tap_steered says whether the endpoint's packet was just handed to the L7 proxy's socket
 * (proxy_assign marks it; a packet arrives from the endpoint's namespace with no mark). */
static __always_inline int tap_steered(struct __sk_buff *skb)
{
	const struct proxy_config *cfg = proxy_cfg();

	return cfg && cfg->steer_mark && (skb->mark & cfg->steer_mark) == cfg->steer_mark;
}

/* tap_remote_key gives the packet the tunnel key of a copy for a monitor on another node. */
static __always_inline int tap_remote_key(struct __sk_buff *skb, const struct tap_rule *r)
{
	struct bpf_tunnel_key key = {};
	__u64 flags = tunnel_key_to(&key, &r->remote_node);

	key.tunnel_id = r->monitor_key;
	key.tunnel_ttl = TUNNEL_TTL;
	return bpf_skb_set_tunnel_key(skb, &key, sizeof(key), flags);
}

/* tap_send runs rule r on a packet its policy point passes (r: the first rule the packet,
 * or its datagram's first fragment, matched); returns the tc verdict. Out of line: the
 * stack of tap_apply's caller is deep. */
/* tap_mirror sends a copy of the packet (len bytes) to rule r's monitor; the original goes
 * on (TC_ACT_OK). */
static __always_inline int tap_mirror(struct __sk_buff *skb, const struct tap_rule *r,
				      struct tap_stats *c, __u32 len)
{
	if (!(r->flags & TAP_F_MONITOR_UP) ||
	    ((r->flags & TAP_F_REMOTE) && tap_remote_key(skb, r) < 0) ||
	    bpf_clone_redirect(skb, r->rx_ifindex, 0)) {
		if (c)
			c->copies_lost++;
	} else if (c) {
		c->mirrored_packets++;
		c->mirrored_bytes += len;
	}
	return TC_ACT_OK;
}

/* tap_diverts says whether rule r diverts a packet in direction dir: a redirect, unless
 * the packet was handed to the L7 proxy's socket (bpf_sk_assign), where it goes to the
 * proxy, which the monitor cannot sit in front of. */
static __always_inline int tap_diverts(struct __sk_buff *skb, const struct tap_rule *r, __u8 dir)
{
	return r->action == TAP_ACTION_REDIRECT && !(dir == DIR_EGRESS && tap_steered(skb));
}

/* tap_monitor_local_up says whether a redirect's monitor is up and on this node. */
static __always_inline int tap_monitor_local_up(const struct tap_rule *r)
{
	return (r->flags & (TAP_F_MONITOR_UP | TAP_F_REMOTE)) == TAP_F_MONITOR_UP;
}

/* tap_divert sends the packet (len bytes, recorded) into rule r's monitor instead of its
 * destination; returns 1 when the monitor's interface took it (the caller then consumes
 * the original), 0 when it did not. A clone and the original consumed, rather than
 * bpf_redirect: the clone's transmit reports at once whether the monitor's interface took
 * the packet, so a gone or down monitor fails closed at once, with an event. */
static __always_inline int tap_divert(struct __sk_buff *skb, const struct tap_rule *r,
				      struct tap_stats *c, __u32 len)
{
	if (bpf_clone_redirect(skb, r->rx_ifindex, 0))
		return 0;
	if (c) {
		c->redirected_packets++;
		c->redirected_bytes += len;
	}
	return 1;
}

static __noinline int tap_send(struct __sk_buff *skb, struct pkt *p,
			       const struct endpoint_info *ep, __u8 dir, const struct tap_rule *r)
{
	struct tap_stats *c = tap_counters_of(r->contract_id);

	if (r->action == TAP_ACTION_MIRROR)
		return tap_mirror(skb, r, c, p->len);
	if (!tap_diverts(skb, r, dir))
		return TC_ACT_OK;
	if (tap_monitor_local_up(r)) {
		tap_record(skb, p, ep, dir, r);
		if (tap_divert(skb, r, c, p->len))
			return TC_ACT_STOLEN;
	}
	return tap_unavailable(skb, p, ep, dir, r->flags & TAP_F_FAIL_OPEN, c);
}

/* tap_frag_remember records what the tap did with a first fragment (r: the rule it
 * matched, NULL: none) for the datagram's later fragments. Out of line: fragments are
 * rare. */
static __noinline void tap_frag_remember(const struct pkt *p, __u32 ep_id, __u8 dir,
					 const struct tap_rule *r)
{
	struct frag_key k;
	struct tap_frag_value v = {};

	frag_key_fill(&k, p, ep_id, dir);
	if (r) {
		v.rule = *r;
		v.tapped = 1;
	}
	bpf_map_update_elem(&tap_frags, &k, &v, BPF_ANY);
}

/* tap_redirects_datagram says whether one of endpoint ep_id's redirect rules in direction
 * dir that does not fail open could match a datagram of p's addresses and protocol,
 * whatever its ports. */
static __always_inline int tap_redirects_datagram(__u32 ep_id, const struct pkt *p, __u8 dir)
{
	struct tap_set *s = bpf_map_lookup_elem(&tap_sets, &ep_id);
	struct tap_rule *r;
	int i;

	if (!s)
		return 0;
	for (i = 0; i < RAMPART_TAP_RULES; i++) {
		if (i >= s->count)
			break;
		r = &s->rules[i];
		if (r->direction != dir || r->action != TAP_ACTION_REDIRECT ||
		    (r->flags & TAP_F_FAIL_OPEN))
			continue;
		if ((p->t.saddr & r->src_mask) != r->src_addr ||
		    (p->t.daddr & r->dst_mask) != r->dst_addr)
			continue;
		if (!r->protocol || r->protocol == p->t.proto)
			return 1;
	}
	return 0;
}

/* tap_frag_unknown handles a later fragment whose first fragment's tap decision is not
 * known, although the policy point passed it (so it saw the first fragment): the decision
 * was evicted, or the endpoint got its tap rules in between. A datagram a redirect could
 * divert must not reach its destination uninspected. Out of line: rare. */
static __noinline int tap_frag_unknown(struct __sk_buff *skb, struct pkt *p,
				       const struct endpoint_info *ep, __u8 dir)
{
	struct decision d = {.ep_id = ep->ep_id, .dir = dir, .ev_flags = FLOW_F_TAPPED};
	__u32 peer;

	if (!tap_redirects_datagram(ep->ep_id, p, dir))
		return TC_ACT_OK;
	peer = tap_peer_identity(skb, p, dir);
	d.src_identity = dir == DIR_EGRESS ? ep->identity : peer;
	d.dst_identity = dir == DIR_EGRESS ? peer : ep->identity;
	/* Drop: a later fragment whose first fragment's tap decision is not known, at an
	 * endpoint whose redirect taps could have diverted its datagram (fail closed). */
	return drop(skb, p, &d, REASON_FRAGMENT_UNKNOWN);
}

/* tap_apply runs the endpoint's first matching tap rule on a packet its policy point
 * passes; returns the tc verdict. A later fragment (no ports to match rules with) goes
 * where its datagram's first fragment went: the same rule, so a monitor sees every
 * fragment of what it taps and can reassemble the datagram, and an inline one can keep it
 * from its destination. */
__noinline int tap_apply(struct __sk_buff *skb, struct pkt *p __arg_nonnull,
			 const struct endpoint_info *ep __arg_nonnull, __u8 dir)
{
	struct tap_rule *r = NULL;
	__u32 ep_id = ep->ep_id;

	if (tap_from_monitor(skb))
		return TC_ACT_OK;
	if (p->frag == FRAG_LATER) {
		struct tap_frag_value *v;
		struct frag_key k;

		frag_key_fill(&k, p, ep_id, dir);
		v = bpf_map_lookup_elem(&tap_frags, &k);
		if (!v)
			return tap_frag_unknown(skb, p, ep, dir);
		if (!v->tapped)
			return TC_ACT_OK;
		r = &v->rule;
	} else {
		struct tap_set *s;
		int i = tap_find(ep_id, p, dir);

		s = bpf_map_lookup_elem(&tap_sets, &ep_id);
		if (s && i >= 0 && i < RAMPART_TAP_RULES)
			r = &s->rules[i];
		if (p->frag == FRAG_FIRST)
			tap_frag_remember(p, ep_id, dir, r);
		if (!r)
			return TC_ACT_OK;
	}
	/* Here rather than in tap_send: the call chain through tap_send is the deepest. */
	if (dir == DIR_INGRESS && r->action == TAP_ACTION_MIRROR &&
	    tap_mirrored_by_sender(skb, p, r->rx_ifindex, r->monitor_key))
		return TC_ACT_OK;
	return tap_send(skb, p, ep, dir, r);
}

/* tap_count_rejected counts a packet a monitor sent that was not diverted to it. */
static __always_inline void tap_count_rejected(void)
{
	struct tap_stats *c = tap_counters_of(0);

	if (c)
		c->rejected++;
}

/* tap_returned sends on a packet (len bytes) that a monitor sent back, with its record v,
 * where the original would have gone. */
static __always_inline int tap_returned(struct __sk_buff *skb, const struct tap_flow_value *v,
					__u32 len)
{
	struct tap_stats *c = tap_counters_of(v->contract_id);

	if (c) {
		c->returned_packets++;
		c->returned_bytes += len;
	}
	if (v->deliver_ifindex)
		/* An ingress tap's packet: back to the endpoint's veth, to enter it. */
		return bpf_redirect(v->deliver_ifindex, 0);
	/* An egress tap's packet: the node routes it as it would have the original. It is
	 * addressed to the MAC its sender used, not this interface's: make it the host's. */
	bpf_skb_change_type(skb, PACKET_HOST);
	return TC_ACT_OK;
}

/* tap_return admits a packet a monitor sent out of one of its veths (tc ingress of the
 * host side): only a packet of a diverted flow, on the monitor's return interface, goes
 * on, where the original would have gone. */
static __noinline int tap_return(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_EGRESS};
	__u32 ifindex = skb->ifindex;
	struct tap_flow_value *v = NULL;
	struct tap_iface *iface;
	struct pkt p = {};
	int ret;

	ret = parse_packet(skb, &p);
	iface = bpf_map_lookup_elem(&tap_ifaces, &ifindex);
	if (iface)
		d.ep_id = iface->monitor_ep_id;
	if (ret == PARSE_IPV4)
		v = tap_record_of(&p, ifindex);
	if (!iface || !v) {
		tap_count_rejected();
		/* Drop: not a packet of a flow diverted to this monitor on this interface (an
		 * injected packet, a rewritten one, the receive interface, or not IPv4: IPv6
		 * goes to tap_return6). */
		return drop(skb, &p, &d, REASON_TAP_NOT_DIVERTED);
	}
	return tap_returned(skb, v, p.len);
}

/* tap_tunnel_ingress takes a copy another node mirrored to a monitor of this one (tc
 * ingress of the tap tunnel device): from a known node only, and only into the monitor its
 * key names. */
static __always_inline int tap_tunnel_ingress(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_INGRESS};
	struct bpf_tunnel_key key = {};
	struct tap_stats *c = tap_counters_of(0);
	struct pkt p = {};
	__u32 vni, *rx;
	int node;

	node = tunnel_from_node(skb, &key);
	if (node < 0) {
		parse_packet(skb, &p);
		/* Drop: no tunnel metadata (not from the VXLAN receive path). */
		return drop(skb, &p, &d, REASON_MALFORMED);
	}
	if (!node) {
		parse_packet(skb, &p);
		/* Drop: the outer source is not a node; only nodes send copies. */
		return drop(skb, &p, &d, REASON_TUNNEL_UNTRUSTED_SOURCE);
	}
	vni = key.tunnel_id;
	rx = bpf_map_lookup_elem(&tap_monitor_keys, &vni);
	if (!rx || bpf_redirect(*rx, 0) != TC_ACT_REDIRECT) {
		if (c)
			c->remote_lost++;
		/* Drop: a copy for a monitor that is not (or no longer) here. */
		return TC_ACT_SHOT;
	}
	if (c)
		c->remote_delivered++;
	return TC_ACT_REDIRECT;
}

#endif /* __RAMPART_TAP_H */
