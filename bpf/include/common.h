/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Common includes, constants and tunables of the Rampart dataplane. */
#ifndef __RAMPART_COMMON_H
#define __RAMPART_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "rampart.h"

#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP 132
#endif

/* Size of the flow event ring buffer in bytes (a power of two, multiple of the page size). */
#ifndef RAMPART_EVENTS_RING_BYTES
#define RAMPART_EVENTS_RING_BYTES (1 << 20)
#endif
/* The event that fills this much of the ring wakes the agent (events.h, emit_event). */
#define RAMPART_EVENTS_WAKE (RAMPART_EVENTS_RING_BYTES / 4)

/* Conntrack timeouts in seconds. They are compiled in as defaults of read-only globals, so
 * the agent can override them at load time (datapath.Config.CTTimeouts) without a rebuild. */
#ifndef CT_TIMEOUT_TCP_SYN_S
#define CT_TIMEOUT_TCP_SYN_S 60 /* TCP flow whose peer has not answered yet */
#endif
#ifndef CT_TIMEOUT_TCP_ESTABLISHED_S
#define CT_TIMEOUT_TCP_ESTABLISHED_S 21600 /* 6h idle, TCP with a reply seen */
#endif
#ifndef CT_TIMEOUT_TCP_CLOSING_S
#define CT_TIMEOUT_TCP_CLOSING_S 10 /* after RST, or FIN in both directions */
#endif
#ifndef CT_TIMEOUT_OTHER_S
#define CT_TIMEOUT_OTHER_S 60 /* UDP, SCTP, ICMP echo and other protocols */
#endif

/* Conntrack times are in jiffies, whose rate (HZ, 100 to 1000 a second) the kernel's
 * configuration sets. The agent always sets the timeouts from the running kernel's tick
 * (datapath.setTimeouts); the compiled defaults assume the lowest rate, so that a program
 * loaded without them would check flows again sooner than configured, never later. */
#define RAMPART_DEFAULT_HZ 100ULL

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* Branch hints. A packet of an established flow runs a few hundred bytes of code, and at
 * low packet rates (a ping a millisecond) each of its cache lines is a miss: the hints
 * keep the rare branches out of that path, and the rare work itself lives in __noinline
 * functions, which the JIT places apart from the program's hot path. */
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* A global subprogram's pointer argument that is never NULL (the kernel reads the tag, so
 * the function needs no NULL check before using it). */
#ifndef __arg_nonnull
#define __arg_nonnull __attribute__((btf_decl_tag("arg:nonnull")))
#endif

#endif /* __RAMPART_COMMON_H */
