// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Rampart dataplane: tc programs on an endpoint's host-side veth.
 *
 *   rampart_from_ep  tc ingress: packets leaving the endpoint  (DIR_EGRESS policy)
 *   rampart_to_ep    tc egress:  packets entering the endpoint (DIR_INGRESS policy)
 *
 * Per packet: endpoint -> parse -> fragments -> conntrack -> ipcache -> policy -> verdict
 * -> counters and (new flows, drops) a flow event. Every step is a fixed number of map
 * lookups. Anything the program cannot classify is dropped (fail closed). */

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"
#include "events.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* flow_event is only used through a ring buffer pointer, which leaves no BTF for it; this
 * unused global keeps the type in BTF so bpf2go can export it to Go. */
const struct flow_event *unused_flow_event __attribute__((unused));

static __always_inline void frag_key_fill(struct frag_key *k, const struct pkt *p, __u32 ep_id,
					  __u8 dir)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, &p->t.saddr, 4);
	__builtin_memcpy(k->daddr, &p->t.daddr, 4);
	k->id = p->ip_id;
	k->ep_id = ep_id;
	k->protocol = p->t.proto;
	k->family = RAMPART_FAMILY_V4;
	k->direction = dir;
}

/* frag_record remembers the first fragment's ports and verdict for the later fragments. */
static __always_inline void frag_record(const struct pkt *p, const struct decision *d,
					int allowed)
{
	struct frag_key k;
	struct frag_value v = {};

	frag_key_fill(&k, p, d->ep_id, d->dir);
	v.sport = p->t.sport;
	v.dport = p->t.dport;
	v.allowed = allowed ? 1 : 0;
	v.reason = d->reason;
	v.rule_id = d->rule_id;
	bpf_map_update_elem(&frags, &k, &v, BPF_ANY);
}

static __always_inline void set_identities(struct decision *d, const struct endpoint_info *ep,
					   __u32 peer)
{
	if (d->dir == DIR_EGRESS) {
		d->src_identity = ep->identity;
		d->dst_identity = peer;
	} else {
		d->src_identity = peer;
		d->dst_identity = ep->identity;
	}
}

/* handle_later_fragment gives a non-first fragment its first fragment's verdict. */
static __always_inline int handle_later_fragment(struct __sk_buff *skb, struct pkt *p,
						 struct decision *d,
						 const struct endpoint_info *ep)
{
	struct frag_key k;
	struct frag_value *v;
	struct peer_identity peer;

	frag_key_fill(&k, p, d->ep_id, d->dir);
	v = bpf_map_lookup_elem(&frags, &k);
	if (v && v->allowed)
		return pass(p, d); /* allowed datagram: no new evaluation, no event */

	/* Dropped below: resolve the peer only now, for the event. */
	ipcache_resolve(d->dir == DIR_EGRESS ? p->t.daddr : p->t.saddr, &peer);
	set_identities(d, ep, peer.identity);
	if (!v)
		/* Drop: first fragment never seen here (lost, reordered past it, or a crafted
		 * fragment that would bypass the port check). */
		return drop(skb, p, d, REASON_FRAG_UNKNOWN);
	/* Drop: the first fragment of this datagram was dropped. */
	p->t.sport = v->sport;
	p->t.dport = v->dport;
	d->rule_id = v->rule_id;
	return drop(skb, p, d, v->reason ? v->reason : REASON_POLICY_DENY);
}

static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	struct decision d = { .dir = dir };
	struct pkt p = {};
	struct endpoint_info *ep;
	struct peer_identity peer;
	struct verdict res;
	__u32 ifindex = skb->ifindex;
	__u64 now;
	int ret, status;

	ep = bpf_map_lookup_elem(&endpoints, &ifindex);
	if (!ep) {
		/* Drop: attached to an interface the agent does not (or no longer) know, e.g.
		 * between endpoint removal and detach. Fail closed. Parse only to fill the
		 * event. */
		parse_packet(skb, &p);
		return drop(skb, &p, &d, REASON_UNKNOWN_ENDPOINT);
	}
	d.ep_id = ep->ep_id;
	d.src_identity = dir == DIR_EGRESS ? ep->identity : 0;
	d.dst_identity = dir == DIR_INGRESS ? ep->identity : 0;

	ret = parse_packet(skb, &p);
	switch (ret) {
	case PARSE_IPV4:
		break;
	case PARSE_ARP:
		/* ARP is needed for any IPv4 traffic on the veth and carries no policy. */
		return pass(&p, &d);
	case PARSE_IPV6:
		/* Drop: IPv6 is not enforced yet, and unenforced means not allowed. */
		return drop(skb, &p, &d, REASON_UNSUPPORTED_L3);
	case PARSE_OTHER_L3:
		/* Drop: an ethertype other than IPv4/ARP/IPv6 (VLAN, MPLS, ...), no policy for it. */
		return drop(skb, &p, &d, REASON_UNSUPPORTED_L3);
	default:
		/* Drop: truncated or invalid Ethernet/IPv4/L4 header (see parse.h). */
		return drop(skb, &p, &d, REASON_MALFORMED);
	}

	if (p.frag == FRAG_LATER)
		return handle_later_fragment(skb, &p, &d, ep);

	now = bpf_ktime_get_ns();
	status = ct_lookup(&p, d.ep_id, dir, now);
	if (status != CT_NEW) {
		/* Established, reply or related: allowed when the flow was created. */
		if (p.frag == FRAG_FIRST)
			frag_record(&p, &d, 1);
		return pass(&p, &d);
	}

	/* New flow: identities, then policy. */
	ipcache_resolve(dir == DIR_EGRESS ? p.t.daddr : p.t.saddr, &peer);
	set_identities(&d, ep, peer.identity);
	policy_decide(d.ep_id, dir, &peer, p.t.proto, p.policy_port, &res);
	d.rule_id = res.rule_id;

	if (res.action == POLICY_DENY) {
		/* Drop: a deny entry matches (deny wins over any allow). */
		d.reason = REASON_POLICY_DENY;
		if (p.frag == FRAG_FIRST)
			frag_record(&p, &d, 0);
		return drop(skb, &p, &d, REASON_POLICY_DENY);
	}
	if (res.action != POLICY_ALLOW &&
	    (ep->flags & (dir == DIR_INGRESS ? EP_ENFORCE_INGRESS : EP_ENFORCE_EGRESS))) {
		/* Drop: the endpoint enforces this direction and nothing allows the flow. */
		d.reason = REASON_POLICY_DEFAULT;
		if (p.frag == FRAG_FIRST)
			frag_record(&p, &d, 0);
		return drop(skb, &p, &d, REASON_POLICY_DEFAULT);
	}

	ct_create(&p, d.ep_id, dir, res.rule_id, now);
	if (p.frag == FRAG_FIRST)
		frag_record(&p, &d, 1);
	emit_event(skb, &p, &d, EVENT_NEW_FLOW, VERDICT_FORWARDED);
	return pass(&p, &d);
}

/* tc ingress on the host-side veth: the endpoint is sending. */
SEC("tc")
int rampart_from_ep(struct __sk_buff *skb)
{
	return handle(skb, DIR_EGRESS);
}

/* tc egress on the host-side veth: the packet is about to enter the endpoint. */
SEC("tc")
int rampart_to_ep(struct __sk_buff *skb)
{
	return handle(skb, DIR_INGRESS);
}
