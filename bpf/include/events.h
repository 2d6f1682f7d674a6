/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-endpoint counters and flow events (new flows and drops; not every packet). */
#ifndef __RAMPART_EVENTS_H
#define __RAMPART_EVENTS_H

#include "common.h"
#include "maps.h"
#include "parse.h"

/* What the program decided about one packet, for counters and events. */
struct decision {
	__u32 ep_id;  /* 0 when the interface has no endpoint */
	__u32 src_identity;
	__u32 dst_identity;
	__u32 rule_id;
	__u32 match_identity; /* identity whose policy entry decided (flow_event) */
	__u8 dir;      /* DIR_* */
	__u8 reason;   /* REASON_* */
	__u8 ev_flags; /* FLOW_F_* for the event */
	/* A policy in audit mode would drop the flow (policy_audit): its reason and rule are
	 * in reason and rule_id, and its event's verdict is VERDICT_AUDIT, not forwarded. */
	__u8 audit;
};

/* count_drop adds a dropped packet to the endpoint's counters (endpoint 0's for packets
 * on an interface without an endpoint). Forwarded packets are not counted here (see struct
 * ep_counters). */
static __always_inline void count_drop(const struct decision *d, __u32 len)
{
	struct ep_counters *c;
	__u32 idx = d->ep_id;

	c = bpf_map_lookup_elem(&endpoint_counters, &idx);
	if (!c)
		return; /* ep_id out of range: nothing to count into */
	if (d->dir == DIR_INGRESS) {
		c->ingress_drops++;
		c->ingress_drop_bytes += len;
	} else {
		c->egress_drops++;
		c->egress_drop_bytes += len;
	}
}

/* count_proxy counts a packet handed to a proxy socket (to_proxy) or arriving from the
 * proxy's upstream connection (!to_proxy) at the endpoint's veth. */
static __always_inline void count_proxy(__u32 ep_id, int to_proxy)
{
	struct ep_counters *c;

	c = bpf_map_lookup_elem(&endpoint_counters, &ep_id);
	if (!c)
		return;
	if (to_proxy)
		c->to_proxy_packets++;
	else
		c->from_proxy_packets++;
}

static __always_inline void count_lost_event(void)
{
	__u32 zero = 0;
	__u64 *lost = bpf_map_lookup_elem(&events_lost, &zero);

	if (lost)
		(*lost)++;
}

/* events_submit sends the reserved flow event e. */
static __always_inline void events_submit(struct flow_event *e)
{
	/* No wakeup per event. A wakeup is an interrupt to this CPU and makes the agent
	 * runnable here, where it would run before the packet's own receiver: the first packet
	 * of every new flow waited for the agent to read its event (a ping's first round trip
	 * took about 30 us longer with the agent running than with it stopped,
	 * bench/experiments/firstping/run.sh). The event that fills
	 * a quarter of the ring wakes the reader (once: a lagging reader is not woken again and
	 * again); otherwise the agent polls (datapath.EventPoll), as for the send-side verdict's
	 * events. */
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);

	bpf_ringbuf_submit(e, avail >= RAMPART_EVENTS_WAKE && avail < RAMPART_EVENTS_WAKE + 2 * sizeof(*e) ?
				      BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* event_fill zeroes flow event e and fills what the decision d, the verdict and the
 * interface say; the packet's own fields are the caller's (emit_event, emit_event6). */
static __always_inline void event_fill(struct flow_event *e, struct __sk_buff *skb,
				       const struct decision *d, __u8 type, __u8 verdict)
{
	__builtin_memset(e, 0, sizeof(*e));
	e->timestamp_ns = bpf_ktime_get_ns();
	e->ep_id = d->ep_id;
	e->src_identity = d->src_identity;
	e->dst_identity = d->dst_identity;
	e->rule_id = d->rule_id;
	e->match_identity = d->match_identity;
	e->ifindex = skb->ifindex;
	e->type = type;
	e->verdict = d->audit && verdict != VERDICT_DROPPED ? VERDICT_AUDIT : verdict;
	e->reason = d->reason;
	e->direction = d->dir;
	e->flags = d->ev_flags;
}

/* emit_event sends a flow event; when the ring buffer is full the loss is counted in
 * events_lost instead (the packet's verdict does not depend on it). Out of line: events
 * are for new flows and drops, not for the packets of established flows. */
static __noinline void emit_event(struct __sk_buff *skb, const struct pkt *p,
				       const struct decision *d, __u8 type, __u8 verdict)
{
	struct flow_event *e;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost_event();
		return;
	}
	event_fill(e, skb, d, type, verdict);
	__builtin_memcpy(e->saddr, &p->t.saddr, 4);
	__builtin_memcpy(e->daddr, &p->t.daddr, 4);
	e->sport = p->t.sport;
	e->dport = p->t.dport;
	e->length = p->len;
	e->protocol = p->t.proto;
	e->family = p->family;
	e->icmp_type = p->icmp_type;
	events_submit(e);
}

/* drop counts, reports and drops the packet. Every drop in the dataplane goes through here
 * with its reason set in d. Out of line, with everything else rare (see likely). */
static __noinline int drop(struct __sk_buff *skb, const struct pkt *p, struct decision *d,
				__u8 reason)
{
	d->reason = reason;
	count_drop(d, p->len);
	emit_event(skb, p, d, EVENT_DROP, VERDICT_DROPPED);
	return TC_ACT_SHOT;
}

/* pass forwards the packet. It counts nothing: the interface's own statistics count
 * forwarded packets (see struct ep_counters). */
static __always_inline int pass(void)
{
	return TC_ACT_OK;
}

#endif /* __RAMPART_EVENTS_H */
