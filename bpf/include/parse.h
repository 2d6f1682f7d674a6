/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: Ethernet, IPv4 (with options and fragments), TCP/UDP/SCTP ports, ICMP.
 *
 * Headers are copied to the stack by hdr_load: straight from the packet when they lie in
 * the linear part of the skb (nearly always: the sender's stack builds them there), else
 * with bpf_skb_load_bytes, which also reaches headers outside it (GRO packets on veth) and
 * fails instead of reading past the end of the packet. Every length used comes from the
 * packet and is checked against the IP total length and the skb length before use. */
#ifndef __RAMPART_PARSE_H
#define __RAMPART_PARSE_H

#include "common.h"

enum parse_result {
	PARSE_IPV4 = 0,
	PARSE_ARP,
	PARSE_IPV6,
	PARSE_OTHER_L3,
	PARSE_MALFORMED,
};

enum frag_kind {
	FRAG_NONE = 0,
	FRAG_FIRST, /* MF set, offset 0: carries the L4 header */
	FRAG_LATER, /* offset != 0: no L4 header */
};

enum icmp_kind {
	ICMP_K_NONE = 0, /* not ICMP */
	ICMP_K_ECHO,     /* echo request or reply: tracked by echo id */
	ICMP_K_ERROR,    /* error quoting another packet: related to that packet's flow */
	ICMP_K_OTHER,    /* anything else: stateless, policy per packet */
};

/* ICMP types (linux/icmp.h needs more kernel headers than this file wants). */
#define ICMP_T_ECHOREPLY 0
#define ICMP_T_DEST_UNREACH 3
#define ICMP_T_SOURCE_QUENCH 4
#define ICMP_T_REDIRECT 5
#define ICMP_T_ECHO 8
#define ICMP_T_TIME_EXCEEDED 11
#define ICMP_T_PARAMETERPROB 12

#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFMASK 0x1fff

#define TCP_F_FIN 0x01
#define TCP_F_SYN 0x02
#define TCP_F_RST 0x04
#define TCP_F_ACK 0x10

/* A 5-tuple in network byte order. For ICMP echo: request sport=id dport=0, reply sport=0
 * dport=id, so a reply's reversed tuple is its request's tuple (the same conntrack key, see
 * ct4_key) and a request in the other direction never looks like a reply. */
struct tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct pkt {
	struct tuple t;
	struct tuple inner; /* ICMP errors: the quoted packet's tuple (when inner_valid) */
	__u32 len;          /* skb->len, for counters and events */
	__be16 policy_port; /* destination port, or ICMP type, for the policy lookup */
	__u16 ip_id;
	__u8 frag;      /* enum frag_kind */
	__u8 tcp_flags; /* TCP_F_* */
	__u8 icmp_type;
	__u8 icmp_kind; /* enum icmp_kind */
	__u8 inner_valid;
	__u8 family; /* RAMPART_FAMILY_V4 once an IPv4 header (or an ARP frame) was read */
	__u8 arp_op; /* PARSE_ARP: the ARP opcode (t.saddr: sender IP, t.daddr: target IP) */
	__u8 icmp_code; /* for ICMP (tap rules match it) */
	/* Entering an endpoint from the overlay: the identity the VNI carried, as the mark of
	 * rampart_from_tunnel says (tunnel_id_of); else 0. Part of what an established flow's
	 * packets are checked against (conntrack.h), not parsed from the packet. */
	__u32 tunnel_id;
	/* The ipcache generation read before any of the packet's ipcache lookups (conntrack.h):
	 * what a conntrack or fragment entry recorded from them is recorded with it. */
	__u32 ipcache_gen;
};

/* Minimum L4 header sizes required to accept a packet (or a first fragment). */
#define TCP_MIN_HLEN 20
#define UDP_HLEN 8
#define SCTP_COMMON_HLEN 12
#define ICMP_HLEN 8

struct l4_ports {
	__be16 sport;
	__be16 dport;
};

/* The Ethernet header's type field, all the parser needs of it (struct ethhdr is packed,
 * so copying it would take byte loads). */
struct eth_type {
	__be16 proto;
};

struct icmp_head {
	__u8 type;
	__u8 code;
	__be16 csum;
	__be16 id;
	__be16 seq;
};

struct tcp_head {
	__be16 sport;
	__be16 dport;
	__be32 seq;
	__be32 ack;
	__u8 doff_res; /* data offset in the upper 4 bits */
	__u8 flags;
	__be16 window;
	__be16 csum;
	__be16 urg;
};

/* hdr_load copies the header *to (a struct, so its size is a compile-time constant) from
 * offset off of the packet to the stack. A direct read from the linear data avoids a
 * helper call per header, which is most of the parsing cost of a packet; off is bounded by
 * the caller (at most the Ethernet, IP and ICMP headers and a quoted IP header).
 *
 * The copy is a typed struct assignment, not a memcpy: clang knows nothing of a void
 * pointer's alignment and copies byte by byte (a 20-byte IP header became 60
 * instructions), where the struct's own alignment gives word loads. The packet's headers
 * may sit at any 2-byte boundary (an IP header follows a 14-byte Ethernet header); the
 * verifier only insists on aligned packet reads on architectures without efficient
 * unaligned access, which Rampart's targets (x86-64, arm64) are not. */
#define hdr_load(skb, off, to)                                                         \
	({                                                                             \
		void *data_ = (void *)(long)(skb)->data;                                \
		void *data_end_ = (void *)(long)(skb)->data_end;                        \
		__u32 off_ = (off);                                                    \
		int ret_ = 0;                                                          \
		if (off_ <= 256 && data_ + off_ + sizeof(*(to)) <= data_end_)          \
			*(to) = *(typeof(to))(data_ + off_);                           \
		else                                                                   \
			ret_ = bpf_skb_load_bytes(skb, off_, to, sizeof(*(to)));       \
		ret_;                                                                  \
	})

/* An ARP frame for IPv4 over Ethernet (RFC 826), all of it: 28 bytes. */
struct arp_ipv4 {
	__be16 hrd; /* hardware type: 1 (Ethernet) */
	__be16 pro; /* protocol type: ETH_P_IP */
	__u8 hln;   /* 6 */
	__u8 pln;   /* 4 */
	__be16 op;
	__u8 sha[6];
	__u8 spa[4]; /* sender protocol (IPv4) address */
	__u8 tha[6];
	__u8 tpa[4]; /* target protocol address */
};

#define ARP_HRD_ETHER 1
#define ARP_OP_REQUEST 1

/* parse_arp reads an ARP frame's sender and target IPv4 addresses into p (the sender's is
 * what anti-spoofing checks, see handle_unparsed in rampart.c). Anything but a whole
 * Ethernet/IPv4 ARP frame is malformed: Rampart has no use for other ARP and will not
 * pass what it cannot check. */
static __always_inline int parse_arp(struct __sk_buff *skb, struct pkt *p)
{
	struct arp_ipv4 arp;

	/* Drop: ARP frame truncated. */
	if (hdr_load(skb, ETH_HLEN, &arp) < 0)
		return PARSE_MALFORMED;
	/* Drop: ARP for another hardware or protocol type, or with other address sizes. */
	if (arp.hrd != bpf_htons(ARP_HRD_ETHER) || arp.pro != bpf_htons(ETH_P_IP) ||
	    arp.hln != 6 || arp.pln != 4)
		return PARSE_MALFORMED;
	__builtin_memcpy(&p->t.saddr, arp.spa, 4);
	__builtin_memcpy(&p->t.daddr, arp.tpa, 4);
	p->arp_op = (__u8)bpf_ntohs(arp.op);
	p->family = RAMPART_FAMILY_V4;
	return PARSE_ARP;
}

static __always_inline int is_icmp_error(__u8 type)
{
	return type == ICMP_T_DEST_UNREACH || type == ICMP_T_SOURCE_QUENCH ||
	       type == ICMP_T_REDIRECT || type == ICMP_T_TIME_EXCEEDED ||
	       type == ICMP_T_PARAMETERPROB;
}

/* parse_inner reads the packet quoted by an ICMP error at off (its IP header and the first
 * 8 bytes of its payload, RFC 792). A quote too short to give a tuple leaves inner_valid
 * at 0: the error is then treated as unrelated, never dropped as malformed, because routers
 * may quote less than we want. */
static __noinline void parse_inner(struct __sk_buff *skb, __u32 off, __u32 end,
					struct pkt *p)
{
	struct iphdr ip;
	__u32 hlen;

	if (off + sizeof(ip) > end)
		return;
	if (hdr_load(skb, off, &ip) < 0)
		return;
	if (ip.version != 4 || ip.ihl < 5)
		return;
	hlen = ip.ihl * 4;
	/* The quoted header must be a first (or only) fragment to carry ports. */
	if (bpf_ntohs(ip.frag_off) & IP_OFFMASK)
		return;
	p->inner.saddr = ip.saddr;
	p->inner.daddr = ip.daddr;
	p->inner.proto = ip.protocol;
	off += hlen;
	switch (ip.protocol) {
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
	case IPPROTO_ICMP: {
		struct icmp_head ih;

		if (off + sizeof(ih) > end)
			return;
		if (hdr_load(skb, off, &ih) < 0)
			return;
		if (ih.type == ICMP_T_ECHO) {
			p->inner.sport = ih.id;
		} else if (ih.type == ICMP_T_ECHOREPLY) {
			p->inner.dport = ih.id;
		} else {
			return; /* errors are not sent about errors or stateless ICMP */
		}
		break;
	}
	default:
		break; /* no ports: the tuple keeps 0/0 as for the flow itself */
	}
	p->inner_valid = 1;
}

/* parse_ports reads the ports of the TCP, UDP or SCTP header (proto) at off, l4len bytes
 * before the end of the datagram, into *ports and, for TCP, its flags into *tcp_flags.
 * Returns -1 when the header is malformed. The IPv6 path's (ipv6.h); parse_l4 keeps its
 * own copy of these checks, written per protocol: through this function the IPv4 programs
 * cost the verifier 11,000 more instructions, of a budget they mostly use. */
static __always_inline int parse_ports(struct __sk_buff *skb, __u32 off, __u32 l4len, __u8 proto,
				       struct l4_ports *ports, __u8 *tcp_flags)
{
	if (proto == IPPROTO_TCP) {
		struct tcp_head th;

		/* Drop: TCP header (20 bytes, or data offset) beyond the datagram. */
		if (l4len < TCP_MIN_HLEN || hdr_load(skb, off, &th) < 0)
			return -1;
		if ((th.doff_res >> 4) < 5 || (__u32)(th.doff_res >> 4) * 4 > l4len)
			return -1;
		ports->sport = th.sport;
		ports->dport = th.dport;
		*tcp_flags = th.flags;
		return 0;
	}
	/* Drop: UDP header or SCTP common header beyond the datagram. */
	if (l4len < (proto == IPPROTO_UDP ? UDP_HLEN : SCTP_COMMON_HLEN))
		return -1;
	return hdr_load(skb, off, ports) < 0 ? -1 : 0;
}

/* parse_l4 fills ports, TCP flags and ICMP details of a non-fragment or first fragment.
 * off is the L4 offset and end the end of the IP datagram (both already checked against
 * skb->len). */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 off, __u32 end, struct pkt *p)
{
	__u32 l4len = end - off;

	switch (p->t.proto) {
	case IPPROTO_TCP: {
		struct tcp_head th;

		/* Drop: TCP header (20 bytes, or data offset) beyond the datagram. */
		if (l4len < TCP_MIN_HLEN)
			return PARSE_MALFORMED;
		if (hdr_load(skb, off, &th) < 0)
			return PARSE_MALFORMED;
		if ((th.doff_res >> 4) < 5 || (__u32)(th.doff_res >> 4) * 4 > l4len)
			return PARSE_MALFORMED;
		p->t.sport = th.sport;
		p->t.dport = th.dport;
		p->policy_port = th.dport;
		p->tcp_flags = th.flags;
		return PARSE_IPV4;
	}
	case IPPROTO_UDP:
	case IPPROTO_SCTP: {
		struct l4_ports ports;

		/* Drop: UDP header or SCTP common header beyond the datagram. */
		if (l4len < (p->t.proto == IPPROTO_UDP ? UDP_HLEN : SCTP_COMMON_HLEN))
			return PARSE_MALFORMED;
		if (hdr_load(skb, off, &ports) < 0)
			return PARSE_MALFORMED;
		p->t.sport = ports.sport;
		p->t.dport = ports.dport;
		p->policy_port = ports.dport;
		return PARSE_IPV4;
	}
	case IPPROTO_ICMP: {
		struct icmp_head ih;

		/* Drop: ICMP header beyond the datagram. */
		if (l4len < ICMP_HLEN)
			return PARSE_MALFORMED;
		if (hdr_load(skb, off, &ih) < 0)
			return PARSE_MALFORMED;
		p->icmp_type = ih.type;
		p->icmp_code = ih.code;
		p->policy_port = bpf_htons((__u16)ih.type);
		if (ih.type == ICMP_T_ECHO) {
			p->icmp_kind = ICMP_K_ECHO;
			p->t.sport = ih.id;
		} else if (ih.type == ICMP_T_ECHOREPLY) {
			p->icmp_kind = ICMP_K_ECHO;
			p->t.dport = ih.id;
		} else if (is_icmp_error(ih.type)) {
			p->icmp_kind = ICMP_K_ERROR;
			parse_inner(skb, off + ICMP_HLEN, end, p);
		} else {
			p->icmp_kind = ICMP_K_OTHER;
		}
		return PARSE_IPV4;
	}
	default:
		/* Other protocols have no ports: policy port 0, tuple ports 0. */
		return PARSE_IPV4;
	}
}

/* parse_ipv4_at fills p from the IPv4 header at offset l3 (ETH_HLEN, or past an outer
 * header) and what follows it. l3 is a compile-time constant at every call. */
static __always_inline int parse_ipv4_at(struct __sk_buff *skb, struct pkt *p, const __u32 l3)
{
	struct iphdr ip;
	__u32 hlen, tot, off, end;
	__u16 frag_off;

	/* Drop: IPv4 header truncated. */
	if (hdr_load(skb, l3, &ip) < 0)
		return PARSE_MALFORMED;
	/* Drop: not version 4, or header length below the 20-byte minimum. */
	if (ip.version != 4 || ip.ihl < 5)
		return PARSE_MALFORMED;
	hlen = ip.ihl * 4;
	tot = bpf_ntohs(ip.tot_len);
	/* Drop: total length shorter than the header (options included), or longer than what
	 * was received (truncated datagram). Trailing bytes after tot_len (Ethernet padding)
	 * are fine. */
	if (tot < hlen || (__u64)l3 + tot > skb->len)
		return PARSE_MALFORMED;

	p->family = RAMPART_FAMILY_V4;
	p->t.saddr = ip.saddr;
	p->t.daddr = ip.daddr;
	p->t.proto = ip.protocol;
	p->ip_id = bpf_ntohs(ip.id);

	frag_off = bpf_ntohs(ip.frag_off);
	if (frag_off & IP_OFFMASK) {
		/* Later fragment: no L4 header; the verdict comes from the first fragment. */
		p->frag = FRAG_LATER;
		return PARSE_IPV4;
	}
	if (frag_off & IP_MF)
		p->frag = FRAG_FIRST;

	off = l3 + hlen;
	end = l3 + tot;
	return parse_l4(skb, off, end, p);
}

/* parse_packet classifies the frame and, for IPv4, fills p. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct pkt *p)
{
	struct eth_type eth;

	p->len = skb->len;
	/* Drop: shorter than an Ethernet header (the type field is its last two bytes). */
	if (hdr_load(skb, ETH_HLEN - sizeof(eth), &eth) < 0)
		return PARSE_MALFORMED;
	switch (eth.proto) {
	case bpf_htons(ETH_P_IP):
		break;
	case bpf_htons(ETH_P_ARP):
		return parse_arp(skb, p);
	case bpf_htons(ETH_P_IPV6):
		return PARSE_IPV6;
	default:
		return PARSE_OTHER_L3;
	}
	return parse_ipv4_at(skb, p, ETH_HLEN);
}

#endif /* __RAMPART_PARSE_H */
