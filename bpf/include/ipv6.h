/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6: parsing (extension headers, fragments, ICMPv6 with neighbour discovery), identities,
 * connection tracking and flow events of the IPv6 path (rampart.c, handle6).
 *
 * The IPv6 path is a program of its own (rampart_from_ep6, rampart_to_ep6), entered by a tail
 * call from the endpoint programs, so that its larger addresses neither grow the IPv4 path's
 * stack nor cost an IPv4 packet anything but one compare. Its rules are the IPv4 path's
 * (rampart.c, conntrack.h): the same policy map and verdicts, the same conntrack values and
 * timeouts in a map of its own (conntrack6), the same flow events with 16-byte addresses. */
#ifndef __RAMPART_IPV6_H
#define __RAMPART_IPV6_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"
#include "events.h"

#ifndef IPPROTO_ICMPV6
#define IPPROTO_ICMPV6 58
#endif

#define IPV6_HLEN 40
/* At most this many extension headers before the upper-layer header; a packet with more
 * is dropped (REASON_IPV6_EXTENSION). Real traffic carries one or two. */
#define IPV6_MAX_EXT_HDRS 6

/* Extension headers (RFC 8200, 4.1). */
#define NEXTHDR_HOP 0
#define NEXTHDR_ROUTING 43
#define NEXTHDR_FRAGMENT 44
#define NEXTHDR_AUTH 51
#define NEXTHDR_NONE 59
#define NEXTHDR_DEST 60

#define IP6_OFFMASK 0xfff8
#define IP6_MF 0x0001

/* ICMPv6 types (RFC 4443, 4861, 2710, 3810). */
#define ICMP6_T_DEST_UNREACH 1
#define ICMP6_T_PKT_TOOBIG 2
#define ICMP6_T_TIME_EXCEED 3
#define ICMP6_T_PARAMPROB 4
#define ICMP6_T_ECHO_REQUEST 128
#define ICMP6_T_ECHO_REPLY 129
#define ICMP6_T_MLD_QUERY 130
#define ICMP6_T_MLD_REPORT 131
#define ICMP6_T_MLD_DONE 132
#define ICMP6_T_ROUTER_SOLICIT 133
#define ICMP6_T_ROUTER_ADVERT 134
#define ICMP6_T_NEIGH_SOLICIT 135
#define ICMP6_T_NEIGH_ADVERT 136
#define ICMP6_T_REDIRECT 137
#define ICMP6_T_MLD2_REPORT 143

/* Neighbour discovery messages are only valid with this hop limit (RFC 4861, 6.1): a router
 * would have lowered it, so one that has it came from the link. */
#define ND_HOP_LIMIT 255

/* A parsed IPv6 packet. t and inner as struct tuple, with 16-byte addresses. */
struct tuple6 {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct pkt6 {
	struct tuple6 t;
	struct tuple6 inner; /* ICMPv6 errors: the quoted packet's tuple (when inner_valid) */
	__u8 nd_target[16];  /* neighbour solicitations and advertisements: the target */
	__u32 len;
	__u32 frag_id; /* the fragment header's identification */
	__u32 ipcache_gen;
	/* Entering an endpoint from the overlay, the identity its VNI carried (pkt.tunnel_id,
	 * tunnel_id_of): part of an established flow's check word, as for IPv4. */
	__u32 tunnel_id;
	__be16 policy_port;
	__u8 frag; /* enum frag_kind */
	__u8 tcp_flags;
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 icmp_kind; /* enum icmp_kind */
	__u8 inner_valid;
	__u8 hop_limit;
	__u8 nd;        /* a neighbour discovery or MLD message (link control, no policy) */
	__u8 pad[2];
};

/* The fixed IPv6 header (struct ipv6hdr without its kernel headers' bitfields). */
struct ip6_head {
	__u8 vtc;       /* version (upper 4 bits), traffic class (upper half) */
	__u8 tc_flow;
	__be16 flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* The first 8 bytes of an extension header: next header and length for all of them, and
 * for a routing header its type and segments left; for a fragment header its offset and
 * identification. */
struct ip6_ext {
	__u8 nexthdr;
	__u8 hdrlen;
	__u8 b2;
	__u8 b3;
	__be32 w1;
};

static __always_inline int ip6_is_zero(const __u8 *a)
{
	const __u64 *w = (const __u64 *)a;

	return (w[0] | w[1]) == 0;
}

static __always_inline int ip6_equal(const __u8 *a, const __u8 *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1])) == 0;
}

/* ip6_is_link_local: fe80::/10. */
static __always_inline int ip6_is_link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

/* ip6_is_link_scoped: a destination on the link only, link-local unicast or link-local
 * scope multicast (ff02::/16), which no router forwards. */
static __always_inline int ip6_is_link_scoped(const __u8 *a)
{
	return ip6_is_link_local(a) || (a[0] == 0xff && (a[1] & 0x0f) == 0x02);
}

static __always_inline int icmp6_is_error(__u8 type)
{
	return type >= ICMP6_T_DEST_UNREACH && type <= ICMP6_T_PARAMPROB;
}

/* icmp6_is_link_control: neighbour discovery and multicast listener messages, which carry
 * no policy (as ARP for IPv4) and are checked for what they claim instead (rampart.c,
 * handle6_nd). */
static __always_inline int icmp6_is_link_control(__u8 type)
{
	return (type >= ICMP6_T_MLD_QUERY && type <= ICMP6_T_REDIRECT) || type == ICMP6_T_MLD2_REPORT;
}

/* parse6_inner reads the packet an ICMPv6 error quotes at off: its fixed header and the
 * ports (or echo id) right after it. A quote with extension headers, or too short, leaves
 * inner_valid at 0 (the error is then unrelated, as in parse_inner). */
static __noinline void parse6_inner(struct __sk_buff *skb, __u32 off, __u32 end, struct pkt6 *p)
{
	struct ip6_head ip;

	if (off + sizeof(ip) > end)
		return;
	if (hdr_load(skb, off, &ip) < 0)
		return;
	if ((ip.vtc >> 4) != 6)
		return;
	__builtin_memcpy(p->inner.saddr, ip.saddr, 16);
	__builtin_memcpy(p->inner.daddr, ip.daddr, 16);
	p->inner.proto = ip.nexthdr;
	off += IPV6_HLEN;
	switch (ip.nexthdr) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
	case IPPROTO_SCTP: {
		struct l4_ports ports;

		if (off + sizeof(ports) > end)
			return;
		if (hdr_load(skb, off, &ports) < 0)
			return;
		p->inner.sport = ports.sport;
		p->inner.dport = ports.dport;
		break;
	}
	case IPPROTO_ICMPV6: {
		struct icmp_head ih;

		if (off + sizeof(ih) > end)
			return;
		if (hdr_load(skb, off, &ih) < 0)
			return;
		if (ih.type == ICMP6_T_ECHO_REQUEST)
			p->inner.sport = ih.id;
		else if (ih.type == ICMP6_T_ECHO_REPLY)
			p->inner.dport = ih.id;
		else
			return;
		break;
	}
	case NEXTHDR_HOP:
	case NEXTHDR_ROUTING:
	case NEXTHDR_FRAGMENT:
	case NEXTHDR_DEST:
	case NEXTHDR_AUTH:
		return; /* the quoted ports are behind extension headers: not followed */
	default:
		break;
	}
	p->inner_valid = 1;
}

/* parse6_l4 fills ports, TCP flags and ICMPv6 details (as parse_l4) of a whole packet or a
 * first fragment; off is the upper-layer header's offset, end the end of the payload. */
static __always_inline int parse6_l4(struct __sk_buff *skb, __u32 off, __u32 end, struct pkt6 *p)
{
	__u32 l4len = end - off;

	switch (p->t.proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
	case IPPROTO_SCTP: {
		struct l4_ports ports;

		if (parse_ports(skb, off, l4len, p->t.proto, &ports, &p->tcp_flags) < 0)
			return PARSE_MALFORMED;
		p->t.sport = ports.sport;
		p->t.dport = ports.dport;
		p->policy_port = ports.dport;
		return PARSE_IPV6;
	}
	case IPPROTO_ICMPV6: {
		struct icmp_head ih;

		/* Drop: ICMPv6 header beyond the payload. */
		if (l4len < ICMP_HLEN)
			return PARSE_MALFORMED;
		if (hdr_load(skb, off, &ih) < 0)
			return PARSE_MALFORMED;
		p->icmp_type = ih.type;
		p->icmp_code = ih.code;
		p->policy_port = bpf_htons((__u16)ih.type);
		if (ih.type == ICMP6_T_ECHO_REQUEST) {
			p->icmp_kind = ICMP_K_ECHO;
			p->t.sport = ih.id;
		} else if (ih.type == ICMP6_T_ECHO_REPLY) {
			p->icmp_kind = ICMP_K_ECHO;
			p->t.dport = ih.id;
		} else if (icmp6_is_error(ih.type)) {
			p->icmp_kind = ICMP_K_ERROR;
			parse6_inner(skb, off + ICMP_HLEN, end, p);
		} else {
			p->icmp_kind = ICMP_K_OTHER;
			if (icmp6_is_link_control(ih.type)) {
				p->nd = 1;
				if (ih.type == ICMP6_T_NEIGH_SOLICIT || ih.type == ICMP6_T_NEIGH_ADVERT) {
					/* Drop: a solicitation or advertisement without its target. */
					if (l4len < ICMP_HLEN + 16)
						return PARSE_MALFORMED;
					if (bpf_skb_load_bytes(skb, off + ICMP_HLEN, p->nd_target, 16) < 0)
						return PARSE_MALFORMED;
				}
			}
		}
		return PARSE_IPV6;
	}
	default:
		/* Other protocols (ESP, NEXTHDR_NONE, ...) have no ports. */
		return PARSE_IPV6;
	}
}

/* parse6 fills p from the IPv6 packet after the Ethernet header. Extension headers are
 * followed to the upper-layer header (IPV6_MAX_EXT_HDRS at most): hop-by-hop (first only),
 * destination options, authentication, routing (only with no segments left: otherwise the
 * destination address is not where the packet ends, and policy would judge the wrong peer)
 * and fragment (later fragments stop there, as for IPv4). Returns PARSE_IPV6,
 * PARSE_MALFORMED, or -REASON_IPV6_EXTENSION for a header the path does not follow. */
static __noinline int parse6(struct __sk_buff *skb, struct pkt6 *p)
{
	struct eth_type eth;
	struct ip6_head ip;
	__u32 off = ETH_HLEN + IPV6_HLEN, end, i;
	__u8 next;

	p->len = skb->len;
	/* Drop: not an IPv6 frame after all (the tail call trusted skb->protocol). */
	if (hdr_load(skb, ETH_HLEN - sizeof(eth), &eth) < 0 || eth.proto != bpf_htons(ETH_P_IPV6))
		return PARSE_MALFORMED;
	/* Drop: IPv6 header truncated, or not version 6. */
	if (hdr_load(skb, ETH_HLEN, &ip) < 0 || (ip.vtc >> 4) != 6)
		return PARSE_MALFORMED;
	__builtin_memcpy(p->t.saddr, ip.saddr, 16);
	__builtin_memcpy(p->t.daddr, ip.daddr, 16);
	p->hop_limit = ip.hop_limit;
	/* Drop: a jumbogram (payload length 0, RFC 2675): not on an Ethernet link. */
	if (ip.payload_len == 0)
		return -REASON_IPV6_EXTENSION;
	end = off + bpf_ntohs(ip.payload_len);
	/* Drop: payload longer than what was received. Trailing bytes are fine. */
	if (end > skb->len)
		return PARSE_MALFORMED;
	next = ip.nexthdr;
	for (i = 0; i < IPV6_MAX_EXT_HDRS; i++) {
		struct ip6_ext ext;
		__u16 frag_off;

		if (next != NEXTHDR_HOP && next != NEXTHDR_ROUTING && next != NEXTHDR_FRAGMENT &&
		    next != NEXTHDR_DEST && next != NEXTHDR_AUTH) {
			p->t.proto = next;
			return parse6_l4(skb, off, end, p);
		}
		/* Drop: an extension header beyond the payload. */
		if (off + sizeof(ext) > end || hdr_load(skb, off, &ext) < 0)
			return PARSE_MALFORMED;
		switch (next) {
		case NEXTHDR_HOP:
			/* Drop: hop-by-hop options anywhere but first (RFC 8200, 4.1). */
			if (i != 0)
				return -REASON_IPV6_EXTENSION;
			off += (ext.hdrlen + 1) * 8;
			break;
		case NEXTHDR_DEST:
			off += (ext.hdrlen + 1) * 8;
			break;
		case NEXTHDR_ROUTING:
			/* Drop: segments left, so the destination is a waypoint. */
			if (ext.b3 != 0)
				return -REASON_IPV6_EXTENSION;
			off += (ext.hdrlen + 1) * 8;
			break;
		case NEXTHDR_AUTH:
			off += (ext.hdrlen + 2) * 4;
			break;
		case NEXTHDR_FRAGMENT:
			/* Drop: a second fragment header. */
			if (p->frag != FRAG_NONE)
				return PARSE_MALFORMED;
			frag_off = ((__u16)ext.b2 << 8) | ext.b3;
			p->frag_id = ext.w1;
			if (frag_off & IP6_OFFMASK) {
				/* A later fragment: no upper-layer header; the verdict is the first
				 * fragment's. */
				p->frag = FRAG_LATER;
				p->t.proto = ext.nexthdr;
				return PARSE_IPV6;
			}
			/* Offset 0 and no more fragments: an atomic fragment, a whole packet. */
			if (frag_off & IP6_MF)
				p->frag = FRAG_FIRST;
			off += 8;
			break;
		}
		/* Drop: the header's length runs past the payload. */
		if (off > end)
			return PARSE_MALFORMED;
		next = ext.nexthdr;
	}
	/* Drop: more extension headers than followed. */
	return -REASON_IPV6_EXTENSION;
}

/* ipcache_resolve6 is ipcache_resolve for an IPv6 address. */
static __always_inline void ipcache_resolve6(const __u8 *addr, struct peer_identity *out)
{
	struct ipcache_key k;
	struct cidr6_key ck;
	__u32 *sets;

	__builtin_memset(&ck, 0, sizeof(ck));
	ck.prefixlen = 128;
	__builtin_memcpy(ck.addr, addr, 16);
	sets = bpf_map_lookup_elem(&cidr6, &ck);
	out->cidr_sets = sets ? *sets : 0;
	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = 32 + 128;
	k.family = RAMPART_FAMILY_V6;
	__builtin_memcpy(k.addr, addr, 16);
	ipcache_peer(bpf_map_lookup_elem(&ipcache, &k), out);
}

/* ct6_key_fill: ct_key_fill for IPv6. */
static __always_inline void ct6_key_fill(struct ct6_key *k, const struct tuple6 *t, __u32 ep_id,
					 __u8 dir)
{
	__builtin_memset(k, 0, sizeof(*k));
	if (dir == DIR_EGRESS) {
		__builtin_memcpy(k->laddr, t->saddr, 16);
		__builtin_memcpy(k->raddr, t->daddr, 16);
		k->lport = t->sport;
		k->rport = t->dport;
	} else {
		__builtin_memcpy(k->laddr, t->daddr, 16);
		__builtin_memcpy(k->raddr, t->saddr, 16);
		k->lport = t->dport;
		k->rport = t->sport;
	}
	k->ep_id = ep_id;
	k->protocol = t->proto;
}

/* ct6_live: ct_live for conntrack6. */
static __always_inline struct ct_value *ct6_live(struct ct6_key *k, __u8 proto, __u64 now)
{
	struct ct_value *v = bpf_map_lookup_elem(&conntrack6, k);
	__u64 timeout;

	if (!v)
		return 0;
	timeout = ct_timeout(v, proto);
	/* The flow cache may be serving this flow (flow_cache6). */
	if (v->flags & CT_F_SEEN_REPLY)
		timeout += flow_cache_window;
	if ((__s64)(now - v->last_seen) > (__s64)timeout) {
		bpf_map_delete_elem(&conntrack6, k);
		return 0;
	}
	return v;
}

/* ct6_lookup classifies p as ct_lookup does. */
static __noinline int ct6_lookup(const struct pkt6 *p, __u32 ep_id, __u8 dir, __u64 now,
				 struct ct_value **entry)
{
	struct ct6_key k, outer;
	struct ct_value *v;
	int reply;

	*entry = 0;
	if (p->icmp_kind == ICMP_K_ERROR) {
		if (!p->inner_valid)
			return CT_NEW;
		ct6_key_fill(&k, &p->inner, ep_id, dir_opposite(dir));
		if (!ct6_live(&k, p->inner.proto, now))
			return CT_NEW;
		ct6_key_fill(&outer, &p->t, ep_id, dir);
		if (ip6_equal(outer.laddr, k.laddr) && ip6_equal(outer.raddr, k.raddr))
			return CT_RELATED;
		return CT_RELATED_FOREIGN;
	}
	if (p->icmp_kind == ICMP_K_OTHER)
		return CT_NEW;
	ct6_key_fill(&k, &p->t, ep_id, dir);
	v = ct6_live(&k, p->t.proto, now);
	if (!v)
		return CT_NEW;
	reply = v->direction != dir;
	if (p->t.proto == IPPROTO_TCP && (v->flags & CT_F_CLOSING) &&
	    (p->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN)
		return CT_NEW;
	ct_touch_flags(v, p->t.proto, p->tcp_flags, reply, now);
	*entry = v;
	return reply ? CT_REPLY : CT_ESTABLISHED;
}

/* flow_cache6_want: flow_cache_want for an IPv6 packet. */
static __always_inline void flow_cache6_want(struct flow_cache6_entry *want, const struct pkt6 *p,
					     __u32 ifindex, __u8 dir)
{
	__builtin_memset(want, 0, sizeof(*want));
	want->ifindex = ifindex;
	if (dir == DIR_EGRESS) {
		__builtin_memcpy(want->laddr, p->t.saddr, 16);
		__builtin_memcpy(want->raddr, p->t.daddr, 16);
		want->lport = p->t.sport;
		want->rport = p->t.dport;
	} else {
		__builtin_memcpy(want->laddr, p->t.daddr, 16);
		__builtin_memcpy(want->raddr, p->t.saddr, 16);
		want->lport = p->t.dport;
		want->rport = p->t.sport;
	}
	want->proto_tunnel = p->t.proto | (p->tunnel_id << 8);
}

/* flow_cache6_slot_of: flow_cache_slot_of for IPv6, the addresses folded to 32 bits. */
static __always_inline struct flow_cache6_entry *flow_cache6_slot_of(const struct flow_cache6_entry *want)
{
	const __u32 *l = (const __u32 *)want->laddr, *r = (const __u32 *)want->raddr;
	__u32 h = (l[0] ^ l[1] ^ l[2] ^ l[3]) * 0x9E3779B1u ^ (r[0] ^ r[1] ^ r[2] ^ r[3]) * 0x85EBCA77u;

	return fc_slot(&flow_cache6, fc_mix(h, want->lport, want->rport, want->ifindex,
					    want->proto_tunnel, RAMPART_FLOW_CACHE6_SLOTS),
		       flow_cache6_offset, RAMPART_FLOW_CACHE6_SLOT_BYTES,
		       sizeof(struct flow_cache6_entry));
}

/* flow_cache6_eligible: flow_cache_eligible for an IPv6 packet. Fragments take the
 * conntrack path too: a first fragment's record for the later ones needs the flow's peer
 * identity, which its conntrack entry holds. */
static __always_inline int flow_cache6_eligible(const struct pkt6 *p)
{
	return p->frag == FRAG_NONE && fc_eligible(p->t.proto, p->tcp_flags, p->icmp_kind);
}

/* flow_cache6_hit says whether the flow cache serves the flow of IPv6 packet p at
 * interface ifindex in direction dir (fc_hit). Out of line, unlike IPv4's, so that the
 * words compared do not add to the policy path's stack, which its deepest call chain
 * fills. */
static __noinline int flow_cache6_hit(const struct pkt6 *p, __u32 ifindex, __u8 dir,
				      __u32 revision, __u64 now)
{
	struct flow_cache6_entry want, *e;

	flow_cache6_want(&want, p, ifindex, dir);
	e = flow_cache6_slot_of(&want);
	return e && fc_hit(e, FC_READ(*(__u64 *)e), &want, FC6_WORDS, revision, now);
}

/* flow_cache6_store fills the entry at e with the flow in want checked against revision
 * (fc_fill), or, when !fill, empties it if it holds that flow (fc_forget). */
static __noinline void flow_cache6_store(struct flow_cache6_entry *e,
					 const struct flow_cache6_entry *want, __u32 revision,
					 int fill)
{
	if (fill)
		fc_fill(e, want, FC6_WORDS, revision, bpf_jiffies64());
	else
		fc_forget(e, want, FC6_WORDS);
}

/* flow_cache6_update stores the flow of IPv6 packet p at interface ifindex in direction
 * dir (flow_cache6_store), its slot and words found again here so that the policy path
 * keeps none of them on its stack. */
static __noinline void flow_cache6_update(const struct pkt6 *p, __u32 ifindex, __u8 dir,
					  __u32 revision, int fill)
{
	struct flow_cache6_entry want, *e;

	flow_cache6_want(&want, p, ifindex, dir);
	e = flow_cache6_slot_of(&want);
	if (e)
		flow_cache6_store(e, &want, revision, fill);
}

/* ct6_create: ct_create for IPv6 (flags: CT_F_TO_PROXY, CT_F_FROM_PROXY or 0). */
static __noinline void ct6_create(const struct pkt6 *p, const struct decision *d, __u32 flags,
				  __u32 revision, __u64 now)
{
	struct ct6_key k;
	struct ct_value v = {};

	if (p->icmp_kind == ICMP_K_ERROR || p->icmp_kind == ICMP_K_OTHER)
		return;
	ct6_key_fill(&k, &p->t, d->ep_id, d->dir);
	ct_value_init(&v, d, flags, revision, p->tunnel_id, p->t.proto, p->tcp_flags, now);
	bpf_map_update_elem(&conntrack6, &k, &v, BPF_ANY);
}

/* frag6_key_fill: frag_key_fill for IPv6 (the same map, family 6). */
static __always_inline void frag6_key_fill(struct frag_key *k, const struct pkt6 *p, __u32 ep_id,
					   __u8 dir)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, p->t.saddr, 16);
	__builtin_memcpy(k->daddr, p->t.daddr, 16);
	k->id = p->frag_id;
	k->ep_id = ep_id;
	k->protocol = p->t.proto;
	k->family = RAMPART_FAMILY_V6;
	k->direction = dir;
}

/* frag6_record remembers a first fragment's verdict for its later fragments (frag_record). */
static __noinline void frag6_record(const struct pkt6 *p, const struct decision *d, __u8 allowed)
{
	struct frag_key k;
	struct frag_value v = {};

	frag6_key_fill(&k, p, d->ep_id, d->dir);
	v.sport = p->t.sport;
	v.dport = p->t.dport;
	v.allowed = allowed;
	v.reason = d->reason;
	v.rule_id = d->rule_id;
	v.peer_identity = ct_peer_identity(d);
	v.tunnel_id = p->tunnel_id;
	v.ipcache_gen = p->ipcache_gen;
	bpf_map_update_elem(&frags_peer, &k, &v, BPF_ANY);
}

/* ct6_check_word is ct_check_word for IPv6: the check revision and the VNI identity the
 * packet arrived with, so that a flow whose packets now carry another identity is checked
 * again (handle6_recheck). */
static __always_inline __u64 ct6_check_word(__u32 rev, const struct pkt6 *p)
{
	return (__u64)rev | ((__u64)p->tunnel_id << 32);
}

/* emit_event6: emit_event for an IPv6 packet. */
static __noinline void emit_event6(struct __sk_buff *skb, const struct pkt6 *p,
				   const struct decision *d, __u8 type, __u8 verdict)
{
	struct flow_event *e;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost_event();
		return;
	}
	event_fill(e, skb, d, type, verdict);
	__builtin_memcpy(e->saddr, p->t.saddr, 16);
	__builtin_memcpy(e->daddr, p->t.daddr, 16);
	e->sport = p->t.sport;
	e->dport = p->t.dport;
	e->length = p->len;
	e->protocol = p->t.proto;
	e->family = RAMPART_FAMILY_V6;
	e->icmp_type = p->icmp_type;
	events_submit(e);
}

/* drop6: drop for an IPv6 packet. */
static __noinline int drop6(struct __sk_buff *skb, const struct pkt6 *p, struct decision *d,
			    __u8 reason)
{
	d->reason = reason;
	count_drop(d, p->len);
	emit_event6(skb, p, d, EVENT_DROP, VERDICT_DROPPED);
	return TC_ACT_SHOT;
}

#endif /* __RAMPART_IPV6_H */
