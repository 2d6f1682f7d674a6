/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The send-side L7 verdict (docs/design-l7-send-side.md): HTTP/1.1 requests between two
 * local endpoints are checked on the client's own socket as they are sent, and allowed
 * ones go straight to the server, with no proxy hop.
 *
 *   - sv_sockops (cgroup sockops, on the cgroup root): a connection whose two ends the agent
 *     listed in sv_targets gets a state entry, its client socket goes into sv_clients and
 *     its server socket into sv_servers, and tc learns the client socket's cookie
 *     (sv_flows) only once it is in the sockhash, so that a socket the verdict does not see
 *     cannot send data on the flow.
 *   - sv_request (sk_msg on sv_clients): parses each request head, in the same conservative
 *     HTTP/1.1 subset as the agent's fast path (internal/proxy/http1), and matches it
 *     against the rule tables the agent compiled (internal/l7table). Allowed: passed, its
 *     body after it (bpf_msg_apply_bytes). Refused: the message becomes a 403 in the
 *     client's own receive queue, provided every earlier response has arrived whole and
 *     been read; otherwise the send fails. Outside the subset: 400, and every later send
 *     on the connection fails (there is no proxy to hand it to halfway through).
 *   - sv_response (sk_msg on sv_servers): follows the server's responses (status line,
 *     Content-Length) to count the whole ones, which orders refusals, and reports each
 *     request with its status and latency.
 *
 * Fail closed: a send on a listed connection with no state, no table, or a head that
 * cannot be read is refused. */
#include <linux/bpf.h>

/* The fields of the kernel's tcp_sock the verdict reads, relocated against the running
 * kernel's BTF at load (CO-RE). */
struct tcp_sock {
	__u32 rcv_nxt;
	__u32 copied_seq;
	__u64 bytes_received;
} __attribute__((preserve_access_index));

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "sockverdict.h"

/* The maps that hold state are pinned by name beside the dataplane's (sv_flows is the
 * dataplane's own), so that the verdict goes on while the agent restarts, and a
 * restarted agent finds its tables. */
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sv_target_key);
	__type(value, struct sv_target);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SV_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * SV_SLOTS);
	__type(key, __u32);
	__type(value, struct sv_table);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct sv_path_key);
	__type(value, struct sv_masks);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_paths SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sv_header_key);
	__type(value, struct sv_header_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_headers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sv_host_key);
	__type(value, struct sv_masks);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_hosts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SV_CONNS_MAX);
	__type(key, struct sv_conn_key);
	__type(value, struct sv_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, SV_CONNS_MAX);
	__type(key, struct sv_conn_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_clients SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, SV_CONNS_MAX);
	__type(key, struct sv_conn_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_servers SEC(".maps");


#define SV_EVENTS_BYTES (1 << 20)
#define SV_EVENTS_WAKE (SV_EVENTS_BYTES / 4)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SV_EVENTS_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_events SEC(".maps");

/* For bpf2go: the event type is only reserved, never declared as a variable. */
const struct sv_event *unused_sv_event __attribute__((unused));

/* Counters by SV_V_* verdict, and [4] events lost to a full ring. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_counts SEC(".maps");

/* ---- connections ---- */

static __always_inline void count(__u32 k)
{
	__u64 *c = bpf_map_lookup_elem(&sv_counts, &k);

	if (c)
		*c += 1;
}

SEC("sockops")
int sv_sockops(struct bpf_sock_ops *skops)
{
	struct sv_target_key tk = {};
	struct sv_conn_key ck = {};
	struct sv_flow_key fk = {};
	struct sv_target *t;
	__u64 cookie;

	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		tk.port = bpf_ntohl(skops->remote_port);
		tk.side = SV_SIDE_CLIENT;
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		tk.port = skops->local_port;
		tk.side = SV_SIDE_SERVER;
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] != BPF_TCP_CLOSE)
			return 1;
		/* The client's socket closed: its state and its tc pin go (the sockhashes
		 * drop closed sockets themselves). */
		ck.client_ip4 = skops->local_ip4;
		ck.server_ip4 = skops->remote_ip4;
		ck.client_port = skops->local_port;
		ck.server_port = bpf_ntohl(skops->remote_port);
		bpf_map_delete_elem(&sv_conns, &ck);
		fk.saddr = skops->local_ip4;
		fk.daddr = skops->remote_ip4;
		fk.sport = bpf_htons(skops->local_port);
		fk.dport = (__u16)(skops->remote_port >> 16);
		bpf_map_delete_elem(&sv_flows, &fk);
		return 1;
	default:
		return 1;
	}
	/* IPv4, also on a dual-stack IPv6 socket (a server listening on [::] accepts IPv4
	 * connections on such sockets), whose IPv4 addresses the context has too. */
	if (skops->family == 10 /* AF_INET6 */) {
		if (skops->local_ip6[0] || skops->local_ip6[1] || skops->local_ip6[2] != bpf_htonl(0xffff) ||
		    skops->remote_ip6[0] || skops->remote_ip6[1] || skops->remote_ip6[2] != bpf_htonl(0xffff))
			return 1;
	} else if (skops->family != 2 /* AF_INET */) {
		return 1;
	}
	tk.netns_cookie = bpf_get_netns_cookie(skops);
	tk.local_ip4 = skops->local_ip4;
	tk.remote_ip4 = skops->remote_ip4;
	t = bpf_map_lookup_elem(&sv_targets, &tk);
	if (!t)
		return 1;
	if (tk.side == SV_SIDE_SERVER) {
		ck.client_ip4 = skops->remote_ip4;
		ck.server_ip4 = skops->local_ip4;
		ck.client_port = bpf_ntohl(skops->remote_port);
		ck.server_port = skops->local_port;
		/* The server sends nothing before this returns, so the tracker sees every
		 * response from here on. */
		if (bpf_sock_hash_update(skops, &sv_servers, &ck, BPF_ANY) == 0) {
			struct sv_conn *c = bpf_map_lookup_elem(&sv_conns, &ck);

			if (c)
				__sync_fetch_and_and(&c->flags, ~SV_C_NO_TRACKER);
		}
		return 1;
	}
	{
		struct sv_conn c = {.slot = t->slot, .flags = SV_C_NO_TRACKER, .method = SV_METHODS};

		ck.client_ip4 = skops->local_ip4;
		ck.server_ip4 = skops->remote_ip4;
		ck.client_port = skops->local_port;
		ck.server_port = tk.port;
		if (bpf_map_update_elem(&sv_conns, &ck, &c, BPF_ANY))
			return 1; /* no state: tc finds no pin and drops the flow's data */
	}
	if (bpf_sock_hash_update(skops, &sv_clients, &ck, BPF_ANY)) {
		bpf_map_delete_elem(&sv_conns, &ck);
		return 1;
	}
	bpf_sock_ops_cb_flags_set(skops, BPF_SOCK_OPS_STATE_CB_FLAG);
	cookie = bpf_get_socket_cookie(skops);
	fk.saddr = skops->local_ip4;
	fk.daddr = skops->remote_ip4;
	fk.sport = bpf_htons(skops->local_port);
	fk.dport = (__u16)(skops->remote_port >> 16);
	bpf_map_update_elem(&sv_flows, &fk, &cookie, BPF_ANY);
	return 1;
}

/* ---- the request parser ---- */

/* Header names the verdict cares about. */
#define H_OTHER 0
#define H_HOST 1
#define H_CONTENT_LENGTH 2
#define H_CONNECTION 3
#define H_REFUSED 4 /* outside the subset: transfer-encoding, upgrade, expect, ... */

enum {
	S_METHOD,
	S_TARGET,
	S_PATH,
	S_QUERY,
	S_VERSION,
	S_LINE,
	S_NAME,
	S_VALUE,
	S_VALUE_LF,
	S_END_LF,
};

struct sv_parse {
	__u32 n;     /* bytes of buf to read */
	__u32 state;
	__u32 bad;   /* outside the subset */
	__u32 head;  /* length of the head, once its end was found */
	__u32 sp1;   /* the request line's first space */
	__u32 path_end;
	__u32 seg_len;  /* length of the current path segment */
	__u32 seg_dots; /* it is all dots so far */
	__u32 line;     /* start of the current header line */
	__u32 name;     /* H_* of the current header */
	__u32 value;    /* start of its value (0: not started) */
	__u32 value_end;
	__u32 cl_digits;
	__u32 seen;     /* H_* bits seen */
	__u32 host, host_end;
	__u32 conn_close;
	__u32 colon;       /* the current header line's ':' */
	__u32 table;       /* the connection's rule table, for header lookups */
	__u32 has_headers; /* it has header matches */
	__u64 cl;
	__u64 seen_reqs[2];   /* header requirements met by some line, per side */
	__u64 broken_reqs[2]; /* value requirements a line of their name broke */
	struct sv_header_key hkey;
	char buf[SV_HEAD_MAX + 8]; /* + 8: a word read at any index stays inside */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sv_parse);
} sv_scratch SEC(".maps");

static __always_inline char lower(char c)
{
	return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}

/* name_is compares the header name at ps->line (length len) with lower-case want. */
static __always_inline int name_is(const struct sv_parse *ps, __u32 len, const char *want, __u32 wlen)
{
	if (len != wlen)
		return 0;
	for (__u32 j = 0; j < 17 && j < wlen; j++)
		if (lower(ps->buf[(ps->line + j) & (SV_HEAD_MAX - 1)]) != want[j])
			return 0;
	return 1;
}

static __always_inline __u32 classify(const struct sv_parse *ps, __u32 len)
{
	if (name_is(ps, len, "host", 4))
		return H_HOST;
	if (name_is(ps, len, "content-length", 14))
		return H_CONTENT_LENGTH;
	if (name_is(ps, len, "connection", 10))
		return H_CONNECTION;
	if (name_is(ps, len, "transfer-encoding", 17) || name_is(ps, len, "upgrade", 7) ||
	    name_is(ps, len, "expect", 6) || name_is(ps, len, "http2-settings", 14) || name_is(ps, len, "te", 2) ||
	    name_is(ps, len, "x-forwarded-for", 15) || name_is(ps, len, "x-forwarded-proto", 17))
		return H_REFUSED;
	return H_OTHER;
}

static __always_inline int value_is(const struct sv_parse *ps, const char *want, __u32 wlen)
{
	if (ps->value_end - ps->value != wlen)
		return 0;
	for (__u32 j = 0; j < 10 && j < wlen; j++)
		if (lower(ps->buf[(ps->value + j) & (SV_HEAD_MAX - 1)]) != want[j])
			return 0;
	return 1;
}

static const char version[16] = " HTTP/1.1\r\n";

/* header_lookup looks the current header line up in the table's header matches: its
 * name's entry (presence requirements, and the name's value requirements, which this line
 * breaks unless its value meets them), then its name and value. */
static __always_inline void header_lookup(struct sv_parse *ps)
{
	struct sv_header_key *k = &ps->hkey;
	__u32 nlen = ps->colon - ps->line, vlen;
	struct sv_header_val *v;
	__u64 met[2], values[2];

	if (nlen >= SV_HDR_NAME)
		return; /* longer than any rule's header name */
	__builtin_memset(k, 0, sizeof(*k));
	k->table = ps->table;
	k->presence = 1;
	for (__u32 j = 0; j < SV_HDR_NAME - 1; j++) {
		if (j >= nlen)
			break;
		k->name[j] = lower(ps->buf[(ps->line + j) & (SV_HEAD_MAX - 1)]);
	}
	v = bpf_map_lookup_elem(&sv_headers, k);
	if (!v)
		return;
	met[0] = v->reqs.m[0];
	met[1] = v->reqs.m[1];
	values[0] = v->value_reqs.m[0];
	values[1] = v->value_reqs.m[1];
	vlen = ps->value ? ps->value_end - ps->value : 0;
	if (vlen && vlen < SV_HDR_VALUE) {
		k->presence = 0;
		bpf_probe_read_kernel(k->value, vlen & (SV_HDR_VALUE - 1), &ps->buf[ps->value & (SV_HEAD_MAX - 1)]);
		v = bpf_map_lookup_elem(&sv_headers, k);
		if (v) {
			met[0] |= v->reqs.m[0];
			met[1] |= v->reqs.m[1];
		}
	}
	ps->seen_reqs[0] |= met[0];
	ps->seen_reqs[1] |= met[1];
	ps->broken_reqs[0] |= values[0] & ~met[0];
	ps->broken_reqs[1] |= values[1] & ~met[1];
}

/* end_line finishes a header line: duplicates and values of the headers that matter. */
static __always_inline int end_line(struct sv_parse *ps)
{
	__u32 bit = 1 << ps->name;

	if (ps->has_headers && ps->name != H_REFUSED)
		header_lookup(ps);
	if (ps->name == H_OTHER)
		return 0;
	if (ps->name == H_REFUSED || (ps->seen & bit))
		return 1;
	ps->seen |= bit;
	switch (ps->name) {
	case H_HOST:
		if (!ps->value)
			return 1; /* Host present but empty */
		ps->host = ps->value;
		ps->host_end = ps->value_end;
		return 0;
	case H_CONTENT_LENGTH:
		return ps->cl_digits == 0;
	case H_CONNECTION:
		if (value_is(ps, "close", 5))
			ps->conn_close = 1;
		else if (!value_is(ps, "keep-alive", 10))
			return 1;
		return 0;
	}
	return 0;
}

/* Word-at-a-time tests (8 bytes; "Bit Twiddling Hacks"): most of a head is header values
 * and most of a response head is not a line end, and a bpf_loop body that only skips
 * costs a few instructions where the state machine costs tens. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

static __always_inline __u64 load_word(const char *buf, __u32 i)
{
	return *(const __u64 *)&buf[i & (SV_HEAD_MAX - 1)];
}

/* plain_value: every byte of x is visible ASCII other than space (0x21-0x7e). */
static __always_inline int plain_value(__u64 x)
{
	__u64 below = (x - ONES * 0x21) & ~x & HIGHS; /* a byte < 0x21 */
	__u64 above = ((x + ONES) | x) & HIGHS;       /* a byte >= 0x7f */

	return !(below | above);
}

/* no_newline: no byte of x is '\n'. */
static __always_inline int no_newline(__u64 x)
{
	__u64 y = x ^ (ONES * '\n');

	return !((y - ONES) & ~y & HIGHS);
}

/* parse_step puts byte i of the head through the state machine. Returns 1 to stop (head
 * complete or outside the subset). */
static __always_inline long parse_step(struct sv_parse *ps, __u32 i)
{
	char c;

	if (i >= SV_HEAD_MAX)
		return 1;
	c = ps->buf[i & (SV_HEAD_MAX - 1)];
	switch (ps->state) {
	case S_METHOD:
		if (c >= 'A' && c <= 'Z' && i < 8)
			return 0;
		if (c == ' ' && i > 0) {
			ps->sp1 = i;
			ps->state = S_TARGET;
			return 0;
		}
		break;
	case S_TARGET:
		if (c != '/')
			break;
		ps->state = S_PATH;
		ps->seg_len = 0;
		ps->seg_dots = 1;
		return 0;
	case S_PATH:
		if (c == '/' || c == '?' || c == ' ') {
			/* a segment ends: no dot segments; no empty one inside the path */
			if (ps->seg_dots && (ps->seg_len == 1 || ps->seg_len == 2))
				break;
			if (c == '/' && ps->seg_len == 0)
				break;
			if (c != '/') {
				ps->path_end = i;
				ps->state = c == '?' ? S_QUERY : S_VERSION;
				return 0;
			}
			ps->seg_len = 0;
			ps->seg_dots = 1;
			return 0;
		}
		if (c <= 0x20 || c >= 0x7f || c == '#' || c == '\\' || c == '%')
			break;
		ps->seg_len++;
		if (c != '.')
			ps->seg_dots = 0;
		return 0;
	case S_QUERY:
		if (c == ' ') {
			ps->state = S_VERSION;
			return 0;
		}
		if (c <= 0x20 || c >= 0x7f || c == '#' || c == '\\')
			break;
		return 0;
	case S_VERSION:
		/* the space before it was read by S_PATH or S_QUERY: position in version[] */
		if (ps->line == 0)
			ps->line = i - 1;
		if (i - ps->line >= 11 || c != version[(i - ps->line) & 15])
			break;
		if (c == '\n') {
			ps->state = S_LINE;
			ps->line = i + 1;
		}
		return 0;
	case S_LINE:
		ps->line = i;
		ps->name = H_OTHER;
		ps->value = ps->value_end = 0;
		if (c == '\r') {
			ps->state = S_END_LF;
			return 0;
		}
		ps->state = S_NAME;
		/* fall through: the line's first byte is a name byte */
	case S_NAME:
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')
			return 0;
		if (c != ':' || i == ps->line)
			break;
		ps->name = classify(ps, i - ps->line);
		ps->colon = i;
		ps->cl_digits = 0;
		ps->cl = 0;
		ps->state = S_VALUE;
		return 0;
	case S_VALUE:
		if (c == '\r') {
			ps->state = S_VALUE_LF;
			return 0;
		}
		if (c != '\t' && (c < 0x20 || c >= 0x7f))
			break;
		if (c == ' ' || c == '\t')
			return 0; /* white space is trimmed: value..value_end spans the rest */
		if (!ps->value)
			ps->value = i;
		else if (ps->value_end != i && ps->name == H_CONTENT_LENGTH)
			break; /* "1 2": white space inside a length */
		ps->value_end = i + 1;
		if (ps->name == H_CONTENT_LENGTH) {
			if (c < '0' || c > '9' || ps->cl_digits >= 9)
				break;
			ps->cl = ps->cl * 10 + (c - '0');
			ps->cl_digits++;
		}
		return 0;
	case S_VALUE_LF:
		if (c != '\n' || end_line(ps))
			break;
		ps->state = S_LINE;
		return 0;
	case S_END_LF:
		if (c != '\n')
			break;
		ps->head = i + 1;
		return 1;
	}
	ps->bad = 1;
	return 1;
}

/* word_ctx is what the per-byte callbacks get: the scratch and the word's first index. */
struct word_ctx {
	void *scratch;
	__u32 base;
	__u32 stop; /* a byte callback asked to stop */
};

/* BYTE_CALLBACK defines the inner bpf_loop body that puts byte base+k of a word through
 * step (parse_step or resp_step), and stops both loops when step says so. */
#define BYTE_CALLBACK(name, scratch_type, step)                                                \
	static long name(__u32 k, void *ctx)                                                   \
	{                                                                                      \
		struct word_ctx *wc = ctx;                                                     \
		scratch_type *sc = wc->scratch;                                                \
		__u32 i = wc->base + k;                                                        \
                                                                                               \
		if (i >= sc->n || step(sc, i)) {                                               \
			wc->stop = 1;                                                          \
			return 1;                                                              \
		}                                                                              \
		return 0;                                                                      \
	}

BYTE_CALLBACK(parse_byte, struct sv_parse, parse_step)

/* parse_word is the outer bpf_loop body: the head's bytes 8w..8w+7. Eight plain bytes of a
 * header value (not a length, read digit by digit) take one test; other words go byte by
 * byte (an inner bpf_loop: each body is verified once, where unrolled steps were not).
 * Returns 1 to stop. */
static long parse_word(__u32 w, void *ctx)
{
	struct sv_parse *ps = *(struct sv_parse **)ctx;
	struct word_ctx wc = {.scratch = ps, .base = w * 8};

	if (wc.base >= ps->n || wc.base >= SV_HEAD_MAX)
		return 1;
	if (ps->state == S_VALUE && ps->name != H_CONTENT_LENGTH && wc.base + 8 <= ps->n &&
	    plain_value(load_word(ps->buf, wc.base))) {
		if (!ps->value)
			ps->value = wc.base;
		ps->value_end = wc.base + 8;
		return 0;
	}
	bpf_loop(8, parse_byte, &wc, 0);
	return wc.stop ? 1 : 0;
}

/* req_ctx and req_bit drop from cand the rules (of hr, those with header matches) whose
 * header requirements the request did not all meet: a bpf_loop body, verified once. */
struct req_ctx {
	const struct sv_table *tab;
	__u64 seen, cand, hr;
	__u32 side;
};

static long req_bit(__u32 bit, void *ctx)
{
	struct req_ctx *r = ctx;

	if (bit >= 64 || !(r->hr >> bit))
		return 1;
	if ((r->hr >> bit) & 1 && (r->tab->rule_reqs[r->side & 1][bit & 63] & ~r->seen))
		r->cand &= ~(1ULL << bit);
	return 0;
}

/* method_index: the request's method as an index of l7table.Methods, SV_METHODS if none. */
static __always_inline __u32 method_index(const struct sv_parse *ps)
{
	const char *b = ps->buf;

	switch (ps->sp1) {
	case 3:
		if (b[0] == 'G' && b[1] == 'E' && b[2] == 'T')
			return 0;
		if (b[0] == 'P' && b[1] == 'U' && b[2] == 'T')
			return 3;
		break;
	case 4:
		if (b[0] == 'H' && b[1] == 'E' && b[2] == 'A' && b[3] == 'D')
			return 1;
		if (b[0] == 'P' && b[1] == 'O' && b[2] == 'S' && b[3] == 'T')
			return 2;
		break;
	case 5:
		if (b[0] == 'P' && b[1] == 'A' && b[2] == 'T' && b[3] == 'C' && b[4] == 'H')
			return 6;
		break;
	case 6:
		if (b[0] == 'D' && b[1] == 'E' && b[2] == 'L' && b[3] == 'E' && b[4] == 'T' && b[5] == 'E')
			return 4;
		break;
	case 7:
		if (b[0] == 'O' && b[1] == 'P' && b[2] == 'T' && b[3] == 'I' && b[4] == 'O' && b[5] == 'N' &&
		    b[6] == 'S')
			return 5;
		break;
	}
	return SV_METHODS;
}

/* ---- answers from the sender's own socket ---- */

static const char forbidden[] = "HTTP/1.1 403 Forbidden\r\ncontent-length: 19\r\ncontent-type: text/plain\r\n\r\n"
				"RBAC: access denied";
/* The refusal of a HEAD request: the same head, no body. */
static const char forbidden_head[] = "HTTP/1.1 403 Forbidden\r\ncontent-length: 19\r\ncontent-type: text/plain\r\n\r\n";
/* A refusal after which the connection cannot go on (the request's body, or the next
 * request, is already in the same send). */
static const char forbidden_close[] = "HTTP/1.1 403 Forbidden\r\ncontent-length: 19\r\ncontent-type: text/plain\r\n"
				      "connection: close\r\n\r\nRBAC: access denied";
static const char bad_request[] = "HTTP/1.1 400 Bad Request\r\ncontent-length: 44\r\ncontent-type: text/plain\r\n"
				  "connection: close\r\n\r\nrequest outside the kernel's HTTP/1.1 subset";

/* answer rewrites msg (which must hold exactly the refused request) into resp and
 * redirects it into the receive queue of the client's own socket. */
static __always_inline int answer(struct sk_msg_md *msg, struct sv_conn_key *key, const char *resp, __u32 want)
{
	__u32 len = msg->size;
	char *p;

	if (len > want) {
		if (bpf_msg_pop_data(msg, want, len - want, 0))
			return SK_DROP;
	} else if (len < want) {
		if (bpf_msg_push_data(msg, len, want - len, 0))
			return SK_DROP;
	}
	if (bpf_msg_pull_data(msg, 0, want, 0))
		return SK_DROP;
	p = msg->data;
	if ((void *)(p + want) > msg->data_end)
		return SK_DROP;
	/* want is a constant in each inlined copy, so this becomes plain stores (helpers
	 * may not write into the message). */
	__builtin_memcpy(p, resp, want);
	return bpf_msg_redirect_hash(msg, &sv_clients, key, BPF_F_INGRESS);
}

/* in_order: may an answer go into the client's receive queue now? Only when every passed
 * request has its whole response at the client, and the client has read it all. Before
 * the tracker has the server's socket, only when nothing was passed or received yet. */
static __always_inline int in_order(struct sk_msg_md *msg, const struct sv_conn *c)
{
	struct tcp_sock *tp;

	if (!msg->sk || (c->flags & SV_C_LOST) || c->done != c->passed)
		return 0;
	tp = bpf_skc_to_tcp_sock(msg->sk);
	if (!tp || tp->bytes_received != c->server_bytes || tp->copied_seq != tp->rcv_nxt)
		return 0;
	return !(c->flags & SV_C_NO_TRACKER) || (c->passed == 0 && tp->bytes_received == 0);
}

static __always_inline void emit(const struct sv_conn_key *key, __u32 table, __u8 verdict,
				 __u16 status, __u64 latency, __u32 method, const __u64 *rules, const char *path,
				 const char *host)
{
	struct sv_event *e = bpf_ringbuf_reserve(&sv_events, sizeof(*e), 0);
	__u64 avail;

	if (!e) {
		count(4);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->latency_ns = latency;
	e->rules[0] = rules ? rules[0] : 0;
	e->rules[1] = rules ? rules[1] : 0;
	e->client_ip4 = key->client_ip4;
	e->server_ip4 = key->server_ip4;
	e->client_port = key->client_port;
	e->server_port = key->server_port;
	e->table = table;
	e->status = status;
	e->method = method;
	e->verdict = verdict;
	e->pad = 0;
	bpf_probe_read_kernel(e->path, sizeof(e->path), path);
	bpf_probe_read_kernel(e->host, sizeof(e->host), host);
	/* No wakeup per event: each one is an interrupt to the reader's CPU (an APIC write,
	 * a VM exit here) and a context switch, which cost more than the whole verdict at tens
	 * of thousands of requests a second. The event that fills a quarter of the ring wakes
	 * the reader (once: a reader that lags is not woken again and again); otherwise it
	 * polls (SockEventReader, every SockEventPoll). */
	avail = bpf_ringbuf_query(&sv_events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(e, avail >= SV_EVENTS_WAKE && avail < SV_EVENTS_WAKE + 2 * sizeof(*e) ? BPF_RB_FORCE_WAKEUP
												  : BPF_RB_NO_WAKEUP);
}

/* flush_pending reports a passed request whose response was not seen. */
static __always_inline void flush_pending(const struct sv_conn_key *key, struct sv_conn *c)
{
	if (!c->pending)
		return;
	c->pending = 0;
	emit(key, c->table, SV_V_PASSED, 0, 0, c->method, c->rules, c->path, c->host);
}

/* Keys for the lookups, built in the per-CPU scratch of the event fields. */
struct sv_lookup {
	struct sv_path_key path;
	struct sv_host_key host;
	char ev_path[SV_EV_PATH];
	char ev_host[SV_EV_HOST];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sv_lookup);
} sv_lookups SEC(".maps");

/* copy_field copies buf[from, to) (at most max bytes) to dst, zero-filled. */
static __always_inline void copy_field(char *dst, __u32 max, const struct sv_parse *ps, __u32 from, __u32 to)
{
	__u32 len = to > from ? to - from : 0;

	__builtin_memset(dst, 0, max);
	if (len > max)
		len = max;
	if (len && from < SV_HEAD_MAX)
		bpf_probe_read_kernel(dst, len & (max * 2 - 1), &ps->buf[from & (SV_HEAD_MAX - 1)]);
}

SEC("sk_msg")
int sv_request(struct sk_msg_md *msg)
{
	struct sv_conn_key key = {
		.client_ip4 = msg->local_ip4,
		.server_ip4 = msg->remote_ip4,
		.client_port = msg->local_port,
		.server_port = bpf_ntohl(msg->remote_port),
	};
	__u32 size = msg->size, n, zero = 0, m, len, table, *slot;
	struct sv_masks *paths, *hosts;
	struct sv_table *tab;
	struct sv_lookup *lk;
	struct sv_parse *ps;
	struct sv_conn *c;
	__u64 allowed[2];
	void *ctx;

	c = bpf_map_lookup_elem(&sv_conns, &key);
	ps = bpf_map_lookup_elem(&sv_scratch, &zero);
	lk = bpf_map_lookup_elem(&sv_lookups, &zero);
	if (!c || !ps || !lk || (c->flags & SV_C_SHUT)) {
		count(SV_V_SEND_FAILED);
		return SK_DROP;
	}
	/* A message that was corked keeps the cork length asked for last (the kernel copies
	 * it with the message): without this, the send after a corked head was held again,
	 * for good, whatever the verdict. */
	bpf_msg_cork_bytes(msg, 0);
	/* The rest of a passed request's body, counted here (rather than with
	 * bpf_msg_apply_bytes beyond this send) so that the state says where the connection
	 * is. */
	if (c->body_left) {
		if (size <= c->body_left) {
			c->body_left -= size;
			return SK_PASS;
		}
		/* The body ends inside this send: the program runs again on the rest. */
		bpf_msg_apply_bytes(msg, c->body_left);
		c->body_left = 0;
		return SK_PASS;
	}
	/* The table now, for this whole request (a policy change switches the slot). */
	slot = bpf_map_lookup_elem(&sv_slots, &c->slot);
	table = slot ? *slot : 0;
	tab = table ? bpf_map_lookup_elem(&sv_tables, &table) : 0;
	n = size < SV_HEAD_MAX ? size : SV_HEAD_MAX;
	if (n == 0)
		return SK_PASS;
	if (bpf_msg_pull_data(msg, 0, n, 0) || (void *)((char *)msg->data + n) > msg->data_end ||
	    bpf_probe_read_kernel(ps->buf, n & (SV_HEAD_MAX * 2 - 1), msg->data)) {
		count(SV_V_SEND_FAILED);
		return SK_DROP;
	}
	__builtin_memset(ps, 0, offsetof(struct sv_parse, hkey));
	ps->n = n;
	ps->table = table;
	ps->has_headers = tab && (tab->header_rules.m[0] | tab->header_rules.m[1]);
	ctx = ps;
	bpf_loop((n + 7) / 8, parse_word, &ctx, 0);
	if (!ps->bad && !ps->head) {
		if (size < SV_HEAD_MAX) {
			/* Not whole yet: hold the bytes until more come. */
			bpf_msg_cork_bytes(msg, size + 1);
			return SK_PASS;
		}
		ps->bad = 1; /* a head larger than the verdict reads */
	}
	m = ps->bad ? SV_METHODS : method_index(ps);
	if (m >= SV_METHODS || !(ps->seen & (1 << H_HOST)))
		ps->bad = 1;

	copy_field(lk->ev_path, SV_EV_PATH, ps, ps->sp1 + 1, ps->path_end);
	copy_field(lk->ev_host, SV_EV_HOST, ps, ps->host, ps->host_end);
	if (ps->bad) {
		/* Outside the subset: answered, and nothing more is sent on this connection. */
		c->flags |= SV_C_SHUT;
		flush_pending(&key, c);
		if (in_order(msg, c)) {
			emit(&key, table, SV_V_MALFORMED, 400, 0, m, 0, lk->ev_path, lk->ev_host);
			count(SV_V_MALFORMED);
			return answer(msg, &key, bad_request, sizeof(bad_request) - 1);
		}
		emit(&key, table, SV_V_SEND_FAILED, 400, 0, m, 0, lk->ev_path, lk->ev_host);
		count(SV_V_SEND_FAILED);
		return SK_DROP;
	}

	allowed[0] = allowed[1] = 0;
	if (tab && m < SV_METHODS) {
		lk->path.prefixlen = 32 + SV_PATH_MAX * 8;
		lk->path.table = table;
		copy_field((char *)lk->path.path, SV_PATH_MAX, ps, ps->sp1 + 1, ps->path_end);
		lk->host.table = table;
		copy_field((char *)lk->host.host, SV_HOST_MAX, ps, ps->host, ps->host_end);
		paths = bpf_map_lookup_elem(&sv_paths, &lk->path);
		hosts = bpf_map_lookup_elem(&sv_hosts, &lk->host);
		for (int s = 0; s < 2; s++) {
			__u64 p = tab->any_path.m[s] | (paths ? paths->m[s] : 0);
			__u64 h = tab->any_host.m[s] | (hosts ? hosts->m[s] : 0);
			struct req_ctx rc = {.tab = tab, .seen = ps->seen_reqs[s] & ~ps->broken_reqs[s], .side = s};

			rc.cand = tab->method[m].m[s] & p & h;
			rc.hr = rc.cand & tab->header_rules.m[s];
			if (rc.hr) /* rules with header matches: all their requirements met? */
				bpf_loop(64, req_bit, &rc, 0);
			allowed[s] = tab->pass.m[s] ? tab->pass.m[s] : rc.cand;
		}
	}
	len = ps->head + (__u32)ps->cl;
	if (c->pending)
		/* The last request has no response yet (pipelining): the tracker cannot tell
		 * which response is whose, so refusals can no longer be answered in order. */
		c->flags |= SV_C_LOST;
	flush_pending(&key, c);
	if (allowed[0] && allowed[1]) {
		c->passed++;
		c->pending = 1;
		c->table = table;
		c->req_ns = bpf_ktime_get_ns();
		c->method = m;
		c->rules[0] = allowed[0];
		c->rules[1] = allowed[1];
		bpf_probe_read_kernel(c->path, sizeof(c->path), lk->ev_path);
		bpf_probe_read_kernel(c->host, sizeof(c->host), lk->ev_host);
		count(SV_V_PASSED);
		if (len > size)
			c->body_left = len - size;
		else if (len < size)
			bpf_msg_apply_bytes(msg, len); /* the next request follows in this send */
		return SK_PASS;
	}
	/* Refused: answered from the client's own socket, in order, or the send fails. */
	if (!in_order(msg, c)) {
		c->flags |= SV_C_SHUT;
		emit(&key, table, SV_V_SEND_FAILED, 403, 0, m, allowed, lk->ev_path, lk->ev_host);
		count(SV_V_SEND_FAILED);
		return SK_DROP;
	}
	/* The masks say which side refused (the one with none). */
	emit(&key, table, SV_V_REFUSED, 403, 0, m, allowed, lk->ev_path, lk->ev_host);
	count(SV_V_REFUSED);
	if (size == len && m == 1 /* HEAD */)
		return answer(msg, &key, forbidden_head, sizeof(forbidden_head) - 1);
	if (size == len)
		return answer(msg, &key, forbidden, sizeof(forbidden) - 1);
	c->flags |= SV_C_SHUT;
	return answer(msg, &key, forbidden_close, sizeof(forbidden_close) - 1);
}

/* ---- the server's responses ---- */

struct sv_resp {
	__u32 n;
	__u32 state; /* 0 status line, 1 headers */
	__u32 head;
	__u32 status;
	__u32 line;
	__u32 cl_digits;
	__u32 cl_seen;
	__u32 chunked;
	__u32 bad;
	__u64 cl;
	char buf[SV_HEAD_MAX + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sv_resp);
} sv_resp_scratch SEC(".maps");

/* resp_step follows a response head at byte i: the status, Content-Length and
 * Transfer-Encoding. A head it cannot frame exactly sets bad. Returns 1 to stop. */
static __always_inline long resp_step(struct sv_resp *r, __u32 i)
{
	char c;

	if (i >= SV_HEAD_MAX)
		return 1;
	c = r->buf[i & (SV_HEAD_MAX - 1)];
	if (c != '\n')
		return 0;
	/* A line ends at i: [r->line, i). */
	if (i == r->line + 1 || i == r->line) {
		r->head = i + 1; /* the empty line */
		return 1;
	}
	if (i - r->line > 17 && lower(r->buf[r->line & (SV_HEAD_MAX - 1)]) == 'c' &&
	    lower(r->buf[(r->line + 8) & (SV_HEAD_MAX - 1)]) == 'l' && r->buf[(r->line + 14) & (SV_HEAD_MAX - 1)] == ':') {
		/* content-length: digits */
		__u64 v = 0;
		__u32 d = 0;

		for (__u32 j = 15; j < 32; j++) {
			char x = r->buf[(r->line + j) & (SV_HEAD_MAX - 1)];

			if (r->line + j >= i)
				break;
			if (x == ' ' || x == '\t' || x == '\r')
				continue;
			if (x < '0' || x > '9' || d >= 9) {
				r->bad = 1;
				return 1;
			}
			v = v * 10 + (x - '0');
			d++;
		}
		if (!d || (r->cl_seen && v != r->cl)) {
			r->bad = 1;
			return 1;
		}
		r->cl = v;
		r->cl_seen = 1;
	} else if (i - r->line > 18 && lower(r->buf[r->line & (SV_HEAD_MAX - 1)]) == 't' &&
		   lower(r->buf[(r->line + 9) & (SV_HEAD_MAX - 1)]) == 'e' &&
		   r->buf[(r->line + 17) & (SV_HEAD_MAX - 1)] == ':') {
		r->chunked = 1; /* transfer-encoding: the tracker does not follow chunks */
	}
	r->line = i + 1;
	return 0;
}

BYTE_CALLBACK(resp_byte, struct sv_resp, resp_step)

/* resp_word is the outer bpf_loop body: bytes 8w..8w+7, skipped in one test unless a line
 * ends among them. */
static long resp_word(__u32 w, void *ctx)
{
	struct sv_resp *r = *(struct sv_resp **)ctx;
	struct word_ctx wc = {.scratch = r, .base = w * 8};

	if (wc.base >= r->n || wc.base >= SV_HEAD_MAX)
		return 1;
	if (wc.base + 8 <= r->n && no_newline(load_word(r->buf, wc.base)))
		return 0;
	bpf_loop(8, resp_byte, &wc, 0);
	return wc.stop ? 1 : 0;
}

SEC("sk_msg")
int sv_response(struct sk_msg_md *msg)
{
	struct sv_conn_key key = {
		.client_ip4 = msg->remote_ip4,
		.server_ip4 = msg->local_ip4,
		.client_port = bpf_ntohl(msg->remote_port),
		.server_port = msg->local_port,
	};
	__u32 size = msg->size, n, zero = 0, st = 0, body;
	struct sv_resp *r;
	struct sv_conn *c;
	void *ctx;

	c = bpf_map_lookup_elem(&sv_conns, &key);
	r = bpf_map_lookup_elem(&sv_resp_scratch, &zero);
	if (!c || !r)
		return SK_PASS; /* the server's sends are never held up */
	if (c->flags & SV_C_LOST)
		goto lost;
	n = size < SV_HEAD_MAX ? size : SV_HEAD_MAX;
	if (n < 13 || bpf_msg_pull_data(msg, 0, n, 0) || (void *)((char *)msg->data + n) > msg->data_end ||
	    bpf_probe_read_kernel(r->buf, n & (SV_HEAD_MAX * 2 - 1), msg->data))
		goto lost;
	__builtin_memset(r, 0, offsetof(struct sv_resp, buf));
	r->n = n;
	if (r->buf[0] != 'H' || r->buf[1] != 'T' || r->buf[2] != 'T' || r->buf[3] != 'P' || r->buf[4] != '/' ||
	    r->buf[5] != '1' || r->buf[6] != '.' || r->buf[8] != ' ')
		goto lost;
	for (int j = 9; j < 12; j++) {
		char d = r->buf[j];

		if (d < '0' || d > '9')
			goto lost;
		st = st * 10 + (d - '0');
	}
	ctx = r;
	bpf_loop((n + 7) / 8, resp_word, &ctx, 0);
	if (r->bad || !r->head || r->chunked || st < 200)
		goto lost;
	body = (__u32)r->cl;
	if (!r->cl_seen) {
		/* No length: only bodiless statuses can be framed. */
		if (st != 204 && st != 304)
			goto lost;
		body = 0;
	}
	if (c->method == 1 /* HEAD */ || st == 204 || st == 304)
		body = 0;
	/* The bytes a Content-Length body spans in later sends are counted now: the program
	 * does not run for them (bpf_msg_apply_bytes). */
	__sync_fetch_and_add(&c->server_bytes, r->head + body > size ? r->head + body : size);
	__sync_fetch_and_add(&c->done, 1);
	if (c->pending) {
		c->pending = 0;
		emit(&key, c->table, SV_V_PASSED, st, bpf_ktime_get_ns() - c->req_ns, c->method, c->rules, c->path, c->host);
	}
	if (r->head + body != size)
		bpf_msg_apply_bytes(msg, r->head + body);
	return SK_PASS;
lost:
	__sync_fetch_and_add(&c->server_bytes, size);
	/* From here on, refusals on this connection fail the send, and requests are
	 * reported without their status. */
	__sync_fetch_and_or(&c->flags, SV_C_LOST);
	if (c->pending) {
		c->pending = 0;
		emit(&key, c->table, SV_V_PASSED, st >= 100 && st < 600 ? st : 0, bpf_ktime_get_ns() - c->req_ns, c->method,
		     c->rules, c->path, c->host);
	}
	return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
