/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The flow cache: a small direct-mapped table in front of conntrack, for the packets of
 * established flows.
 *
 * Why. At low packet rates (a ping every millisecond) every memory access of a packet's
 * run is a cache miss, and a conntrack lookup is several in a row: the LRU hash's bucket
 * and then its element, both in memory the kernel maps with 4 KiB pages (vmalloc), so each
 * also costs a page-table walk, and all of it after the endpoint slot's miss, because the
 * conntrack key holds the endpoint's id. The cache is an array small enough (under 32 KiB)
 * for the kernel to allocate it from its linear mapping, whose large pages are nearly
 * always in the TLB; a packet finds its slot from its interface and tuple alone, so the
 * slot's miss overlaps the endpoint slot's; and a hit reads one cache line.
 *
 * What an entry says: at jiffy `synced`, conntrack held a live entry for this flow at the
 * policy point of interface `ifindex`, checked against check revision `revision` (policy
 * revision plus ipcache generation, conntrack.h) and, for packets that entered from the
 * overlay, the VNI's identity in `proto_tunnel`, in a state no packet without SYN, FIN or
 * RST can change (reply seen; no FIN, no RST, no proxy or send-side verdict flag). A
 * packet that
 *   - finds its flow's entry, synced less than flow_cache_window jiffies ago,
 *   - with its packet's check revision and VNI identity (pkt.tunnel_id),
 *   - and is not a TCP segment with SYN, FIN or RST, nor an ICMP error or non-echo ICMP,
 * is a packet the conntrack lookup would pass without changing anything, and it passes
 * without that lookup. Every other packet takes the conntrack path, which refills the
 * slot (flow_cache_fill) when the flow qualifies: so a flow's conntrack entry is touched
 * at least once a window while the flow is active.
 *
 * Why that is safe:
 *   - Policy changes: the agent bumps the endpoint's revision, which no entry checked
 *     against the old policy carries; the flow's next packet is checked again
 *     (recheck_established) before its slot is refilled.
 *   - Identity changes: an address whose ipcache identity changes bumps the ipcache
 *     generation, part of the check revision; a packet whose VNI carries another identity
 *     than the one its flow was checked with is another entry. Either way the packet
 *     takes the conntrack path, where its flow is checked again on the peer's identity.
 *   - Expiry: the window is at most a sixteenth of the shortest conntrack timeout (the
 *     agent sets it; 0 turns the cache off), and ct_live gives entries with a reply seen a
 *     window of slack, so a flow served from the cache always still has its conntrack entry
 *     (whose last_seen may lag its last packet by up to a window).
 *   - Endpoint removal: its interface's endpoint slot goes first, and its packets drop
 *     before they reach the cache. The agent hands out revisions from one counter, never
 *     twice, and the ipcache generation only grows, so the check revision of an endpoint
 *     installed later on the same interface never matches the entries of the one before.
 *   - Restarts: the map is not pinned; each load of the programs starts with an empty
 *     cache that only those programs write.
 *   - RST or FIN: such packets take the conntrack path and clear the flow's slot
 *     (flow_cache_forget); a fresh SYN reusing a closed tuple never hits the cache.
 *   - Conntrack evicting an entry when its table is full (LRU) is the one case in which
 *     the cache passes a flow conntrack no longer holds, for at most a window; the flow
 *     was allowed by the policy still in force.
 *
 * Concurrency: the programs on other CPUs read and write the same slots. A writer takes a
 * slot by moving its sequence count from even to odd (compare-and-swap: one writer at a
 * time), writes, and makes it even again; a reader reads the count, the entry, and the
 * count again, and uses the entry only if both counts are the same even number. This
 * relies on loads being seen in order and stores being seen in order, which x86 gives
 * (as the endpoint slots do, maps.h); the volatile accesses keep the compiler from
 * reordering them. On other architectures the agent sets no window: the cache stays off. */
#ifndef __RAMPART_FLOWCACHE_H
#define __RAMPART_FLOWCACHE_H

#include "common.h"
#include "maps.h"
#include "parse.h"

/* Set at load time by the agent (datapath.setFlowCache). flow_cache_window is in jiffies;
 * 0, the compiled default, turns the cache off. flow_cache_offset is where in its 64-byte
 * slot an entry starts (0 to 32, a multiple of 8): the kernel's array header is not a
 * whole number of cache lines, and the offset puts each entry in one line. */
const volatile __u32 flow_cache_window = 0;
const volatile __u32 flow_cache_offset = 0;

#define FC_READ(x) (*(volatile typeof(x) *)&(x))
#define FC_WRITE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#define fc_barrier() asm volatile("" ::: "memory")

/* The entry's words, as the reader compares them: the entry is read as four 8-byte
 * words (seq and synced; ifindex and revision; the addresses; the ports, protocol and VNI
 * identity). */
struct fc_words {
	__u64 w[4];
};

/* flow_cache_want fills the words a slot holds for the flow of p at interface ifindex in
 * direction dir (oriented from the endpoint's side, as conntrack keys are); word 0 and the
 * revision are left for the caller. */
static __always_inline void flow_cache_want(struct flow_cache_entry *want, const struct pkt *p,
					    __u32 ifindex, __u8 dir)
{
	__builtin_memset(want, 0, sizeof(*want));
	want->ifindex = ifindex;
	if (dir == DIR_EGRESS) {
		want->laddr = p->t.saddr;
		want->raddr = p->t.daddr;
		want->lport = p->t.sport;
		want->rport = p->t.dport;
	} else {
		want->laddr = p->t.daddr;
		want->raddr = p->t.saddr;
		want->lport = p->t.dport;
		want->rport = p->t.sport;
	}
	want->proto_tunnel = p->t.proto | (p->tunnel_id << 8);
}

/* flow_cache_slot_of returns the entry the flow in want maps to. Its address depends only
 * on the packet, so the caller can load from it before the endpoint lookup: both misses
 * are then in flight at once. */
static __always_inline struct flow_cache_entry *flow_cache_slot_of(const struct flow_cache_entry *want)
{
	__u32 h, idx, off;
	__u8 *slot;

	h = want->laddr * 0x9E3779B1u;
	h ^= want->raddr * 0x85EBCA77u;
	h ^= (((__u32)want->lport << 16) | want->rport) * 0xC2B2AE3Du;
	h ^= (want->ifindex ^ (want->proto_tunnel << 24)) * 0x27D4EB2Fu;
	h ^= h >> 15;
	/* Range reduction by multiplication: any slot count, no modulo. */
	idx = (__u32)(((__u64)h * RAMPART_FLOW_CACHE_SLOTS) >> 32);
	slot = bpf_map_lookup_elem(&flow_cache, &idx);
	if (!slot)
		return 0;
	off = flow_cache_offset;
	if (off > RAMPART_FLOW_CACHE_SLOT_BYTES - sizeof(struct flow_cache_entry))
		off = 0;
	return (struct flow_cache_entry *)(slot + (off & ~7u));
}

/* flow_cache_eligible says whether packet p may be served from the cache, and whether its
 * flow may be cached after it: TCP segments that open or close (SYN, FIN, RST) and ICMP
 * other than echo always take the conntrack path. */
static __always_inline int flow_cache_eligible(const struct pkt *p)
{
	if (p->t.proto == IPPROTO_TCP)
		return !(p->tcp_flags & (TCP_F_SYN | TCP_F_FIN | TCP_F_RST));
	return p->icmp_kind != ICMP_K_ERROR && p->icmp_kind != ICMP_K_OTHER;
}

/* flow_cache_hit says whether e, whose word 0 the caller read earlier as w0, holds the
 * flow in want, checked against revision, and synced less than a window before now. */
static __always_inline int flow_cache_hit(struct flow_cache_entry *e, __u64 w0,
					  const struct flow_cache_entry *want, __u32 revision,
					  __u64 now)
{
	struct fc_words *ew = (struct fc_words *)e;
	const struct fc_words *ww = (const struct fc_words *)want;
	__u32 seq = (__u32)w0, synced = (__u32)(w0 >> 32);

	if (seq & 1)
		return 0;
	if ((__u32)now - synced >= flow_cache_window)
		return 0;
	if (FC_READ(ew->w[1]) != (ww->w[1] | ((__u64)revision << 32)))
		return 0;
	if (FC_READ(ew->w[2]) != ww->w[2] || FC_READ(ew->w[3]) != ww->w[3])
		return 0;
	/* Nothing was written in between: the words read belong together. */
	return FC_READ(e->seq) == seq;
}

static __always_inline int flow_cache_same_flow(struct flow_cache_entry *e,
						const struct flow_cache_entry *want)
{
	struct fc_words *ew = (struct fc_words *)e;
	const struct fc_words *ww = (const struct fc_words *)want;

	return FC_READ(e->ifindex) == want->ifindex && FC_READ(ew->w[2]) == ww->w[2] &&
	       FC_READ(ew->w[3]) == ww->w[3];
}

/* flow_cache_fill records that conntrack just confirmed the flow in want, checked against
 * revision, in a cacheable state. A slot holding another flow synced within the window is
 * left alone: two busy flows sharing a slot then do not take turns writing it. Out of
 * line: it runs once a window per flow. */
static __noinline void flow_cache_fill(struct flow_cache_entry *e, const struct flow_cache_entry *want,
				       __u32 revision, __u64 now)
{
	__u32 seq = FC_READ(e->seq);

	if (seq & 1)
		return;
	if (FC_READ(e->ifindex) && (__u32)now - FC_READ(e->synced) < flow_cache_window &&
	    !flow_cache_same_flow(e, want))
		return;
	if (__sync_val_compare_and_swap(&e->seq, seq, seq + 1) != seq)
		return; /* another CPU is writing it */
	FC_WRITE(e->synced, (__u32)now);
	FC_WRITE(e->ifindex, want->ifindex);
	FC_WRITE(e->revision, revision);
	FC_WRITE(e->laddr, want->laddr);
	FC_WRITE(e->raddr, want->raddr);
	FC_WRITE(e->lport, want->lport);
	FC_WRITE(e->rport, want->rport);
	FC_WRITE(e->proto_tunnel, want->proto_tunnel);
	fc_barrier();
	FC_WRITE(e->seq, seq + 2);
}

/* flow_cache_forget empties the slot if it holds the flow in want: a FIN or RST is
 * changing the flow's state. */
static __noinline void flow_cache_forget(struct flow_cache_entry *e, const struct flow_cache_entry *want)
{
	__u32 seq = FC_READ(e->seq);

	if (seq & 1 || !flow_cache_same_flow(e, want))
		return;
	if (__sync_val_compare_and_swap(&e->seq, seq, seq + 1) != seq)
		return;
	FC_WRITE(e->ifindex, 0);
	fc_barrier();
	FC_WRITE(e->seq, seq + 2);
}

/* flow_cache_cacheable says whether conntrack entry v, just found live for packet p, may be
 * cached: checked against the packet's check revision, and, for a packet in the flow's own
 * direction (established), with the packet's tunnel_id. Replies are not checked (they
 * follow their flow), so theirs does not matter. */
static __always_inline int flow_cache_cacheable(const struct ct_value *v, const struct pkt *p,
						__u32 revision, int established)
{
	return v->flags == CT_F_SEEN_REPLY && v->revision == revision &&
	       (!established || v->tunnel_id == p->tunnel_id);
}

#endif /* __RAMPART_FLOWCACHE_H */
