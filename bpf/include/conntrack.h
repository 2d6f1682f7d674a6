/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Connection tracking.
 *
 * One entry per (endpoint, flow) as seen at that endpoint's policy point, keyed from the
 * endpoint's side (struct ct4_key), so both directions of a flow find it with one lookup.
 * A packet is
 *   - established when its flow has a live entry created in the packet's direction,
 *   - a reply when its flow has a live entry created in the opposite direction,
 *   - related (ICMP errors only) when the quoted packet belongs to a live entry and the
 *     error travels between the flow's two ends (see ct_related for one from a third
 *     address),
 *   - new otherwise: it is evaluated against policy, and an allowed new flow creates an
 *     entry (except stateless ICMP: errors and non-echo types are evaluated every time).
 *
 * Entries expire after a timeout that depends on the protocol and state (see common.h):
 * TCP before any reply (SYN sent) 60 s, TCP with a reply 6 h, TCP after an RST or a FIN in
 * both directions 10 s, everything else 60 s; each is idle time since the last packet,
 * counted in jiffies (bpf_jiffies64, which the verifier inlines as one load of the kernel's
 * tick counter; the coarse nanosecond clock it replaced was a helper call, a sixth of an
 * established packet's cost in BPF_PROG_RUN). A tick (1 to 10 ms) is precision enough
 * against timeouts of seconds.
 * Expired entries are ignored and deleted on lookup. A SYN that hits a closing entry is a
 * new connection reusing the tuple and is evaluated against policy again.
 *
 * Policy and identity changes: every entry records the peer identity its flow was
 * admitted with and the check revision it was last checked against: the endpoint's policy
 * revision (endpoint_info.revision) plus the ipcache generation (ipcache_gen, which the
 * agent bumps after every change of the ipcache map), and, for a flow entering the
 * endpoint from the overlay, the VNI's identity of its packets (pkt.tunnel_id). The caller
 * (rampart.c, recheck_established) checks an established packet again when its check word
 * (ct_check_word: the check revision and the packet's tunnel_id) differs from the entry's,
 * so a policy change, an address that now maps to another identity (a relabelled pod, an
 * address reused by another pod) and a VNI that now carries another identity reach live
 * flows on their next packet, at the cost of one 8-byte comparison per packet otherwise.
 * Why a generation and not the peer's identity itself: that takes an ipcache lookup (an
 * LPM trie walk) per packet; the generation is one load. */
#ifndef __RAMPART_CONNTRACK_H
#define __RAMPART_CONNTRACK_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "events.h"
#include "flowcache.h"

/* In jiffies, set at load time from datapath.Config.CTTimeouts and the kernel's tick (see
 * RAMPART_DEFAULT_HZ). */
const volatile __u64 ct_timeout_tcp_syn = CT_TIMEOUT_TCP_SYN_S * RAMPART_DEFAULT_HZ;
const volatile __u64 ct_timeout_tcp_established = CT_TIMEOUT_TCP_ESTABLISHED_S * RAMPART_DEFAULT_HZ;
const volatile __u64 ct_timeout_tcp_closing = CT_TIMEOUT_TCP_CLOSING_S * RAMPART_DEFAULT_HZ;
const volatile __u64 ct_timeout_other = CT_TIMEOUT_OTHER_S * RAMPART_DEFAULT_HZ;

/* ipcache_generation reads the ipcache generation (see ipcache_gen in maps.h). */
static __always_inline __u32 ipcache_generation(void)
{
	__u32 zero = 0;
	__u32 *g = bpf_map_lookup_elem(&ipcache_gen, &zero);

	return g ? *g : 0;
}

/* ct_check_revision is the check revision of a packet at endpoint ep: a policy change
 * raises the endpoint's revision, an ipcache change the generation, and both only grow
 * (the agent hands out revisions from one counter), so their sum differs from every
 * earlier one whenever either changed. */
static __always_inline __u32 ct_check_revision(const struct endpoint_info *ep, const struct pkt *p)
{
	return ep->revision + p->ipcache_gen;
}

/* ct_check_word is what an established packet with check revision rev is compared with:
 * struct ct_value's revision and tunnel_id, read as one 8-byte word (little endian, as the
 * BPF target is). */
static __always_inline __u64 ct_check_word(__u32 rev, const struct pkt *p)
{
	return (__u64)rev | ((__u64)p->tunnel_id << 32);
}

static __always_inline __u64 ct_checked(const struct ct_value *v)
{
	return *(const __u64 *)&v->revision;
}

/* ct_set_checked records that entry v's flow was checked with check word w: one 8-byte
 * store, so a packet on another CPU never sees the new revision with the old tunnel_id. */
static __always_inline void ct_set_checked(struct ct_value *v, __u64 w)
{
	*(volatile __u64 *)&v->revision = w;
}

enum ct_status {
	CT_NEW = 0,
	CT_ESTABLISHED,
	CT_REPLY,
	CT_RELATED,
	CT_RELATED_FOREIGN, /* an ICMP error quoting a live flow, not between its two ends */
};

static __always_inline __u8 dir_opposite(__u8 dir)
{
	return dir == DIR_INGRESS ? DIR_EGRESS : DIR_INGRESS;
}

/* ct_key_fill writes the whole key of tuple t travelling in direction dir at endpoint
 * ep_id (zeroed first: padding is part of the hash). Leaving the endpoint (egress), the
 * source is the endpoint's side; entering it, the destination. */
/* frag_key_fill is the key of p's datagram at policy point (ep_id, dir), for frags_peer and
 * tap_frags. */
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

static __always_inline void ct_key_fill(struct ct4_key *k, const struct tuple *t, __u32 ep_id,
					__u8 dir)
{
	__builtin_memset(k, 0, sizeof(*k));
	if (dir == DIR_EGRESS) {
		k->laddr = t->saddr;
		k->raddr = t->daddr;
		k->lport = t->sport;
		k->rport = t->dport;
	} else {
		k->laddr = t->daddr;
		k->raddr = t->saddr;
		k->lport = t->dport;
		k->rport = t->sport;
	}
	k->ep_id = ep_id;
	k->protocol = t->proto;
}

static __always_inline __u64 ct_timeout(const struct ct_value *v, __u8 proto)
{
	if (proto == IPPROTO_TCP) {
		if (v->flags & CT_F_CLOSING)
			return ct_timeout_tcp_closing;
		if (!(v->flags & CT_F_SEEN_REPLY))
			return ct_timeout_tcp_syn;
		return ct_timeout_tcp_established;
	}
	return ct_timeout_other;
}

/* ct_live returns the entry for k if it exists and has not expired; an expired entry is
 * deleted so it cannot be mistaken for a live one later. */
static __always_inline struct ct_value *ct_live(struct ct4_key *k, __u8 proto, __u64 now)
{
	struct ct_value *v = bpf_map_lookup_elem(&conntrack4_peer, k);
	__u64 timeout;

	if (!v)
		return 0;
	timeout = ct_timeout(v, proto);
	/* The flow cache may be serving this flow (flowcache.h): its last_seen can then lag
	 * the flow's last packet by up to a window. */
	if (v->flags & CT_F_SEEN_REPLY)
		timeout += flow_cache_window;
	/* Signed: an entry the agent wrote (converted from an earlier version's nanoseconds)
	 * may be a tick newer than now; it is live, not expired. */
	if ((__s64)(now - v->last_seen) > (__s64)timeout) {
		bpf_map_delete_elem(&conntrack4_peer, k);
		return 0;
	}
	return v;
}

/* ct_touch_flags refreshes an entry for a packet of its flow (reply: from the other side)
 * of protocol proto with TCP flags tcp_flags. */
static __always_inline void ct_touch_flags(struct ct_value *v, __u8 proto, __u8 tcp_flags,
					   int reply, __u64 now)
{
	__u32 add = 0;

	/* Written only when the tick has moved (HZ times a second at most): a flow's packets
	 * in both directions share this entry, often on different CPUs, and a store on every
	 * packet would bounce its cache line between them. */
	if (v->last_seen != now)
		v->last_seen = now;
	if (reply && !(v->flags & CT_F_SEEN_REPLY))
		add |= CT_F_SEEN_REPLY;
	if (proto == IPPROTO_TCP) {
		if (tcp_flags & TCP_F_RST)
			add |= CT_F_CLOSING;
		if (tcp_flags & TCP_F_FIN) {
			__u32 fin = reply ? CT_F_FIN_REV : CT_F_FIN_FWD;
			__u32 other = reply ? CT_F_FIN_FWD : CT_F_FIN_REV;

			add |= fin;
			if (v->flags & other)
				add |= CT_F_CLOSING;
		}
	}
	if (add & ~v->flags)
		__sync_fetch_and_or(&v->flags, add);
}

/* ct_touch refreshes an entry for packet p of its flow. */
static __always_inline void ct_touch(struct ct_value *v, const struct pkt *p, int reply,
				     __u64 now)
{
	ct_touch_flags(v, p->t.proto, p->tcp_flags, reply, now);
}

/* ct_related classifies the ICMP error p, travelling in direction dir at endpoint ep_id:
 *   - CT_NEW: it quotes no packet of a live flow here;
 *   - CT_RELATED: it quotes one (the quoted packet travelled the opposite way, as a forward
 *     packet or a reply of its flow) and travels between the flow's two ends: entering the
 *     endpoint from the flow's peer, or leaving it for the peer (its addresses are the
 *     quoted packet's, swapped). It passes as the flow's replies do, with their trust: its
 *     sender may send on the flow anyway, so the bytes after the quote (which the socket's
 *     error queue delivers) carry nothing the flow would not;
 *   - CT_RELATED_FOREIGN: it quotes one but comes from, or goes to, a third address: a
 *     router on the path, or anyone forging an error about another's flow to end it or to
 *     feed its socket. The caller decides (rampart.c, handle_related_foreign).
 * Out of line: errors are rare. */
static __noinline int ct_related(const struct pkt *p, __u32 ep_id, __u8 dir, __u64 now)
{
	struct ct4_key k, outer;

	if (!p->inner_valid)
		return CT_NEW;
	ct_key_fill(&k, &p->inner, ep_id, dir_opposite(dir));
	if (!ct_live(&k, p->inner.proto, now))
		return CT_NEW;
	ct_key_fill(&outer, &p->t, ep_id, dir);
	if (outer.laddr == k.laddr && outer.raddr == k.raddr)
		return CT_RELATED;
	return CT_RELATED_FOREIGN;
}

/* ct_lookup classifies p at endpoint ep_id in direction dir. For established packets and
 * replies, *flags receives the entry's flags (CT_F_TO_PROXY, CT_F_FROM_PROXY say where the
 * packet must be steered) and *entry the entry (for the policy revision check of
 * established packets); otherwise 0 and NULL. */
static __always_inline int ct_lookup(const struct pkt *p, __u32 ep_id, __u8 dir, __u64 now,
				     __u32 *flags, struct ct_value **entry)
{
	struct ct4_key k;
	struct ct_value *v;
	int reply;

	*flags = 0;
	*entry = 0;

	/* ICMP errors never belong to a flow of their own: they are related to the flow of
	 * the packet they quote. */
	if (unlikely(p->icmp_kind == ICMP_K_ERROR))
		return ct_related(p, ep_id, dir, now);
	/* Non-echo ICMP is stateless. */
	if (unlikely(p->icmp_kind == ICMP_K_OTHER))
		return CT_NEW;

	ct_key_fill(&k, &p->t, ep_id, dir);
	v = ct_live(&k, p->t.proto, now);
	if (!v)
		return CT_NEW;
	reply = v->direction != dir;
	/* A fresh SYN on a closing entry, from either side, opens a new connection with the
	 * same tuple: evaluate it against policy again. */
	if (p->t.proto == IPPROTO_TCP && (v->flags & CT_F_CLOSING) &&
	    (p->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN)
		return CT_NEW;
	ct_touch(v, p, reply, now);
	*flags = v->flags;
	*entry = v;
	return reply ? CT_REPLY : CT_ESTABLISHED;
}

/* ct_peer_identity is the identity of decision d's peer: the destination's for a packet
 * leaving the endpoint, the source's for one entering it. */
static __always_inline __u32 ct_peer_identity(const struct decision *d)
{
	return d->dir == DIR_EGRESS ? d->dst_identity : d->src_identity;
}

/* ct_value_init fills the entry of a new flow that decision d allowed: its direction,
 * rule and peer identity, CT_F_* flags, the check revision and VNI identity it was checked
 * with; a TCP segment with RST opens it closing. */
static __always_inline void ct_value_init(struct ct_value *v, const struct decision *d, __u32 flags,
					  __u32 revision, __u32 tunnel_id, __u8 proto, __u8 tcp_flags,
					  __u64 now)
{
	v->direction = d->dir;
	v->created = now;
	v->last_seen = now;
	v->rule_id = d->rule_id;
	v->flags = flags;
	v->revision = revision;
	v->tunnel_id = tunnel_id;
	v->peer_identity = ct_peer_identity(d);
	if (proto == IPPROTO_TCP && (tcp_flags & TCP_F_RST))
		v->flags |= CT_F_CLOSING;
}

/* ct_create records a new flow that decision d allowed (its endpoint, direction, rule and
 * peer identity) with the given CT_F_* flags (the proxy flags), checked against check
 * revision revision. Failure (not expected with an LRU map) only means the next packet is
 * evaluated against policy again. */
static __always_inline void ct_create(const struct pkt *p, const struct decision *d, __u32 flags,
				      __u32 revision, __u64 now)
{
	struct ct4_key k;
	struct ct_value v = {};

	if (p->icmp_kind == ICMP_K_ERROR || p->icmp_kind == ICMP_K_OTHER)
		return;
	ct_key_fill(&k, &p->t, d->ep_id, d->dir);
	ct_value_init(&v, d, flags, revision, p->tunnel_id, p->t.proto, p->tcp_flags, now);
	bpf_map_update_elem(&conntrack4_peer, &k, &v, BPF_ANY);
}

#endif /* __RAMPART_CONNTRACK_H */
