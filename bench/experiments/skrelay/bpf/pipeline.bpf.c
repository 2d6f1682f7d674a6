// Prototype of the send-side design's refusal order (docs/design-l7-send-side.md, piece
// 4): a 403 may go into the client's receive queue only when every earlier request has
// its whole response at the client and the client has read it all; otherwise the refused
// send fails and the connection is the client's to close. One request per send, bodiless
// requests, responses with a Content-Length in one send (what TestRefusalOrder uses).
// Built against the kernel's BTF (vmlinux.h) for struct tcp_sock.
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "refuse.h"

#define HEAD_MAX 512

/* Set at load: the server port and its network namespace's cookie (see msg.bpf.c). */
volatile const __u32 server_port = 0;
volatile const __u64 netns_cookie = 0;

/* A connection from the client's side: client address and port, server address and port,
 * ports as the context fields give them. */
struct conn_key {
	__u32 client_ip4;
	__u32 server_ip4;
	__u32 client_port;
	__u32 server_port;
};

struct pair {
	__u64 passed;       /* requests the verdict let through */
	__u64 done;         /* responses the server sent whole */
	__u64 server_bytes; /* bytes the server sent */
	__u64 lost;         /* a response the tracker could not follow */
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 256);
	__type(key, struct conn_key);
	__type(value, __u64);
} clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 256);
	__type(key, struct conn_key);
	__type(value, __u64);
} servers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct conn_key);
	__type(value, struct pair);
} pairs SEC(".maps");

/* Verdicts given: 0 passed, 1 refused with a 403, 2 refused by failing the send. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, __u64);
} verdicts SEC(".maps");

static __always_inline void count(__u32 k)
{
	__u64 *c = bpf_map_lookup_elem(&verdicts, &k);

	if (c)
		__sync_fetch_and_add(c, 1);
}

SEC("sockops")
int track(struct bpf_sock_ops *skops)
{
	struct conn_key key = {};
	struct pair zero = {};

	if (bpf_get_netns_cookie(skops) != netns_cookie)
		return 1;
	if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB &&
	    bpf_ntohl(skops->remote_port) == server_port) {
		key.client_ip4 = skops->local_ip4;
		key.server_ip4 = skops->remote_ip4;
		key.client_port = skops->local_port;
		key.server_port = bpf_ntohl(skops->remote_port);
		bpf_map_update_elem(&pairs, &key, &zero, BPF_NOEXIST);
		bpf_sock_hash_update(skops, &clients, &key, BPF_ANY);
	} else if (skops->op == BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB && skops->local_port == server_port) {
		key.client_ip4 = skops->remote_ip4;
		key.server_ip4 = skops->local_ip4;
		key.client_port = bpf_ntohl(skops->remote_port);
		key.server_port = skops->local_port;
		bpf_sock_hash_update(skops, &servers, &key, BPF_ANY);
	}
	return 1;
}

SEC("sk_msg")
int request_in_order(struct sk_msg_md *msg)
{
	__u32 len = msg->size;
	struct conn_key key = {
		.client_ip4 = msg->local_ip4,
		.server_ip4 = msg->remote_ip4,
		.client_port = msg->local_port,
		.server_port = bpf_ntohl(msg->remote_port),
	};
	struct bpf_sock *sk = msg->sk;
	struct tcp_sock *tp;
	struct pair *pr;
	char *p;

	pr = bpf_map_lookup_elem(&pairs, &key);
	if (!pr || len < 8 || !sk || bpf_msg_pull_data(msg, 0, 8, 0))
		return SK_DROP;
	p = msg->data;
	if ((void *)(p + 8) > msg->data_end)
		return SK_DROP;
	if (p[0] == 'G' && p[1] == 'E' && p[2] == 'T' && p[3] == ' ' && p[4] == '/' && p[5] == 'v' &&
	    p[6] == '1' && p[7] == ' ') {
		__sync_fetch_and_add(&pr->passed, 1);
		count(0);
		return SK_PASS;
	}
	/* Refused. In order only if every earlier response is whole at the client and read. */
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp || pr->lost || pr->done != pr->passed || tp->bytes_received != pr->server_bytes ||
	    tp->copied_seq != tp->rcv_nxt) {
		count(2);
		return SK_DROP;
	}
	count(1);
	return refuse_to_self(msg, &clients, &key);
}

/* digits reads a decimal number at p (at most 7 digits) */
static __always_inline __u32 digits(const char *p, const void *end)
{
	__u32 v = 0;

	for (int i = 0; i < 7; i++) {
		if ((void *)(p + i + 1) > end || p[i] < '0' || p[i] > '9')
			break;
		v = v * 10 + (p[i] - '0');
	}
	return v;
}

/* Scratch for response_tracker: what its loops found goes through memory, so that the
 * verifier does not walk the second loop once for every place the first one stopped. */
struct tracker_scratch {
	__u32 head;    /* length of the response head, 0: not found */
	__u32 cl;      /* Content-Length */
	__u32 have_cl; /* a Content-Length header was found */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tracker_scratch);
} scratch SEC(".maps");

SEC("sk_msg")
int response_tracker(struct sk_msg_md *msg)
{
	__u32 len = msg->size, n, i, zero = 0;
	struct tracker_scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	struct conn_key key = {
		.client_ip4 = msg->remote_ip4,
		.server_ip4 = msg->local_ip4,
		.client_port = bpf_ntohl(msg->remote_port),
		.server_port = msg->local_port,
	};
	struct pair *pr = bpf_map_lookup_elem(&pairs, &key);
	void *end;
	char *p;

	if (!pr || !sc)
		return SK_PASS;
	sc->head = sc->cl = sc->have_cl = 0;
	__sync_fetch_and_add(&pr->server_bytes, len);
	n = len < HEAD_MAX ? len : HEAD_MAX;
	if (n < 16 || bpf_msg_pull_data(msg, 0, n, 0)) {
		pr->lost = 1;
		return SK_PASS;
	}
	p = msg->data;
	end = msg->data_end;
	if ((void *)(p + 16) > end || p[0] != 'H') {
		pr->lost = 1;
		return SK_PASS;
	}
	for (i = 0; i < HEAD_MAX - 3; i++) {
		if ((void *)(p + i + 4) > end)
			break;
		if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n') {
			sc->head = i + 4;
			break;
		}
	}
	for (i = 0; i < HEAD_MAX - 24; i++) {
		if ((void *)(p + i + 24) > end)
			break;
		if (p[i] == '\n' && (p[i + 1] | 0x20) == 'c' && (p[i + 9] | 0x20) == 'l' && p[i + 15] == ':') {
			sc->cl = digits(p + i + 17, end);
			sc->have_cl = i < sc->head;
			break;
		}
	}
	if (sc->head && sc->have_cl && len == sc->head + sc->cl)
		__sync_fetch_and_add(&pr->done, 1);
	else
		pr->lost = 1;
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
