// Experiment: the cost of an in-kernel verdict on request heads at the client's own
// socket (sockops puts the client's connections to the server port in a sockhash; an
// sk_msg program reads the start of each send and checks it against a literal rule).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Set at load: the server port whose connections are checked. */
volatile const __u32 server_port = 0;

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

SEC("sockops")
int track(struct bpf_sock_ops *skops)
{
	__u64 key;

	if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB)
		return 1;
	if (bpf_ntohl(skops->remote_port) != server_port && skops->remote_port != bpf_htons(server_port))
		return 1;
	key = bpf_get_socket_cookie(skops);
	bpf_sock_hash_update(skops, &clients, &key, BPF_ANY);
	return 1;
}

SEC("sk_msg")
int request(struct sk_msg_md *msg)
{
	char *p = msg->data;
	__u32 k = 1;
	__u64 *c;

	if ((void *)(p + 8) > msg->data_end)
		bpf_msg_pull_data(msg, 0, 8, 0);
	p = msg->data;
	if ((void *)(p + 8) > msg->data_end)
		return SK_PASS;
	if (p[0] == 'G' && p[1] == 'E' && p[2] == 'T' && p[3] == ' ' && p[4] == '/' && p[5] == 'v' &&
	    p[6] == '1' && (p[7] == ' ' || p[7] == '?'))
		k = 0;
	c = bpf_map_lookup_elem(&counts, &k);
	if (c)
		(*c)++;
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
