/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The overlay: packets between pods of different nodes travel in VXLAN through the node's
 * collect_md ("external") VXLAN device, whose tunnel key the programs set and read per
 * packet. The VNI carries the sender's security identity (as in Cilium), so the receiving
 * node judges ingress policy on the identity the sending node gave the packet, without an
 * address lookup.
 *
 *   rampart_to_tunnel   tc egress of the VXLAN device: the node routes the other nodes'
 *                       pod CIDRs to the device; the program sets the tunnel key: the
 *                       destination's node address (ipcache tunnel_endpoint), or that
 *                       node's IPv6 fabric address where tunnel_remote6 has one, and, as
 *                       VNI, the source's identity.
 *   rampart_from_tunnel tc ingress of the VXLAN device: accepts only packets whose outer
 *                       source, IPv4 or IPv6, is a known node's address (ipcache identity
 *                       remote-node), and hands the VNI's identity to rampart_to_ep in
 *                       skb->mark.
 *
 * Why tc egress of the device and not a redirect from rampart_from_ep: the sender's egress
 * policy has already been applied at its veth when the packet reaches the device, and the
 * packets of established local flows (flow cache) keep their path unchanged: no tunnel
 * field is read for them. Only packets routed into the overlay pay its two lookups.
 *
 * Why skb->mark to pass the identity to rampart_to_ep, and not a per-CPU scratch map: the
 * mark travels with the packet from the device's ingress through forwarding to the
 * endpoint's veth in the same namespace, where a scratch slot could be left by a packet
 * dropped on the way and read for the next one. It cannot be forged: rampart_to_ep
 * believes it only for a packet the node received on the VXLAN device
 * (skb->ingress_ifindex, set by the kernel; tunnel_config), whose ingress program
 * overwrites every packet's mark; a pod's own packets enter the node namespace through its
 * veth, which clears the mark, and arrive with that veth as ingress interface.
 *
 * The mark's layout leaves alone the bits others give a meaning on the way to the endpoint:
 * bits 0 and 1 are the L7 proxy's (0x1 steer, 0x2 upstream, proxy.h), and bits 14 and 15
 * kube-proxy's (0x4000: masquerade this packet in POSTROUTING, 0x8000: drop it), which a
 * forwarded packet meets in the node's netfilter between the VXLAN device and the endpoint's
 * veth. With the identity simply shifted into them, a pod whose identity had bit 6 set was
 * masqueraded to the node's address and arrived as another identity. So: bits 2-5 hold
 * TUNNEL_MARK_MAGIC, bits 6-13 the identity's low byte, bits 16-31 its upper 16 bits: 24
 * bits, as wide as the VNI. */
#ifndef __RAMPART_TUNNEL_H
#define __RAMPART_TUNNEL_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "events.h"

#define TUNNEL_MARK_MAGIC 0x28u
#define TUNNEL_MARK_MASK 0xC03Fu /* the magic, and the bits that must be clear */

static __always_inline __u32 tunnel_mark(__u32 id)
{
	return (id & 0xFFu) << 6 | (id >> 8) << 16 | TUNNEL_MARK_MAGIC;
}

static __always_inline __u32 tunnel_mark_identity(__u32 mark)
{
	return (mark >> 6 & 0xFFu) | (mark >> 16) << 8;
}
#define TUNNEL_VNI_MAX 0xFFFFFFu
#define TUNNEL_TTL 64

#ifndef PACKET_HOST
#define PACKET_HOST 0
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tunnel_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tunnel SEC(".maps");

/* tunnel_remote6: the other nodes this node reaches over the IPv6 fabric (rampartd
 * --vxlan-underlay=ipv6, for the nodes that have an IPv6 fabric address), by their IPv4
 * node address; the agent writes it with the node routes. A node not in it is reached at
 * its IPv4 address. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAMPART_MAX_NODES);
	__type(key, __be32);
	__type(value, struct tunnel_addr6);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tunnel_remote6 SEC(".maps");

/* ipcache_value_of returns the ipcache entry of the longest prefix containing addr. */
static __always_inline struct ipcache_value *ipcache_value_of(__be32 addr)
{
	struct ipcache_key k;

	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = 32 + 32;
	k.family = RAMPART_FAMILY_V4;
	__builtin_memcpy(k.addr, &addr, 4);
	return bpf_map_lookup_elem(&ipcache, &k);
}

/* ipcache_value6_of: ipcache_value_of for an IPv6 address. */
static __always_inline struct ipcache_value *ipcache_value6_of(const __u8 *addr)
{
	struct ipcache_key k;

	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = 32 + 128;
	k.family = RAMPART_FAMILY_V6;
	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&ipcache, &k);
}

/* tunnel_key_to puts into key the outer destination for the node whose IPv4 address is
 * *node (network order, a map value's field: the lookup's key): its IPv6 fabric address
 * when tunnel_remote6 has it, else *node. It returns the flags for bpf_skb_set_tunnel_key.
 * Over IPv6 the UDP checksum stays: a receiver drops IPv6 UDP with a zero checksum unless
 * its socket allows it, which the collect_md devices' do not (udp6zerocsumrx off). */
static __always_inline __u64 tunnel_key_to(struct bpf_tunnel_key *key, const __be32 *node)
{
	const struct tunnel_addr6 *r6 = bpf_map_lookup_elem(&tunnel_remote6, node);

	if (r6) {
		__builtin_memcpy(key->remote_ipv6, r6->addr, sizeof(r6->addr));
		return BPF_F_TUNINFO_IPV6;
	}
	key->remote_ipv4 = bpf_ntohl(*node);
	return BPF_F_ZERO_CSUM_TX;
}

/* tunnel_from_node reads into key the tunnel key of a packet a collect_md VXLAN device
 * decapsulated and says whether its outer source is a node's fabric address, IPv4 or IPv6
 * (ipcache identity remote-node: 1; else 0), or that the packet has no tunnel metadata
 * (-1). The outer header's family is not in the skb, and the helper refuses (EPROTO) a key
 * of the family not asked for: IPv4 is asked first, so that the default underlay's packets
 * pay one call, then IPv6. Only the identity is read, not the CIDR sets (ipcache_resolve),
 * which mean nothing here and cost the programs most of their verification budget. */
static __always_inline int tunnel_from_node(struct __sk_buff *skb, struct bpf_tunnel_key *key)
{
	const struct ipcache_value *v;

	if (bpf_skb_get_tunnel_key(skb, key, sizeof(*key), 0) == 0)
		v = ipcache_value_of(bpf_htonl(key->remote_ipv4));
	else if (bpf_skb_get_tunnel_key(skb, key, sizeof(*key), BPF_F_TUNINFO_IPV6) == 0)
		v = ipcache_value6_of((const __u8 *)key->remote_ipv6);
	else
		return -1;
	return v && v->identity == ID_REMOTE_NODE;
}

/* tunnel_source gives a packet that entered the endpoint from the overlay the identity its
 * VNI carried (see the mark above): peer's identity is replaced, its address-derived CIDR
 * identities stay (ipBlock rules select addresses). Out of line and only for packets with
 * the mark's magic: local traffic pays one load and compare. */
static __noinline void tunnel_source_slow(struct __sk_buff *skb, struct peer_identity *peer,
					  struct decision *d)
{
	__u32 zero = 0;
	struct tunnel_config *cfg = bpf_map_lookup_elem(&tunnel, &zero);

	if (!cfg || !cfg->ifindex || skb->ingress_ifindex != cfg->ifindex)
		return; /* not received on the VXLAN device: the mark means nothing */
	peer->identity = tunnel_mark_identity(skb->mark);
	peer->ep_id = 0;
	d->ev_flags |= FLOW_F_TUNNEL;
}

static __always_inline void tunnel_source(struct __sk_buff *skb, struct peer_identity *peer,
					  struct decision *d)
{
	if (unlikely((skb->mark & TUNNEL_MARK_MASK) == TUNNEL_MARK_MAGIC))
		tunnel_source_slow(skb, peer, d);
}

/* tunnel_id_of is the identity the mark of a packet entering an endpoint says its VNI
 * carried, 0 without the mark's magic (pkt.tunnel_id). Unlike tunnel_source it does not
 * check where the packet was received: it only tells an established flow's packets apart
 * (conntrack.h), and a packet with another value than its flow was checked with is
 * checked again, by tunnel_source. The mark is set by the node only (see above). */
static __always_inline __u32 tunnel_id_of(struct __sk_buff *skb)
{
	__u32 mark = skb->mark;

	return unlikely((mark & TUNNEL_MARK_MASK) == TUNNEL_MARK_MAGIC) ? tunnel_mark_identity(mark) : 0;
}

/* tunnel_drop_unparsed drops a frame in the overlay that is neither a whole IPv4 packet nor
 * an IPv6 one (those take the overlay's IPv6 programs, tunnel6.h). */
static __always_inline int tunnel_drop_unparsed(struct __sk_buff *skb, struct pkt *p,
						struct decision *d, int ret)
{
	return drop(skb, p, d, ret == PARSE_MALFORMED ? REASON_MALFORMED : REASON_UNSUPPORTED_L3);
}

/* tunnel_vni is the identity a packet from the address whose ipcache entry is src carries
 * in its VNI: a local endpoint's (its veth let only its own address out), the host's (the
 * node itself; the receiver sees remote-node), else world: a packet the node forwards from
 * elsewhere claims nothing. */
static __always_inline __u32 tunnel_vni(const struct ipcache_value *src)
{
	if (src && (src->ep_id || src->identity == ID_HOST) && src->identity <= TUNNEL_VNI_MAX)
		return src->identity;
	return ID_WORLD;
}

/* tunnel_set_key sends the packet to the node that hosts dst with VNI id. */
static __always_inline int tunnel_set_key(struct __sk_buff *skb, const struct ipcache_value *dst,
					  __u32 id)
{
	struct bpf_tunnel_key key = {};
	__u64 flags = tunnel_key_to(&key, &dst->tunnel_endpoint);

	key.tunnel_id = id;
	key.tunnel_ttl = TUNNEL_TTL;
	return bpf_skb_set_tunnel_key(skb, &key, sizeof(key), flags);
}

/* tunnel_admit hands the identity the VNI carried (vni) to the endpoint's program in the
 * mark, and makes the inner frame this host's: it is addressed to the sending device's MAC
 * (the device does no ARP), and the IP layer must route it to the endpoint. */
static __always_inline void tunnel_admit(struct __sk_buff *skb, __u32 vni)
{
	__u32 id = vni;

	if (id == ID_HOST)
		id = ID_REMOTE_NODE; /* the sending node itself */
	else if (id == ID_UNKNOWN)
		id = ID_WORLD;
	skb->mark = tunnel_mark(id);
	bpf_skb_change_type(skb, PACKET_HOST);
}

/* tunnel_egress sets the tunnel key of a packet the node routed into the VXLAN device. */
static __always_inline int tunnel_egress(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_EGRESS};
	struct ipcache_value *dst;
	struct pkt p = {};
	__u32 id;
	int ret;

	ret = parse_packet(skb, &p);
	if (ret != PARSE_IPV4)
		return tunnel_drop_unparsed(skb, &p, &d, ret);
	dst = ipcache_value_of(p.t.daddr);
	if (!dst || !dst->tunnel_endpoint) {
		d.dst_identity = dst ? dst->identity : ID_WORLD;
		/* Drop: no known node hosts the destination (fail closed: never sent to a
		 * guessed node). */
		return drop(skb, &p, &d, REASON_TUNNEL_NO_ENDPOINT);
	}
	id = tunnel_vni(ipcache_value_of(p.t.saddr));
	if (tunnel_set_key(skb, dst, id) < 0) {
		d.src_identity = id;
		d.dst_identity = dst->identity;
		return drop(skb, &p, &d, REASON_MALFORMED);
	}
	return TC_ACT_OK;
}

/* tunnel_ingress admits a packet the VXLAN device decapsulated: from a known node only, with
 * the VNI's identity in its mark for rampart_to_ep. */
static __always_inline int tunnel_ingress(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_INGRESS};
	struct bpf_tunnel_key key = {};
	struct pkt p = {};
	int ret, node;

	ret = parse_packet(skb, &p);
	node = tunnel_from_node(skb, &key);
	if (node < 0)
		/* Drop: no tunnel metadata (not from the VXLAN receive path). */
		return drop(skb, &p, &d, REASON_MALFORMED);
	d.src_identity = key.tunnel_id; /* the claimed identity, for the event */
	if (!node)
		/* Drop: the outer source is not a node (e.g. a pod sending its own VXLAN
		 * packets): the identity it put in the VNI is not believed. */
		return drop(skb, &p, &d, REASON_TUNNEL_UNTRUSTED_SOURCE);
	if (ret != PARSE_IPV4)
		return tunnel_drop_unparsed(skb, &p, &d, ret);
	tunnel_admit(skb, key.tunnel_id);
	return TC_ACT_OK;
}

#endif /* __RAMPART_TUNNEL_H */
