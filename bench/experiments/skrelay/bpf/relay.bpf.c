// In-kernel relay experiment: sk_skb programs move what one proxy socket receives
// out of its peer socket, so the relay process never touches the bytes.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} peers SEC(".maps");

SEC("sk_skb/stream_verdict")
int verdict(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	__u64 *peer = bpf_map_lookup_elem(&peers, &cookie);

	if (!peer)
		return SK_DROP;
	return bpf_sk_redirect_hash(skb, &socks, peer, 0);
}

char LICENSE[] SEC("license") = "GPL";
