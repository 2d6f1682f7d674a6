// Counts, per sending socket (its cookie; 0: none), the TCP packets to one port that cross
// the tc hook it is attached to: on an endpoint's host-side veth, it shows whether a
// program there can tell which socket in the endpoint sent a packet (TestSenderSocket).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* Set at load: the destination port (host order). */
volatile const __u32 port = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u64);
	__type(value, __u64);
} senders SEC(".maps");

SEC("tc")
int sender_socket(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp;
	__u64 cookie, one = 1, *n;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->protocol != IPPROTO_TCP)
		return TC_ACT_OK;
	tcp = (void *)ip + ip->ihl * 4;
	if ((void *)(tcp + 1) > end || tcp->dest != bpf_htons(port))
		return TC_ACT_OK;
	cookie = bpf_get_socket_cookie(skb);
	n = bpf_map_lookup_elem(&senders, &cookie);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&senders, &cookie, &one, BPF_NOEXIST);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
