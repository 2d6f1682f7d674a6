/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 in the VXLAN overlay: the inner packets between pods of different nodes may be
 * IPv6, whichever family the outer packets are (the nodes' IPv4 fabric addresses, or their
 * IPv6 ones with rampartd --vxlan-underlay=ipv6: tunnel_key_to, tunnel_from_node), so
 * IPv6 between pods needs no IPv6 fabric. rampart_to_tunnel and rampart_from_tunnel (rampart.c) hand an IPv6
 * frame to the programs of these (rampart_to_tunnel6, rampart_from_tunnel6: a tail call by
 * skb->protocol); their rules are tunnel.h's:
 *
 *   tunnel_egress6   the destination's node from the ipcache (its /128 carries the tunnel
 *                    endpoint); the VNI is the source's identity when the source is a local
 *                    endpoint's address (its veth let only its own out, handle6) or the
 *                    host's, else world; no node for the destination: dropped.
 *   tunnel_ingress6  from a known node's address only (remote-node, IPv4 or IPv6); the VNI's identity
 *                    goes in the mark (tunnel_mark) for rampart_to_ep6, which believes it
 *                    only for a packet received on the VXLAN device, as rampart_to_ep
 *                    does (peer6, tunnel_source).
 *
 * The IP-in-IP overlay and native routing carry no IPv6 between nodes (docs/architecture.md,
 * "IPv6 between nodes"): their node routes are IPv4's only. */
#ifndef __RAMPART_TUNNEL6_H
#define __RAMPART_TUNNEL6_H

#include "common.h"
#include "maps.h"
#include "tunnel.h"
#include "ipv6.h"

/* tunnel_drop6_unparsed: tunnel_drop_unparsed for an IPv6 frame (parse6's result ret). */
static __always_inline int tunnel_drop6_unparsed(struct __sk_buff *skb, struct pkt6 *p,
						 struct decision *d, int ret)
{
	return drop6(skb, p, d, ret == PARSE_MALFORMED ? REASON_MALFORMED : REASON_IPV6_EXTENSION);
}

/* tunnel_egress6 sets the tunnel key of an IPv6 packet the node routed into the VXLAN
 * device (tunnel_egress). */
static __always_inline int tunnel_egress6(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_EGRESS};
	struct ipcache_value *dst;
	struct pkt6 p = {};
	__u32 id;
	int ret;

	ret = parse6(skb, &p);
	if (ret != PARSE_IPV6)
		return tunnel_drop6_unparsed(skb, &p, &d, ret);
	dst = ipcache_value6_of(p.t.daddr);
	if (!dst || !dst->tunnel_endpoint) {
		d.dst_identity = dst ? dst->identity : ID_WORLD;
		/* Drop: no known node hosts the destination (fail closed: never sent to a
		 * guessed node). */
		return drop6(skb, &p, &d, REASON_TUNNEL_NO_ENDPOINT);
	}
	id = tunnel_vni(ipcache_value6_of(p.t.saddr));
	if (tunnel_set_key(skb, dst, id) < 0) {
		d.src_identity = id;
		d.dst_identity = dst->identity;
		return drop6(skb, &p, &d, REASON_MALFORMED);
	}
	return TC_ACT_OK;
}

/* tunnel_ingress6 admits an IPv6 packet the VXLAN device decapsulated (tunnel_ingress):
 * from a known node only, with the VNI's identity in its mark for rampart_to_ep6. */
static __always_inline int tunnel_ingress6(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_INGRESS};
	struct bpf_tunnel_key key = {};
	struct pkt6 p = {};
	int ret, node;

	ret = parse6(skb, &p);
	node = tunnel_from_node(skb, &key);
	if (node < 0)
		/* Drop: no tunnel metadata (not from the VXLAN receive path). */
		return drop6(skb, &p, &d, REASON_MALFORMED);
	d.src_identity = key.tunnel_id; /* the claimed identity, for the event */
	if (!node)
		/* Drop: the outer source is not a node: the identity in its VNI is not
		 * believed. */
		return drop6(skb, &p, &d, REASON_TUNNEL_UNTRUSTED_SOURCE);
	if (ret != PARSE_IPV6)
		return tunnel_drop6_unparsed(skb, &p, &d, ret);
	tunnel_admit(skb, key.tunnel_id);
	return TC_ACT_OK;
}

#endif /* __RAMPART_TUNNEL6_H */
