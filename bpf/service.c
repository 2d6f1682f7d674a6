/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket-level Service translation (docs/services.md), a BPF object of its own, attached to
 * a cgroup v2 directory (the root: every pod's sockets):
 *
 *   - svc_connect4 (cgroup/connect4): a TCP or UDP connect to a Service frontend connects
 *     to one of its backends instead, chosen at random.
 *   - svc_sendmsg4 (cgroup/sendmsg4): an unconnected UDP send to a frontend goes to a
 *     backend, the same one for every send of a socket while the set is unchanged.
 *   - svc_recvmsg4 (cgroup/recvmsg4): a UDP reply from that backend is reported as coming
 *     from the frontend.
 *   - svc_getpeername4 (cgroup/getpeername4): a translated socket's peer is the frontend.
 *
 * The same four for IPv6 (svc_connect6, svc_sendmsg6, svc_recvmsg6, svc_getpeername6) with
 * the IPv6 maps, and for an IPv4-mapped address (::ffff:a.b.c.d: an IPv4 destination of
 * a dual-stack socket, which the kernel never shows the IPv4 hooks) with the IPv4 maps.
 *
 * Every packet a pod sends thus already carries the backend's address: the tc programs
 * judge policy on the backend pod, and the backend sees the client's own address. The
 * programs never allow or deny anything; a frontend with no backend refuses the connect
 * or send (ECONNREFUSED), as kube-proxy's reject rule does. Translation is idempotent (a
 * backend address is not a frontend), so several agents' programs on one cgroup (one per
 * simulated node on a host) coexist. */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "service.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#ifndef ECONNREFUSED
#define ECONNREFUSED 111
#endif

/* The cgroup sock_addr verdicts: 1 lets the syscall go on, 0 fails it (with the error set
 * by bpf_set_retval). */
#define SYS_PROCEED 1
#define SYS_REJECT 0

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_SERVICES_MAX);
	__type(key, struct svc_key);
	__type(value, struct svc_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} svc_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_BACKENDS_MAX);
	__type(key, struct svc_backend_key);
	__type(value, struct svc_backend);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} svc_backends SEC(".maps");

/* LRU: an entry of a socket long closed makes room for new ones. One that is evicted while
 * its socket lives only shows that socket the backend's address instead of the frontend's. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SVC_REVNAT_MAX);
	__type(key, struct svc_revnat_key);
	__type(value, struct svc_backend);
} svc_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_SERVICES_MAX);
	__type(key, struct svc_key6);
	__type(value, struct svc_value);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} svc_services6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_BACKENDS_MAX);
	__type(key, struct svc_backend_key);
	__type(value, struct svc_backend6);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} svc_backends6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SVC_REVNAT_MAX);
	__type(key, struct svc_revnat_key6);
	__type(value, struct svc_backend6);
} svc_revnat6 SEC(".maps");

/* pick_backend returns the slot of svc's backend set that a socket goes to (refusing the
 * syscall, with 0, when it has none): at random, or by_socket from the socket's cookie, so
 * that an unconnected socket's datagrams keep going to one backend. */
static __always_inline int pick_backend(struct bpf_sock_addr *ctx, const struct svc_value *svc,
					int by_socket, struct svc_backend_key *bkey)
{
	__u64 cookie;
	__u32 pick, count;

	/* svc_services is not preallocated, so an update replaces the element whole: rev and
	 * count read here belong together. */
	count = svc->count;
	if (count == 0) {
		/* No backend: refuse, as kube-proxy's reject rule does. */
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	cookie = bpf_get_socket_cookie(ctx);
	pick = by_socket ? (__u32)(cookie ^ (cookie >> 32)) : bpf_get_prandom_u32();
	bkey->rev = svc->rev;
	bkey->slot = pick % count;
	return 1;
}

/* translate rewrites ctx's destination if it is a frontend. by_socket picks the backend
 * from the socket's cookie instead of at random, so that an unconnected socket's datagrams
 * keep going to one backend. */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 proto, int by_socket)
{
	struct svc_key key = {};
	struct svc_backend_key bkey = {};
	struct svc_revnat_key rkey = {};
	struct svc_backend front = {};
	struct svc_value *svc;
	struct svc_backend *be;

	key.ip4 = ctx->user_ip4;
	key.port = (__u16)ctx->user_port;
	key.proto = proto;
	svc = bpf_map_lookup_elem(&svc_services, &key);
	if (!svc)
		return SYS_PROCEED; /* not a frontend: untouched */
	if (!pick_backend(ctx, svc, by_socket, &bkey))
		return SYS_REJECT;
	be = bpf_map_lookup_elem(&svc_backends, &bkey);
	if (!be) {
		/* The set is being replaced between our two lookups (its old rev is gone): refuse
		 * rather than send to an address nobody chose; the application retries. */
		bpf_set_retval(-ECONNREFUSED);
		return SYS_REJECT;
	}
	ctx->user_ip4 = be->ip4;
	ctx->user_port = be->port;

	/* Remember the frontend for replies and peer names. Losing this (a full LRU) only
	 * shows the backend's address to the application. */
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.ip4 = be->ip4;
	rkey.port = be->port;
	rkey.proto = proto;
	front.ip4 = key.ip4;
	front.port = key.port;
	bpf_map_update_elem(&svc_revnat, &rkey, &front, BPF_ANY);
	return SYS_PROCEED;
}

/* reverse shows a translated socket's peer as the frontend it asked for. */
static __always_inline void reverse(struct bpf_sock_addr *ctx, __u8 proto)
{
	struct svc_revnat_key rkey = {};
	struct svc_backend *front;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.ip4 = ctx->user_ip4;
	rkey.port = (__u16)ctx->user_port;
	rkey.proto = proto;
	front = bpf_map_lookup_elem(&svc_revnat, &rkey);
	if (!front)
		return;
	ctx->user_ip4 = front->ip4;
	ctx->user_port = front->port;
}

/* is_v4_mapped says whether ctx's IPv6 address is IPv4-mapped (::ffff:a.b.c.d). */
static __always_inline int is_v4_mapped(const struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == bpf_htonl(0x0000ffff);
}

/* translate6 is translate for an IPv6 destination; an IPv4-mapped one is looked up in the
 * IPv4 maps and rewritten to its backend's IPv4-mapped address. */
static __always_inline int translate6(struct bpf_sock_addr *ctx, __u8 proto, int by_socket)
{
	struct svc_backend_key bkey = {};
	struct svc_revnat_key6 rkey = {};
	struct svc_backend6 front = {}, mapped = {};
	struct svc_key6 key = {};
	struct svc_value *svc;
	struct svc_backend6 *be;
	int v4 = is_v4_mapped(ctx);

	key.ip6[0] = ctx->user_ip6[0];
	key.ip6[1] = ctx->user_ip6[1];
	key.ip6[2] = ctx->user_ip6[2];
	key.ip6[3] = ctx->user_ip6[3];
	key.port = (__u16)ctx->user_port;
	key.proto = proto;
	if (v4) {
		struct svc_key k4 = { .ip4 = key.ip6[3], .port = key.port, .proto = proto };

		svc = bpf_map_lookup_elem(&svc_services, &k4);
	} else {
		svc = bpf_map_lookup_elem(&svc_services6, &key);
	}
	if (!svc)
		return SYS_PROCEED; /* not a frontend: untouched */
	if (!pick_backend(ctx, svc, by_socket, &bkey))
		return SYS_REJECT;
	if (v4) {
		struct svc_backend *b4 = bpf_map_lookup_elem(&svc_backends, &bkey);

		be = 0;
		if (b4) {
			mapped.ip6[2] = bpf_htonl(0x0000ffff);
			mapped.ip6[3] = b4->ip4;
			mapped.port = b4->port;
			be = &mapped;
		}
	} else {
		be = bpf_map_lookup_elem(&svc_backends6, &bkey);
	}
	if (!be) {
		/* The set is being replaced between our two lookups: refuse (translate). */
		bpf_set_retval(-ECONNREFUSED);
		return SYS_REJECT;
	}
	ctx->user_ip6[0] = be->ip6[0];
	ctx->user_ip6[1] = be->ip6[1];
	ctx->user_ip6[2] = be->ip6[2];
	ctx->user_ip6[3] = be->ip6[3];
	ctx->user_port = be->port;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rkey.ip6, be->ip6, sizeof(rkey.ip6));
	rkey.port = be->port;
	rkey.proto = proto;
	__builtin_memcpy(front.ip6, key.ip6, sizeof(front.ip6));
	front.port = key.port;
	bpf_map_update_elem(&svc_revnat6, &rkey, &front, BPF_ANY);
	return SYS_PROCEED;
}

/* reverse6 is reverse for an IPv6 socket. */
static __always_inline void reverse6(struct bpf_sock_addr *ctx, __u8 proto)
{
	struct svc_revnat_key6 rkey = {};
	struct svc_backend6 *front;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.ip6[0] = ctx->user_ip6[0];
	rkey.ip6[1] = ctx->user_ip6[1];
	rkey.ip6[2] = ctx->user_ip6[2];
	rkey.ip6[3] = ctx->user_ip6[3];
	rkey.port = (__u16)ctx->user_port;
	rkey.proto = proto;
	front = bpf_map_lookup_elem(&svc_revnat6, &rkey);
	if (!front)
		return;
	ctx->user_ip6[0] = front->ip6[0];
	ctx->user_ip6[1] = front->ip6[1];
	ctx->user_ip6[2] = front->ip6[2];
	ctx->user_ip6[3] = front->ip6[3];
	ctx->user_port = front->port;
}

SEC("cgroup/connect4")
int svc_connect4(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	return translate(ctx, proto, 0);
}

SEC("cgroup/sendmsg4")
int svc_sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate(ctx, IPPROTO_UDP, 1);
}

SEC("cgroup/recvmsg4")
int svc_recvmsg4(struct bpf_sock_addr *ctx)
{
	reverse(ctx, IPPROTO_UDP);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int svc_getpeername4(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;

	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
		reverse(ctx, proto);
	return SYS_PROCEED;
}

SEC("cgroup/connect6")
int svc_connect6(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	return translate6(ctx, proto, 0);
}

SEC("cgroup/sendmsg6")
int svc_sendmsg6(struct bpf_sock_addr *ctx)
{
	return translate6(ctx, IPPROTO_UDP, 1);
}

SEC("cgroup/recvmsg6")
int svc_recvmsg6(struct bpf_sock_addr *ctx)
{
	reverse6(ctx, IPPROTO_UDP);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername6")
int svc_getpeername6(struct bpf_sock_addr *ctx)
{
	__u32 proto = ctx->protocol;

	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
		reverse6(ctx, proto);
	return SYS_PROCEED;
}

char _license[] SEC("license") = "Dual BSD/GPL";
