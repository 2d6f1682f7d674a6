/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Steering TCP connections to the L7 proxy (a transparent listener in the node namespace).
 *
 * Only tc ingress can do it (bpf_sk_assign refuses anywhere else), so everything happens
 * on the packet's way *out of* an endpoint (rampart_from_ep):
 *   - a connection's first packets: the proxy's listener (map proxy) is looked up and
 *     assigned; the accepted socket then has the original destination as local address;
 *   - later packets of a steered connection: the socket is found by the packet's own tuple
 *     (the accepted socket, or a request socket during the handshake);
 *   - a server's replies to the proxy's upstream connection (which uses the client's
 *     address, so routing alone would send them to the real client): the upstream socket,
 *     found by the reply's tuple.
 * A steered packet also gets proxy_config.steer_mark, which the node namespace routes to
 * its local table (`ip rule fwmark 0x1/0x1 lookup 101`, `local 0.0.0.0/0 dev lo table
 * 101`): without local delivery the assigned socket is ignored. */
#ifndef __RAMPART_PROXY_H
#define __RAMPART_PROXY_H

#include "common.h"
#include "maps.h"
#include "parse.h"

static __always_inline const struct proxy_config *proxy_cfg(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&proxy, &zero);
}

/* from_proxy says whether the packet was sent by the proxy's upstream socket (its socket
 * mark survives to the tc egress hook of the destination's veth, in the same namespace).
 * Endpoints cannot forge it: crossing from their namespace into the node's clears the mark. */
static __always_inline int from_proxy(const struct __sk_buff *skb)
{
	const struct proxy_config *cfg;
	__u32 mark = skb->mark;

	if (!mark)
		return 0;
	cfg = proxy_cfg();
	return cfg && cfg->upstream_mark && (mark & cfg->upstream_mark);
}

static __always_inline const struct proxy_config *dns_proxy_cfg(__u32 observe)
{
	__u32 idx = observe ? 1 : 0;

	return bpf_map_lookup_elem(&dns_proxy, &idx);
}

static __always_inline int is_syn(const struct pkt *p)
{
	return (p->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN;
}

/* assign_steered hands the packet to socket sk (a reference the caller looked up: released
 * here) and marks it for local delivery (marks: the map proxy's). Returns 0 when
 * assigned, -1 when not. */
static __always_inline int assign_steered(struct __sk_buff *skb, struct bpf_sock *sk,
					  const struct proxy_config *marks)
{
	long err = bpf_sk_assign(skb, sk, 0);

	bpf_sk_release(sk);
	if (err)
		return -1;
	skb->mark |= marks->steer_mark;
	return 0;
}

/* proxy_assign_tuple is proxy_assign_to's lookup and assignment for the packet's tuple, of
 * either family (v6: an IPv6 tuple; the listener's address is cfg's of that family). */
static __always_inline int proxy_assign_tuple(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					      const int v6, int syn, int listener,
					      const struct proxy_config *cfg,
					      const struct proxy_config *marks)
{
	__u32 len = v6 ? sizeof(tuple->ipv6) : sizeof(tuple->ipv4);
	struct bpf_sock *sk;

	sk = bpf_skc_lookup_tcp(skb, tuple, len, BPF_F_CURRENT_NETNS, 0);
	if (sk) {
		if (sk->state == BPF_TCP_TIME_WAIT && syn) {
			bpf_sk_release(sk);
			return -1;
		}
		if (sk->state != BPF_TCP_LISTEN)
			goto assign;
		bpf_sk_release(sk);
	}
	if (!listener || !syn)
		return -1;
	if (v6) {
		__builtin_memcpy(tuple->ipv6.daddr, cfg->addr, 16);
		tuple->ipv6.dport = cfg->port;
	} else {
		__builtin_memcpy(&tuple->ipv4.daddr, cfg->addr, 4);
		tuple->ipv4.dport = cfg->port;
	}
	sk = bpf_skc_lookup_tcp(skb, tuple, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	if (sk->state != BPF_TCP_LISTEN) {
		/* Something else owns that address and port (or the lookup found an odd
		 * connection with this exact tuple): not a proxy listener. */
		bpf_sk_release(sk);
		return -1;
	}
assign:
	return assign_steered(skb, sk, marks);
}

/* proxy_assign hands the TCP packet p to a proxy socket in this (the node) namespace and
 * marks it for local delivery. First the socket of the packet's own tuple: an accepted or
 * upstream connection, or a request socket mid-handshake; never a listener, which would be
 * some other service listening on the original destination port. A SYN that finds none
 * goes to the proxy's listener when listener is set.
 *
 * A SYN whose tuple still has a TIME_WAIT socket (the proxy closed an earlier connection on
 * it first) cannot be taken: assigned to the listener, the kernel silently drops it (the
 * new request socket collides with the TIME_WAIT one in the established hash, and the
 * TIME_WAIT path that would replace it is skipped for an assigned packet); assigned to the
 * TIME_WAIT socket, the kernel would hand it to whatever listens on the *original*
 * destination port in the node namespace, not to the proxy. SetupProxyRouting therefore
 * sets net.ipv4.tcp_max_tw_buckets=0 in the node namespace, so its sockets do not linger
 * in TIME_WAIT; should one exist anyway, the SYN is refused here, so that the caller reports
 * the drop (REASON_PROXY_UNAVAILABLE) instead of the kernel losing it without a trace.
 *
 * Returns 0 when assigned, -1 when there is no such socket (the caller drops: fail
 * closed). */
static __always_inline int proxy_assign_to(struct __sk_buff *skb, const struct pkt *p, int listener,
					   const struct proxy_config *cfg, const struct proxy_config *marks)
{
	struct bpf_sock_tuple tuple = {};

	if (!cfg || !cfg->port || !marks || !marks->steer_mark || cfg->family != RAMPART_FAMILY_V4)
		return -1; /* no proxy configured */
	tuple.ipv4.saddr = p->t.saddr;
	tuple.ipv4.daddr = p->t.daddr;
	tuple.ipv4.sport = p->t.sport;
	tuple.ipv4.dport = p->t.dport;
	return proxy_assign_tuple(skb, &tuple, 0, is_syn(p), listener, cfg, marks);
}

static __always_inline int proxy_assign(struct __sk_buff *skb, const struct pkt *p, int listener)
{
	const struct proxy_config *cfg = proxy_cfg();

	return proxy_assign_to(skb, p, listener, cfg, cfg);
}

/* dns_assign hands a DNS packet p (UDP or TCP) to the DNS proxy (its observing sockets
 * with observe set): TCP as proxy_assign does,
 * to the DNS proxy's listener; UDP to its one socket, bound to the dns_proxy address and
 * port (a UDP socket of the packet's own tuple is never looked for: the proxy answers
 * every datagram from that one socket). The steer mark is the L7 proxy's (the node routes
 * it to local delivery). Returns 0 when assigned, -1 when not (the caller drops). Out of
 * line: its socket tuple would otherwise count against the stack of every caller's call
 * chain. */
static __noinline int dns_assign(struct __sk_buff *skb, const struct pkt *p, int listener, int observe)
{
	const struct proxy_config *cfg = dns_proxy_cfg(observe);
	const struct proxy_config *marks = proxy_cfg();
	struct bpf_sock_tuple tuple = {};
	struct bpf_sock *sk;

	if (p->t.proto == IPPROTO_TCP)
		return proxy_assign_to(skb, p, listener, cfg, marks);
	if (p->t.proto != IPPROTO_UDP || !cfg || !cfg->port || !marks || !marks->steer_mark ||
	    cfg->family != RAMPART_FAMILY_V4)
		return -1;
	tuple.ipv4.saddr = p->t.saddr;
	tuple.ipv4.sport = p->t.sport;
	__builtin_memcpy(&tuple.ipv4.daddr, cfg->addr, 4);
	tuple.ipv4.dport = cfg->port;
	sk = bpf_sk_lookup_udp(skb, &tuple, sizeof(tuple.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return -1;
	return assign_steered(skb, sk, marks);
}

#endif /* __RAMPART_PROXY_H */
