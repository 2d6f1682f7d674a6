// Experiment: the cost of an in-kernel verdict on request heads at the client's own
// socket (sockops puts the client's connections to the server port in a sockhash; an
// sk_msg program reads the start of each send and checks it against a literal rule).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "refuse.h"

/* Set at load: the server port whose connections are checked, and the network namespace
 * (its cookie) they are in: sockops on the cgroup root sees every namespace's sockets,
 * and another namespace may use the same port at the same time. */
volatile const __u32 server_port = 0;
volatile const __u64 netns_cookie = 0;

/* A connection, as both sockops and sk_msg programs see it (sk_msg programs cannot read
 * socket cookies). Ports as the context fields give them. */
struct conn_key {
	__u32 local_ip4;
	__u32 remote_ip4;
	__u32 local_port;
	__u32 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 4096);
	__type(key, struct conn_key);
	__type(value, __u64);
} clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline struct conn_key conn_key_of_ops(const struct bpf_sock_ops *skops)
{
	struct conn_key key = {
		.local_ip4 = skops->local_ip4,
		.remote_ip4 = skops->remote_ip4,
		.local_port = skops->local_port,
		.remote_port = skops->remote_port,
	};

	return key;
}

SEC("sockops")
int track(struct bpf_sock_ops *skops)
{
	struct conn_key key;

	if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB || bpf_get_netns_cookie(skops) != netns_cookie)
		return 1;
	if (bpf_ntohl(skops->remote_port) != server_port && skops->remote_port != bpf_htons(server_port))
		return 1;
	key = conn_key_of_ops(skops);
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



/* The refusal a send-side verdict would give: a request that is not GET /v1 becomes a
 * 403 response, delivered to the sending socket's own receive queue; the server never
 * sees it. A prototype: it assumes each request arrives in one send. */
SEC("sk_msg")
int request_or_refuse(struct sk_msg_md *msg)
{
	__u32 len = msg->size;
	struct conn_key key;
	char *p;

	if (len < 8)
		return SK_DROP;
	if (bpf_msg_pull_data(msg, 0, 8, 0))
		return SK_DROP;
	p = msg->data;
	if ((void *)(p + 8) > msg->data_end)
		return SK_DROP;
	if (p[0] == 'G' && p[1] == 'E' && p[2] == 'T' && p[3] == ' ' && p[4] == '/' && p[5] == 'v' &&
	    p[6] == '1' && (p[7] == ' ' || p[7] == '?'))
		return SK_PASS;
	key.local_ip4 = msg->local_ip4;
	key.remote_ip4 = msg->remote_ip4;
	key.local_port = msg->local_port;
	key.remote_port = msg->remote_port;
	return refuse_to_self(msg, &clients, &key);
}
/* What a real request verdict has to do before it can match: find the end of the head
 * (the head may come in several sends: cork until it is whole) and the method and path in
 * it, then compare the path with a literal rule. Counted like request. */
#define HEAD_MAX 1024

static const char rule_path[] = "/v1";

SEC("sk_msg")
int request_parsed(struct sk_msg_md *msg)
{
	__u32 size = msg->size, n, i, end = 0, sp1 = 0, sp2 = 0, k = 1;
	__u64 *c;
	char *p;

	n = size < HEAD_MAX ? size : HEAD_MAX;
	if (n < 4 || bpf_msg_pull_data(msg, 0, n, 0))
		return SK_DROP;
	p = msg->data;
	/* Three simple loops (each stops at its first match) rather than one loop that tracks
	 * everything: the verifier walks each iteration once. */
	for (i = 0; i < HEAD_MAX - 3; i++) {
		if ((void *)(p + i + 4) > msg->data_end)
			break;
		if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n') {
			end = i + 4;
			break;
		}
	}
	if (!end) {
		if (size >= HEAD_MAX)
			return SK_DROP; /* head too long */
		bpf_msg_cork_bytes(msg, size + 1);
		return SK_PASS;
	}
	for (i = 0; i < 16; i++) {
		if ((void *)(p + i + 1) > msg->data_end)
			break;
		if (p[i] == ' ') {
			sp1 = i;
			break;
		}
	}
	for (i = sp1 + 1; i < 512 && sp1; i++) {
		if ((void *)(p + i + 1) > msg->data_end)
			break;
		if (p[i] == ' ') {
			sp2 = i;
			break;
		}
	}
	if (sp1 && sp2 == sp1 + sizeof(rule_path)) {
		k = 0;
		for (i = 0; i < sizeof(rule_path) - 1; i++) {
			__u32 at = sp1 + 1 + i;

			if (at >= HEAD_MAX || (void *)(p + at + 1) > msg->data_end || p[at] != rule_path[i]) {
				k = 1;
				break;
			}
		}
	}
	c = bpf_map_lookup_elem(&counts, &k);
	if (c)
		(*c)++;
	/* The verdict covers this head; a body would be passed with bpf_msg_apply_bytes. */
	return SK_PASS;
}

/* The server side of a send-side design: what a response tracker would see of the
 * server's sends. servers holds the server's accepted sockets (track_servers); sent
 * counts bytes (0) and sends that start with an HTTP/1.x status line (1). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 4096);
	__type(key, struct conn_key);
	__type(value, __u64);
} servers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} sent SEC(".maps");

SEC("sockops")
int track_servers(struct bpf_sock_ops *skops)
{
	struct conn_key key;

	if (skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB || skops->local_port != server_port ||
	    bpf_get_netns_cookie(skops) != netns_cookie)
		return 1;
	key = conn_key_of_ops(skops);
	bpf_sock_hash_update(skops, &servers, &key, BPF_ANY);
	return 1;
}

SEC("sk_msg")
int response_seen(struct sk_msg_md *msg)
{
	__u32 k = 0;
	__u64 *c = bpf_map_lookup_elem(&sent, &k);
	char *p;

	if (c)
		*c += msg->size;
	if (msg->size < 9 || bpf_msg_pull_data(msg, 0, 9, 0))
		return SK_PASS;
	p = msg->data;
	if ((void *)(p + 9) > msg->data_end)
		return SK_PASS;
	if (p[0] == 'H' && p[1] == 'T' && p[2] == 'T' && p[3] == 'P' && p[4] == '/' && p[8] == ' ') {
		k = 1;
		c = bpf_map_lookup_elem(&sent, &k);
		if (c)
			(*c)++;
	}
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
