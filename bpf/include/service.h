/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Layouts shared by the socket-level Service translation (service.c) and the agent
 * (internal/datapath/services.go). See docs/services.md. Addresses and ports are in
 * network order, as the kernel hands them to cgroup sock_addr programs. */
#ifndef __RAMPART_SERVICE_H
#define __RAMPART_SERVICE_H

#include <linux/types.h>

#ifndef SVC_SERVICES_MAX
#define SVC_SERVICES_MAX 65536 /* Service frontends (address, port, protocol) */
#endif
#ifndef SVC_BACKENDS_MAX
#define SVC_BACKENDS_MAX 262144 /* backends of all frontends, in all revisions being swapped */
#endif
#ifndef SVC_REVNAT_MAX
#define SVC_REVNAT_MAX 131072 /* translated sockets remembered for replies and peer names */
#endif

/* A Service frontend: its cluster address, port and protocol (IPPROTO_TCP/UDP). */
struct svc_key {
	__u32 ip4;
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* The frontend's current backend set: backends are stored under rev, slots 0..count-1. A
 * change writes the new set under a new rev, then switches this entry, then deletes the
 * old rev's backends, so a socket never meets half of each. count 0: the Service has no
 * ready backend, and connects and sends to it are refused (ECONNREFUSED). */
struct svc_value {
	__u32 rev;
	__u32 count;
};

struct svc_backend_key {
	__u32 rev;
	__u32 slot;
};

struct svc_backend {
	__u32 ip4;
	__u16 port;
	__u16 pad;
};

/* Reverse translation: a socket (its cookie) that was translated to a backend, and that
 * backend's address, to the frontend the application asked for. */
struct svc_revnat_key {
	__u64 cookie;
	__u32 ip4;
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* The IPv6 maps' layouts (svc_services6, svc_backends6 under svc_backend_key, svc_revnat6):
 * the IPv4 ones with 16-byte addresses, as four words in network order. */
struct svc_key6 {
	__u32 ip6[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

struct svc_backend6 {
	__u32 ip6[4];
	__u16 port;
	__u16 pad;
};

struct svc_revnat_key6 {
	__u64 cookie;
	__u32 ip6[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

#endif /* __RAMPART_SERVICE_H */
