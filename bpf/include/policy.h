/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Identities (ipcache) and the policy verdict for new flows. */
#ifndef __RAMPART_POLICY_H
#define __RAMPART_POLICY_H

#include "common.h"
#include "maps.h"
#include "cidrset.h"
#include "events.h"

struct peer_identity {
	__u32 identity;      /* ID_WORLD when the address is not in the ipcache */
	__u32 cidr_identity; /* flagged secondary identity, or 0 */
	__u32 ep_id;         /* the local endpoint with this address, or 0 */
	__u32 cidr_sets;     /* mask of the CIDR sets containing the address */
};

/* ipcache_peer fills out's identities from ipcache entry v (NULL: no entry, not even a
 * /0: the peer is outside everything we know, the world). */
static __always_inline void ipcache_peer(const struct ipcache_value *v, struct peer_identity *out)
{
	if (!v) {
		out->identity = ID_WORLD;
		out->cidr_identity = 0;
		out->ep_id = 0;
		return;
	}
	out->identity = v->identity;
	out->cidr_identity = v->cidr_identity;
	out->ep_id = v->ep_id;
}

/* ipcache_resolve looks up the longest prefix containing addr (IPv4, network order) and
 * the CIDR sets containing it. */
static __always_inline void ipcache_resolve(__be32 addr, struct peer_identity *out)
{
	struct ipcache_key k;

	out->cidr_sets = cidr_sets4(addr);
	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = 32 + 32;
	k.family = RAMPART_FAMILY_V4;
	__builtin_memcpy(k.addr, &addr, 4);
	ipcache_peer(bpf_map_lookup_elem(&ipcache, &k), out);
}

struct verdict {
	__u8 action; /* POLICY_ALLOW, POLICY_DENY, POLICY_REDIRECT, POLICY_PASS, or 0 when no
		      * entry matched */
	__u8 proxy;  /* PROXY_KIND_* of a POLICY_REDIRECT */
	__u16 prec;  /* policy_value.prec of the entry that gave action */
	__u32 rule_id;
	__u32 identity; /* the looked-up identity whose entry gave action */
};

/* action_rank orders the merge of several lookups: deny > redirect > allow > no match.
 * Redirect beats allow so that a broader allow (another identity lookup) can never let
 * traffic skip the L7 checks another entry asks for. */
static __always_inline int action_rank(__u8 action)
{
	switch (action) {
	case POLICY_DENY:
		return 3;
	case POLICY_REDIRECT:
		return 2;
	case POLICY_ALLOW:
		return 1;
	}
	return 0; /* POLICY_PASS, or nothing */
}

/* verdict_beats says whether an entry (action, prec) replaces the verdict res: res has
 * none, or the entry's precedence is higher (a lower prec), or equal with a higher action
 * (on a tie the earlier lookup stays). */
static __always_inline int verdict_beats(__u8 action, __u16 prec, const struct verdict *res)
{
	if (!res->action)
		return action != 0;
	if (prec != res->prec)
		return prec < res->prec;
	return action_rank(action) > action_rank(res->action);
}

/* policy_lookup does one full-key (96-bit) LPM lookup and merges it into res
 * (verdict_beats). */
static __always_inline void policy_lookup(struct policy_key *k, __u32 identity,
					  struct verdict *res)
{
	struct policy_value *v;

	k->identity = identity;
	v = bpf_map_lookup_elem(&policy, k);
	if (!v)
		return;
	if (verdict_beats(v->action, v->prec, res)) {
		res->action = v->action;
		res->proxy = v->proxy;
		res->prec = v->prec;
		res->rule_id = v->rule_id;
		res->identity = identity;
	}
}

struct set_policy_ctx {
	struct policy_key k;
	struct verdict res;
	__u32 sets;
};

/* set_policy_step is one step of cidr_set_policy's bpf_loop: set index i. */
static long set_policy_step(__u64 i, void *arg)
{
	struct set_policy_ctx *c = arg;
	__u32 rest = c->sets >> (i & (RAMPART_CIDR_SETS - 1));

	if (!rest)
		return 1; /* no set left */
	if (rest & 1)
		policy_lookup(&c->k, ID_CIDR_SET_FIRST + (__u32)i, &c->res);
	return 0;
}

/* cidr_set_policy does the policy lookups for the CIDR sets in mask sets (bit i: identity
 * ID_CIDR_SET_FIRST + i) with the key of policy_decide and merges them into res. The loop
 * runs through bpf_loop: the verifier checks the step once instead of every iteration
 * in every state of the caller. */
static __always_inline void cidr_set_policy(const struct policy_key *k, __u32 sets,
					    struct verdict *res)
{
	struct set_policy_ctx c = { .k = *k, .sets = sets };

	bpf_loop(RAMPART_CIDR_SETS, set_policy_step, &c, 0);
	if (verdict_beats(c.res.action, c.res.prec, res))
		*res = c.res;
}

/* policy_round does one round of lookups: the peer's identity, any identity (0), the
 * peer's flagged CIDR identity if it has one, and the identity of every CIDR set
 * containing the peer, merged into res (verdict_beats). */
static __always_inline void policy_round(struct policy_key *k, const struct peer_identity *peer,
					 struct verdict *res)
{
	res->action = 0;
	res->proxy = 0;
	res->prec = 0;
	res->rule_id = 0;
	res->identity = 0;
	policy_lookup(k, peer->identity, res);
	policy_lookup(k, ID_UNKNOWN, res);
	if (peer->cidr_identity)
		policy_lookup(k, peer->cidr_identity, res);
	if (peer->cidr_sets)
		cidr_set_policy(k, peer->cidr_sets, res);
}

/* policy_decide evaluates a new flow. With admin set (the endpoint has Admin tier entries
 * for the direction: EP_ADMIN_*), a first round in the Admin tier entries decides if it
 * finds an Accept (POLICY_ALLOW) or a Deny; a Pass, or nothing, goes on to the round in the
 * other entries (the NetworkPolicy tier, and Baseline entries for endpoints that tier does
 * not isolate), where deny wins over redirect over allow at equal precedence; a Pass there
 * is no decision. The caller applies default deny when nothing decided. At most
 * 2 * (3 + RAMPART_CIDR_SETS) lookups, whatever the number of rules and prefixes. */
/*
 * A global function, so the verifier checks it once rather than at each of its callers,
 * and its key and set loop state live in its own frame. Global functions take at most
 * five arguments: how packs the direction (bits 0-6), admin (bit 7), the protocol (bits
 * 8-15) and the port (bits 16-31, network order).
 */
__noinline int policy_decide_packed(__u32 ep_id, __u32 how, const struct peer_identity *peer __arg_nonnull,
				    struct verdict *res __arg_nonnull)
{
	struct policy_key k;
	__u8 dir = how & 0x7f;

	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = 96;
	k.ep_id = ep_id;
	k.protocol = (how >> 8) & 0xff;
	k.dport = how >> 16;
	if (how & 0x80) {
		k.direction = dir | DIR_ADMIN_FLAG;
		policy_round(&k, peer, res);
		if (res->action == POLICY_ALLOW || res->action == POLICY_DENY)
			return 0;
	}
	k.direction = dir;
	policy_round(&k, peer, res);
	if (res->action == POLICY_PASS)
		res->action = 0;
	return 0;
}

static __always_inline void policy_decide(__u32 ep_id, __u8 dir, int admin, const struct peer_identity *peer,
					  __u8 proto, __be16 port, struct verdict *res)
{
	policy_decide_packed(ep_id, (__u32)dir | (admin ? 0x80 : 0) | ((__u32)proto << 8) | ((__u32)port << 16),
			     peer, res);
}

/* policy_audit looks a new flow that the endpoint's policy lets through up in its audit
 * entries (EP_AUDIT_*: ep_id | AUDIT_EP_FLAG, every tier) and, if those would drop it,
 * marks d audited with their reason and rule. how packs the direction (bits 0-5), whether
 * the audit entries enforce it (bit 6), the protocol (bits 8-15) and the port (bits 16-31,
 * network order). A global function: checked once, its verdict in its own frame. */
__noinline int policy_audit(struct decision *d __arg_nonnull, __u32 how,
			    const struct peer_identity *peer __arg_nonnull)
{
	struct verdict res;
	__u8 reason;

	policy_decide_packed(d->ep_id | AUDIT_EP_FLAG, (how & ~0x40u) | 0x80, peer, &res);
	if (res.action == POLICY_DENY)
		reason = REASON_POLICY_DENY;
	else if (res.action != POLICY_ALLOW && res.action != POLICY_REDIRECT && (how & 0x40))
		reason = REASON_POLICY_DEFAULT_DENY;
	else
		return 0;
	d->audit = 1;
	d->reason = reason;
	d->rule_id = res.rule_id;
	d->match_identity = res.identity;
	return 1;
}

/* audit_new runs policy_audit for a new flow of endpoint ep in direction dir when a
 * policy in audit mode applies to it there. */
static __always_inline void audit_new(struct decision *d, const struct endpoint_info *ep, __u8 dir,
				      const struct peer_identity *peer, __u8 proto, __be16 port)
{
	__u32 flags = ep->flags;

	if (likely(!(flags & (dir == DIR_INGRESS ? EP_AUDIT_INGRESS : EP_AUDIT_EGRESS))))
		return;
	policy_audit(d, (__u32)dir |
			     ((flags & (dir == DIR_INGRESS ? EP_AUDIT_ENFORCE_INGRESS : EP_AUDIT_ENFORCE_EGRESS)) ? 0x40 : 0) |
			     ((__u32)proto << 8) | ((__u32)port << 16),
		     peer);
}

#endif /* __RAMPART_POLICY_H */
