/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Layouts shared by the send-side L7 verdict (sockverdict.c), the tc programs that pin its
 * flows to their checked sockets, and the agent (internal/datapath, internal/l7table).
 * See docs/design-l7-send-side.md. */
#ifndef __RAMPART_SOCKVERDICT_H
#define __RAMPART_SOCKVERDICT_H

#include <linux/types.h>

#define SV_HEAD_MAX 2048 /* bytes of a request head the verdict reads (a power of two) */
#define SV_PATH_MAX 128  /* bytes of a path compared (l7table.PathMax) */
#define SV_HOST_MAX 64   /* bytes of a Host value compared (l7table.HostMax) */
#define SV_METHODS 7     /* GET HEAD POST PUT DELETE OPTIONS PATCH (l7table.Methods) */
#define SV_HDR_NAME 48   /* bytes of a header name compared (l7table.HeaderNameMax) */
#define SV_HDR_VALUE 64  /* bytes of a header value compared (l7table.HeaderValueMax) */
#define SV_EV_PATH 64    /* bytes of the path an event carries */
#define SV_EV_HOST 32    /* bytes of the host an event carries */
#define SV_CONNS_MAX 65536 /* connections under the verdict at once */

/* Sides of a connection's rules, and of a target. */
#define SV_SIDE_CLIENT 0 /* the client's egress rules; the client's socket */
#define SV_SIDE_SERVER 1 /* the server's ingress rules; the server's socket */

/* A connection between two local endpoints, as the client sees it; addresses in network
 * order, ports in host order. */
struct sv_conn_key {
	__u32 client_ip4;
	__u32 server_ip4;
	__u32 client_port;
	__u32 server_port;
};

/* Which sockets the verdict takes: one socket's namespace (cookie), its own address, the
 * peer's address and the server port. The agent writes one entry for the client's side and
 * one for the server's side of every pair of local endpoints whose rules compiled. */
struct sv_target_key {
	__u64 netns_cookie;
	__u32 local_ip4;
	__u32 remote_ip4;
	__u32 port; /* server port, host order */
	__u32 side; /* SV_SIDE_* */
};

struct sv_target {
	__u32 slot; /* index into sv_slots: the pair's current rule table */
	__u32 pad;
};

/* sv_slots[slot] is the id of the rule table a pair's connections are checked against now
 * (0: none, every request refused). A policy change writes a new table under a new id,
 * then switches the slot, so that a request never meets half of each. */
#define SV_SLOTS 16384

/* One bit per rule for each side (l7table.Masks). */
struct sv_masks {
	__u64 m[2];
};

/* A rule table's fixed part (l7table.Header). */
struct sv_table {
	struct sv_masks pass;
	struct sv_masks any_path;
	struct sv_masks any_host;
	struct sv_masks method[SV_METHODS];
	/* Header matches: the rules that have any, and each rule's requirement bits (all
	 * must be met by the request's header lines, see sv_header_key). */
	struct sv_masks header_rules;
	__u64 rule_reqs[2][64];
};

/* A header line's lookups: its name alone (presence 1: the name's own entry, with the
 * requirements that it be present), then its name and value. */
struct sv_header_key {
	__u32 table;
	__u8 presence;
	__u8 pad[3];
	char name[SV_HDR_NAME]; /* lower case, NUL-padded */
	char value[SV_HDR_VALUE];
};

struct sv_header_val {
	struct sv_masks reqs;
	/* On the name's own entry: the value requirements of the name, which a line with
	 * another value breaks (every line of a name must have the value). */
	struct sv_masks value_reqs;
};

/* LPM trie key: the table id then the path, NUL-padded. */
struct sv_path_key {
	__u32 prefixlen;
	__u32 table;
	__u8 path[SV_PATH_MAX];
};

struct sv_host_key {
	__u32 table;
	__u8 host[SV_HOST_MAX];
};

/* Connection flags. */
#define SV_C_SHUT 1 /* refused outside the subset: every later send fails */
#define SV_C_LOST 2 /* the tracker lost the response framing: refusals fail the send */
/* The server's socket is not under the tracker (yet: the client may send before the
 * server has processed the handshake's last ACK, on another CPU). */
#define SV_C_NO_TRACKER 4

/* Per-connection state, shared by the client's verdict and the server's tracker. */
struct sv_conn {
	__u32 slot;
	__u32 flags;
	__u64 passed;       /* requests passed */
	__u64 done;         /* responses the tracker saw whole */
	__u64 server_bytes; /* bytes the server sent */
	__u64 body_left;    /* bytes of a passed request's body still to come */
	/* The last passed request, reported with its response's status. */
	__u64 req_ns;
	__u32 table; /* the table that passed it */
	__u32 pad2;
	__u64 rules[2];
	__u8 pending; /* a passed request waits for its response */
	__u8 method;  /* index into the methods, SV_METHODS: none */
	__u8 pad[6];
	char path[SV_EV_PATH];
	char host[SV_EV_HOST];
};

/* What a sockverdict flow event says about the request. */
#define SV_V_PASSED 0
#define SV_V_REFUSED 1    /* no rule matched: 403 */
#define SV_V_MALFORMED 2  /* outside the subset: 400 and the connection is shut */
#define SV_V_SEND_FAILED 3 /* refused, but the 403 could not go in order: the send failed */

/* One request, for the flow stream. */
struct sv_event {
	__u64 ts_ns;
	__u64 latency_ns; /* request passed to response head; 0 if unknown */
	__u64 rules[2];   /* rules that matched, per side (a refusal: 0 on the side that refused) */
	__u32 client_ip4;
	__u32 server_ip4;
	__u16 client_port;
	__u16 server_port;
	__u32 table; /* the rule table that decided (0: none) */
	__u16 status; /* 0: unknown */
	__u8 method;  /* index, SV_METHODS: unknown */
	__u8 verdict; /* SV_V_* */
	__u32 pad;
	char path[SV_EV_PATH];
	char host[SV_EV_HOST];
};

/* What tc pins a flow to: the cookie of the client socket the verdict checks (key: the
 * flow's addresses and ports as in the packet). Written by sockops once the socket is in
 * the verdict's sockhash; a data packet of such a flow from any other socket is dropped. */
struct sv_flow_key {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
};

/* sv_flows is shared by the two objects through its pin (the same definition in both):
 * sockverdict.c writes each checked connection's client socket cookie, tc reads it. The
 * includer has bpf_helpers.h. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SV_CONNS_MAX);
	__type(key, struct sv_flow_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sv_flows SEC(".maps");

#endif /* __RAMPART_SOCKVERDICT_H */
