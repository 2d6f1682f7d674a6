// SPDX-License-Identifier: GPL-2.0
/* The raw tc-eBPF peer of the egress filtering benchmark (bench/egress): one LPM trie of
 * IPv4 prefixes, looked up by each packet's destination on the client's egress; a hit is
 * dropped. It is the "plain tc-eBPF" filter of the benchmark the issue reproduces, written
 * as small as possible so that it measures what an LPM trie costs per packet and nothing
 * else: no conntrack, no identities, no events.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
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

SEC("tc")
int egress_lpm(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;

	/* Anything that is not a whole IPv4 header passes: the filter is for IPv4 lists. */
	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return TC_ACT_OK;

	struct lpm_key key = {.prefixlen = 32, .addr = ip->daddr};
	/* Drop path: the destination is inside a listed prefix. TC_ACT_SHOT (the benchmark
	 * this reproduces used TC_ACT_STOLEN; both free the packet, SHOT also counts it as a
	 * drop, which is what a filter should report). */
	if (bpf_map_lookup_elem(&deny, &key))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char __license[] SEC("license") = "GPL";
