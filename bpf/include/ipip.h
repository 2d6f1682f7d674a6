/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The IP-in-IP overlay (rampartd --tunnel=ipip): packets between pods of different nodes
 * travel in an outer IPv4 header (protocol 4) from node address to node address. The
 * programs encapsulate and decapsulate themselves (bpf_skb_adjust_room) on the node's
 * fabric interface(s), the ones its routes to the other nodes leave through; no kernel
 * tunnel device is involved, so the mode works on kernels built without the ipip driver
 * (CONFIG_NET_IPIP, as this project's machines are), and the routes are those of native
 * routing.
 *
 *   rampart_to_ipip   tc egress of a fabric interface: a packet to a remote pod (its
 *                     ipcache entry has a tunnel endpoint) gets an outer header to that
 *                     node; everything else leaves unchanged.
 *   rampart_from_ipip tc ingress of a fabric interface: a protocol-4 packet addressed to
 *                     this node is decapsulated only when its outer source is a known
 *                     node's address (ipcache identity remote-node) and its inner source
 *                     is not a pod of another node; anything else addressed here is
 *                     dropped (tunnel-untrusted-source, spoofed-source). Other packets
 *                     pass unchanged.
 *
 * IP-in-IP has no field for an identity (VXLAN has the VNI): the receiving node takes the
 * source's identity from its ipcache by the inner source address, as with native routing,
 * and only the outer-source check stands between a pod and an identity of its choice. A
 * pod cannot pass it: its own packets leave its veth only with its own address as source
 * (spoofed-source otherwise), which is not a node's. */
#ifndef __RAMPART_IPIP_H
#define __RAMPART_IPIP_H

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "events.h"
#include "tunnel.h"

#define IPIP_HLEN 20

/* ipip_local returns this node's fabric address for IP-in-IP (0: not configured). */
static __always_inline __be32 ipip_local(void)
{
	__u32 zero = 0;
	struct tunnel_config *cfg = bpf_map_lookup_elem(&tunnel, &zero);

	return cfg ? cfg->ipip_local : 0;
}

/* ip_csum folds the checksum of a 20-byte IPv4 header. */
static __always_inline __u16 ip_csum(struct iphdr *ip)
{
	__u32 sum = 0;
	__u16 *w = (__u16 *)ip;

#pragma unroll
	for (int i = 0; i < IPIP_HLEN / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum;
}

/* ipip_egress encapsulates a packet to a remote pod leaving through a fabric interface. */
static __always_inline int ipip_egress(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_EGRESS};
	struct ipcache_value *dst;
	struct iphdr inner, outer;
	struct pkt p = {};
	__be32 local;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	if (hdr_load(skb, ETH_HLEN, &inner) < 0 || inner.version != 4)
		return TC_ACT_OK; /* not an IPv4 packet this program could route: not its concern */
	dst = ipcache_value_of(inner.daddr);
	if (!dst || !dst->tunnel_endpoint)
		return TC_ACT_OK; /* not to a pod on another node: leaves as it is */
	local = ipip_local();
	if (!local) {
		/* Drop: the overlay is attached but this node's address is unknown (fail
		 * closed: a remote pod's packet never leaves without its outer header). */
		parse_packet(skb, &p);
		d.dst_identity = dst->identity;
		return drop(skb, &p, &d, REASON_TUNNEL_NO_ENDPOINT);
	}
	__builtin_memset(&outer, 0, sizeof(outer));
	outer.version = 4;
	outer.ihl = 5;
	outer.tos = inner.tos;
	/* A GSO packet's length is set per segment when it is segmented. */
	outer.tot_len = bpf_htons(bpf_ntohs(inner.tot_len) + IPIP_HLEN);
	outer.id = inner.id;
	outer.frag_off = inner.frag_off & bpf_htons(IP_DF); /* the inner packet's DF only */
	outer.ttl = TUNNEL_TTL;
	outer.protocol = IPPROTO_IPIP;
	outer.saddr = local;
	outer.daddr = dst->tunnel_endpoint;
	outer.check = ip_csum(&outer);
	/* FIXED_GSO: the pods' MTU leaves room for the outer header, so a GSO packet's
	 * segments fit the fabric as they are. */
	if (bpf_skb_adjust_room(skb, IPIP_HLEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_FIXED_GSO) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &outer, IPIP_HLEN, 0) < 0) {
		parse_packet(skb, &p);
		d.dst_identity = dst->identity;
		return drop(skb, &p, &d, REASON_MALFORMED);
	}
	return TC_ACT_OK;
}

/* ipip_ingress admits and decapsulates an IP-in-IP packet addressed to this node. */
static __always_inline int ipip_ingress(struct __sk_buff *skb)
{
	struct decision d = {.dir = DIR_INGRESS};
	struct peer_identity node, src;
	struct ipcache_value *srcv;
	struct iphdr outer;
	struct pkt p = {};
	__be32 local;
	int ret;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	if (hdr_load(skb, ETH_HLEN, &outer) < 0 || outer.version != 4 ||
	    outer.protocol != IPPROTO_IPIP)
		return TC_ACT_OK;
	local = ipip_local();
	if (!local || outer.daddr != local)
		return TC_ACT_OK; /* not addressed to this node's overlay: not ours to open */
	p.len = skb->len;
	/* Drop: outer header with options or fragmented (a node sends neither). */
	if (outer.ihl != 5 || (outer.frag_off & bpf_htons(IP_MF | IP_OFFMASK)))
		return drop(skb, &p, &d, REASON_MALFORMED);
	ret = parse_ipv4_at(skb, &p, ETH_HLEN + IPIP_HLEN);
	ipcache_resolve(p.t.saddr, &src);
	d.src_identity = src.identity; /* the identity the inner source would get */
	ipcache_resolve(outer.saddr, &node);
	if (node.identity != ID_REMOTE_NODE)
		/* Drop: the outer source is not a node (e.g. a pod sending its own IP-in-IP
		 * packets to choose the inner source address, and with it the identity). */
		return drop(skb, &p, &d, REASON_TUNNEL_UNTRUSTED_SOURCE);
	if (ret != PARSE_IPV4)
		return tunnel_drop_unparsed(skb, &p, &d, ret);
	srcv = ipcache_value_of(p.t.saddr);
	if (srcv && (srcv->ep_id || (srcv->tunnel_endpoint && srcv->tunnel_endpoint != outer.saddr)))
		/* Drop: a node sends the packets of its own pods only; a local endpoint's
		 * address or another node's pod's is not the sending node's to use. */
		return drop(skb, &p, &d, REASON_SPOOFED_SOURCE);
	/* The inner packet stays addressed to this node's MAC: the IP layer routes it to the
	 * endpoint, whose program resolves the source's identity by address. */
	if (bpf_skb_adjust_room(skb, -IPIP_HLEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_FIXED_GSO) < 0)
		return drop(skb, &p, &d, REASON_MALFORMED);
	return TC_ACT_OK;
}

#endif /* __RAMPART_IPIP_H */
