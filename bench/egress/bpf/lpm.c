// SPDX-License-Identifier: GPL-2.0
/* The raw tc-eBPF peer of the egress filtering benchmark (bench/egress): one LPM trie of
 * IPv4 prefixes (egress_lpm) or, in a run over IPv6, of IPv6 prefixes (egress_lpm6), looked
 * up by each packet's destination on the client's egress; a hit is dropped. It is the "plain tc-eBPF" filter of the benchmark the issue reproduces, written
 * as small as possible so that it measures what an LPM trie costs per packet and nothing
 * else: no conntrack, no identities, no events.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* struct lpm_key is the trie's key: the prefix length in bits, then the IPv4 address in
 * network byte order (the layout the kernel's LPM trie expects). */
struct lpm_key {
	__u32 prefixlen;
	__u32 addr;
};

/* max_entries is a placeholder: the loader sizes the map to the list it loads. The kernel
 * allocates trie nodes on insert (BPF_F_NO_PREALLOC is mandatory for LPM tries). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lpm_key);
	__type(value, __u8);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} deny SEC(".maps");

/* l3 returns the network header after the Ethernet header when the frame carries proto
 * and the whole fixed header of len bytes is there, else NULL: anything else passes. */
static __always_inline void *l3(struct __sk_buff *skb, __u16 proto, __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(proto))
		return NULL;
	if ((void *)(eth + 1) + len > data_end)
		return NULL;
	return eth + 1;
}

SEC("tc")
int egress_lpm(struct __sk_buff *skb)
{
	struct iphdr *ip = l3(skb, ETH_P_IP, sizeof(*ip));

	if (!ip)
		return TC_ACT_OK;
	struct lpm_key key = {.prefixlen = 32, .addr = ip->daddr};
	/* Drop path: the destination is inside a listed prefix. TC_ACT_SHOT (the benchmark
	 * this reproduces used TC_ACT_STOLEN; both free the packet, SHOT also counts it as a
	 * drop, which is what a filter should report). */
	if (bpf_map_lookup_elem(&deny, &key))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* struct lpm6_key is the IPv6 trie's key: the prefix length, then the address as in the
 * packet. */
struct lpm6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* Sized by the loader as deny is. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct lpm6_key);
	__type(value, __u8);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} deny6 SEC(".maps");

/* egress_lpm6 is egress_lpm for IPv6: the destination of the fixed header (a list of
 * destinations needs no extension header walk), the same drop. */
SEC("tc")
int egress_lpm6(struct __sk_buff *skb)
{
	struct ipv6hdr *ip6 = l3(skb, ETH_P_IPV6, sizeof(*ip6));

	if (!ip6)
		return TC_ACT_OK;
	struct lpm6_key key = {.prefixlen = 128};
	__builtin_memcpy(key.addr, &ip6->daddr, sizeof(key.addr));
	if (bpf_map_lookup_elem(&deny6, &key))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char __license[] SEC("license") = "GPL";
