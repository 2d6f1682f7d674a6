/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow taps for IPv6 packets: tap.h's taps with IPv6 addresses. An endpoint's rules for
 * IPv6 are in tap_sets6 (struct tap_rule6: the IPv6 prefixes, and the rest of the rule as
 * a tap_rule); its tap flags (EP_TAP_*) stand for both families. Mirror, redirect, copies
 * to monitors on other nodes, fail closed, fragments and the check of what a monitor sends
 * back work as tap.h has them for IPv4; the records of diverted IPv6 packets are in
 * tap_flows6, and a later fragment's record is found by its datagram's identification.
 * The tap decisions of first fragments share tap_frags (its key has the family). */
#ifndef __RAMPART_TAP6_H
#define __RAMPART_TAP6_H

#include "tap.h"
#include "ipv6.h"

/* ep_id -> the endpoint's IPv6 tap rules (tap_sets for IPv6). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct tap_set6);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_sets6 SEC(".maps");

/* Diverted IPv6 packets (tap_flows for IPv6). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, RAMPART_TAP_FLOWS_MAX);
	__type(key, struct tap_flow_key6);
	__type(value, struct tap_flow_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_flows6 SEC(".maps");

/* ip6_in_prefix says whether addr is within net/mask (network order, net masked). */
static __always_inline int ip6_in_prefix(const __u8 *addr, const __be32 *net, const __be32 *mask)
{
	__be32 a[4];

	__builtin_memcpy(a, addr, 16);
	return (a[0] & mask[0]) == net[0] && (a[1] & mask[1]) == net[1] &&
	       (a[2] & mask[2]) == net[2] && (a[3] & mask[3]) == net[3];
}

/* tap_rule6_addrs_match says whether p's addresses are in rule r6's prefixes. */
static __always_inline int tap_rule6_addrs_match(const struct tap_rule6 *r6, const struct pkt6 *p)
{
	return ip6_in_prefix(p->t.saddr, r6->src_addr, r6->src_mask) &&
	       ip6_in_prefix(p->t.daddr, r6->dst_addr, r6->dst_mask);
}

static __always_inline int tap_rule6_match(const struct tap_rule6 *r6, const struct pkt6 *p, __u8 dir)
{
	const struct tap_rule *r = &r6->r;

	if (r->direction != dir || !tap_rule6_addrs_match(r6, p))
		return 0;
	return tap_rule_l4_match(r, p->t.proto, p->t.proto == IPPROTO_ICMPV6, p->t.sport,
				 p->t.dport, p->icmp_type, p->icmp_code);
}

/* tap_find6 is tap_find for an IPv6 packet. */
__noinline int tap_find6(__u32 ep_id, const struct pkt6 *p __arg_nonnull, __u8 dir)
{
	struct tap_set6 *s = bpf_map_lookup_elem(&tap_sets6, &ep_id);
	int i;

	if (!s)
		return -1;
	for (i = 0; i < RAMPART_TAP_RULES; i++) {
		if (i >= s->count)
			break;
		if (tap_rule6_match(&s->rules[i], p, dir))
			return i;
	}
	return -1;
}

/* tap6_rule is the first of endpoint ep_id's IPv6 rules that matches p in direction dir,
 * or NULL. */
static __always_inline struct tap_rule *tap6_rule(__u32 ep_id, const struct pkt6 *p, __u8 dir)
{
	int i = tap_find6(ep_id, p, dir);
	struct tap_set6 *s;
	__u32 at;

	if (i < 0 || i >= RAMPART_TAP_RULES)
		return NULL;
	/* Masked as well as checked: the verifier loses the check's bound on the way to
	 * the address (RAMPART_TAP_RULES is a power of two). */
	at = (__u32)i & (RAMPART_TAP_RULES - 1);
	s = bpf_map_lookup_elem(&tap_sets6, &ep_id);
	return s ? &s->rules[at].r : NULL;
}

/* tap6_mirrored_by_sender is tap_mirrored_by_sender for an IPv6 packet. */
static __noinline int tap6_mirrored_by_sender(struct __sk_buff *skb, const struct pkt6 *p,
					      __u32 rx, __u32 key)
{
	struct endpoint_info *src = tap_sender_of(skb);
	struct tap_rule *r;

	if (!src)
		return 0;
	if (p->frag == FRAG_LATER) {
		struct frag_key k;

		frag6_key_fill(&k, p, src->ep_id, DIR_EGRESS);
		r = tap_frag_rule(&k);
	} else {
		r = tap6_rule(src->ep_id, p, DIR_EGRESS);
	}
	return r && tap_same_mirror(r, rx, key);
}

/* tap6_flow_key_of is tap_flow_key_of for an IPv6 packet. */
static __always_inline void tap6_flow_key_of(struct tap_flow_key6 *k, const struct pkt6 *p,
					     __u32 ifindex)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, p->t.saddr, 16);
	__builtin_memcpy(k->daddr, p->t.daddr, 16);
	if (p->frag == FRAG_LATER) {
		k->frag_id = p->frag_id;
		k->fragment = 1;
	} else {
		k->sport = p->t.sport;
		k->dport = p->t.dport;
	}
	k->ifindex = ifindex;
	k->protocol = p->t.proto;
}

/* tap6_record_of is tap_record_of for an IPv6 packet. */
static __always_inline struct tap_flow_value *tap6_record_of(const struct pkt6 *p, __u32 ifindex)
{
	struct tap_flow_key6 k;

	tap6_flow_key_of(&k, p, ifindex);
	return tap_record_in(&tap_flows6, &k);
}

/* tap_returned_source6 is tap_returned_source for an IPv6 packet. */
static __noinline int tap_returned_source6(struct __sk_buff *skb, const struct pkt6 *p,
					   struct peer_identity *peer)
{
	__u32 iif = skb->ingress_ifindex;

	if (!bpf_map_lookup_elem(&tap_ifaces, &iif))
		return 0;
	return tap_returned_record(tap6_record_of(p, iif), peer);
}

/* tap6_peer_identity is tap_peer_identity for an IPv6 packet; a link-local peer of an
 * endpoint is the node (peer6). Out of line, as the functions below: the chain from the
 * IPv6 path through tap_apply6 must fit the stack. */
static __noinline __u32 tap6_peer_identity(struct __sk_buff *skb, const struct pkt6 *p, __u8 dir)
{
	const __u8 *addr = dir == DIR_EGRESS ? p->t.daddr : p->t.saddr;
	struct peer_identity peer;
	struct decision scratch = {};

	if (ip6_is_link_local(addr))
		return ID_HOST;
	ipcache_resolve6(addr, &peer);
	if (dir == DIR_INGRESS)
		tunnel_source(skb, &peer, &scratch);
	return peer.identity;
}

/* tap6_drop drops an IPv6 packet of a tapped flow at endpoint ep for reason. */
static __noinline int tap6_drop(struct __sk_buff *skb, struct pkt6 *p,
				const struct endpoint_info *ep, __u8 dir, __u8 reason)
{
	struct decision d = {.ep_id = ep->ep_id, .dir = dir, .ev_flags = FLOW_F_TAPPED};
	__u32 peer = tap6_peer_identity(skb, p, dir);

	d.src_identity = dir == DIR_EGRESS ? ep->identity : peer;
	d.dst_identity = dir == DIR_EGRESS ? peer : ep->identity;
	return drop6(skb, p, &d, reason);
}

/* tap6_record writes the record of an IPv6 packet diverted by rule r (tap_record), in the
 * rule's direction; peer: its source identity when it enters the endpoint. */
static __noinline void tap6_record(struct __sk_buff *skb, const struct pkt6 *p,
				   const struct endpoint_info *ep, const struct tap_rule *r, __u32 peer)
{
	struct tap_flow_key6 k;

	tap6_flow_key_of(&k, p, r->tx_ifindex);
	tap_record_at(&tap_flows6, &k, skb, ep, r->direction, r, peer);
}

/* tap6_send is tap_send for an IPv6 packet. */
static __noinline int tap6_send(struct __sk_buff *skb, struct pkt6 *p,
				const struct endpoint_info *ep, __u8 dir, const struct tap_rule *r)
{
	struct tap_stats *c = tap_counters_of(r->contract_id);

	if (r->action == TAP_ACTION_MIRROR)
		return tap_mirror(skb, r, c, p->len);
	if (!tap_diverts(skb, r, dir))
		return TC_ACT_OK;
	if (tap_monitor_local_up(r)) {
		tap6_record(skb, p, ep, r, dir == DIR_INGRESS ? tap6_peer_identity(skb, p, dir) : 0);
		if (tap_divert(skb, r, c, p->len))
			return TC_ACT_STOLEN;
	}
	if (tap_fails_open(c, r->flags & TAP_F_FAIL_OPEN))
		return TC_ACT_OK;
	/* Drop: the redirect tap's monitor is down or gone (fail closed). */
	return tap6_drop(skb, p, ep, dir, REASON_TAP_MONITOR_UNAVAILABLE);
}

/* tap6_frag_remember is tap_frag_remember for an IPv6 first fragment. */
static __noinline void tap6_frag_remember(const struct pkt6 *p, __u32 ep_id, __u8 dir,
					  const struct tap_rule *r)
{
	struct frag_key k;
	struct tap_frag_value v = {};

	frag6_key_fill(&k, p, ep_id, dir);
	if (r) {
		v.rule = *r;
		v.tapped = 1;
	}
	bpf_map_update_elem(&tap_frags, &k, &v, BPF_ANY);
}

/* tap6_frag_unknown is tap_frag_unknown for an IPv6 later fragment: dropped when one of the
 * endpoint's redirect rules that does not fail open could divert its datagram. */
static __noinline int tap6_frag_unknown(struct __sk_buff *skb, struct pkt6 *p,
					const struct endpoint_info *ep, __u8 dir)
{
	__u32 ep_id = ep->ep_id;
	struct tap_set6 *s = bpf_map_lookup_elem(&tap_sets6, &ep_id);
	struct tap_rule6 *r6;
	int i;

	if (!s)
		return TC_ACT_OK;
	for (i = 0; i < RAMPART_TAP_RULES; i++) {
		if (i >= s->count)
			break;
		r6 = &s->rules[i];
		if (r6->r.direction != dir || r6->r.action != TAP_ACTION_REDIRECT ||
		    (r6->r.flags & TAP_F_FAIL_OPEN) || !tap_rule6_addrs_match(r6, p))
			continue;
		if (!r6->r.protocol || r6->r.protocol == p->t.proto)
			/* Drop: a later fragment whose first fragment's tap decision is not
			 * known, which a redirect tap could have diverted (fail closed). */
			return tap6_drop(skb, p, ep, dir, REASON_FRAGMENT_UNKNOWN);
	}
	return TC_ACT_OK;
}

/* tap_apply6 is tap_apply for an IPv6 packet its policy point passes. */
__noinline int tap_apply6(struct __sk_buff *skb, struct pkt6 *p __arg_nonnull,
			  const struct endpoint_info *ep __arg_nonnull, __u8 dir)
{
	struct tap_rule *r;
	__u32 ep_id = ep->ep_id;

	if (tap_from_monitor(skb))
		return TC_ACT_OK;
	if (p->frag == FRAG_LATER) {
		struct tap_frag_value *v;
		struct frag_key k;

		frag6_key_fill(&k, p, ep_id, dir);
		v = bpf_map_lookup_elem(&tap_frags, &k);
		if (!v)
			return tap6_frag_unknown(skb, p, ep, dir);
		if (!v->tapped)
			return TC_ACT_OK;
		r = &v->rule;
	} else {
		r = tap6_rule(ep_id, p, dir);
		if (p->frag == FRAG_FIRST)
			tap6_frag_remember(p, ep_id, dir, r);
		if (!r)
			return TC_ACT_OK;
	}
	if (dir == DIR_INGRESS && r->action == TAP_ACTION_MIRROR &&
	    tap6_mirrored_by_sender(skb, p, r->rx_ifindex, r->monitor_key))
		return TC_ACT_OK;
	return tap6_send(skb, p, ep, dir, r);
}

/* tap_return6 is tap_return for an IPv6 packet a monitor sent back. */
static __noinline int tap_return6(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_EGRESS};
	__u32 ifindex = skb->ifindex;
	struct tap_flow_value *v = NULL;
	struct tap_iface *iface;
	struct pkt6 p = {};

	iface = bpf_map_lookup_elem(&tap_ifaces, &ifindex);
	if (iface)
		d.ep_id = iface->monitor_ep_id;
	if (parse6(skb, &p) == PARSE_IPV6)
		v = tap6_record_of(&p, ifindex);
	if (!iface || !v) {
		tap_count_rejected();
		/* Drop: not a packet of a flow diverted to this monitor on this interface. */
		return drop6(skb, &p, &d, REASON_TAP_NOT_DIVERTED);
	}
	return tap_returned(skb, v, p.len);
}

#endif /* __RAMPART_TAP6_H */
