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
const volatile __u32 flow_cache6_offset = 0; /* the same for flow_cache6's 128-byte slots */

#define FC_READ(x) (*(volatile typeof(x) *)&(x))
#define FC_WRITE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#define fc_barrier() asm volatile("" ::: "memory")

/* An entry as the reader compares it: 8-byte words, the same first two in both families
 * (seq and synced; ifindex and revision), then the flow (the addresses, then the ports,
 * protocol and VNI identity): four words for IPv4, seven for IPv6. */
#define FC_WORDS 4
#define FC6_WORDS 7

struct fc_words {
	__u64 w[FC6_WORDS];
};

/* fc_slot returns the entry in slot idx of cache (flow_cache or flow_cache6, whose slots
 * are slot_bytes long), at byte off of the slot (clamped so that an entry of entry_bytes
 * stays in the slot). */
static __always_inline void *fc_slot(void *cache, __u32 idx, __u32 off, __u32 slot_bytes,
				     __u32 entry_bytes)
{
	__u8 *slot = bpf_map_lookup_elem(cache, &idx);

	if (!slot)
		return 0;
	if (off > slot_bytes - entry_bytes)
		off = 0;
	return slot + (off & ~7u);
}

/* fc_eligible says whether a packet may be served from the cache, and whether its flow
 * may be cached after it: TCP segments that open or close (SYN, FIN, RST) and ICMP other
 * than echo always take the conntrack path. */
static __always_inline int fc_eligible(__u8 proto, __u8 tcp_flags, __u8 icmp_kind)
{
	if (proto == IPPROTO_TCP)
		return !(tcp_flags & (TCP_F_SYN | TCP_F_FIN | TCP_F_RST));
	return icmp_kind != ICMP_K_ERROR && icmp_kind != ICMP_K_OTHER;
}

/* fc_hit says whether the entry at e (n words), whose word 0 the caller read earlier as
 * w0, holds the flow in want, checked against revision, and synced less than a window
 * before now. */
static __always_inline int fc_hit(void *e, __u64 w0, const void *want, const int n,
				  __u32 revision, __u64 now)
{
	struct fc_words *ew = e;
	const struct fc_words *ww = want;
	__u32 seq = (__u32)w0, synced = (__u32)(w0 >> 32);

	if (seq & 1)
		return 0;
	if ((__u32)now - synced >= flow_cache_window)
		return 0;
	if (FC_READ(ew->w[1]) != (ww->w[1] | ((__u64)revision << 32)))
		return 0;
#pragma unroll
	for (int i = 2; i < n; i++)
		if (FC_READ(ew->w[i]) != ww->w[i])
			return 0;
	/* Nothing was written in between: the words read belong together. */
	return (__u32)FC_READ(ew->w[0]) == seq;
}

/* fc_hit_checked finishes the hit test of an entry at e whose flow the caller found to be
 * the packet's (fc_same_flow) after reading word 0 as w0: checked against revision,
 * synced less than a window before now, and nothing written since w0 was read. */
static __always_inline int fc_hit_checked(void *e, __u64 w0, __u32 revision, __u64 now)
{
	struct fc_words *ew = e;
	__u32 seq = (__u32)w0, synced = (__u32)(w0 >> 32);

	if (seq & 1)
		return 0;
	if ((__u32)now - synced >= flow_cache_window)
		return 0;
	if ((__u32)(FC_READ(ew->w[1]) >> 32) != revision)
		return 0;
	return (__u32)FC_READ(ew->w[0]) == seq;
}

/* fc_same_flow says whether the entry at e holds the flow in want (any revision). */
static __always_inline int fc_same_flow(void *e, const void *want, const int n)
{
	struct fc_words *ew = e;
	const struct fc_words *ww = want;

	if ((__u32)FC_READ(ew->w[1]) != (__u32)ww->w[1])
		return 0;
#pragma unroll
	for (int i = 2; i < n; i++)
		if (FC_READ(ew->w[i]) != ww->w[i])
			return 0;
	return 1;
}

/* fc_fill records in the entry at e that conntrack just confirmed the flow in want,
 * checked against revision, in a cacheable state. A slot holding another flow synced
 * within the window is left alone: two busy flows sharing a slot then do not take turns
 * writing it. */
static __always_inline void fc_fill(void *e, const void *want, const int n, __u32 revision,
				    __u64 now)
{
	struct fc_words *ew = e;
	const struct fc_words *ww = want;
	__u32 *seqp = e, *syncedp = (__u32 *)e + 1;
	__u32 seq = FC_READ(*seqp);

	if (seq & 1)
		return;
	if ((__u32)FC_READ(ew->w[1]) && (__u32)now - FC_READ(*syncedp) < flow_cache_window &&
	    !fc_same_flow(e, want, n))
		return;
	if (__sync_val_compare_and_swap(seqp, seq, seq + 1) != seq)
		return; /* another CPU is writing it */
	FC_WRITE(*syncedp, (__u32)now);
	FC_WRITE(ew->w[1], ww->w[1] | ((__u64)revision << 32));
#pragma unroll
	for (int i = 2; i < n; i++)
		FC_WRITE(ew->w[i], ww->w[i]);
	fc_barrier();
	FC_WRITE(*seqp, seq + 2);
}

/* fc_forget empties the entry at e if it holds the flow in want: a FIN or RST is
 * changing the flow's state. */
static __always_inline void fc_forget(void *e, const void *want, const int n)
{
	struct fc_words *ew = e;
	__u32 *seqp = e;
	__u32 seq = FC_READ(*seqp);

	if (seq & 1 || !fc_same_flow(e, want, n))
		return;
	if (__sync_val_compare_and_swap(seqp, seq, seq + 1) != seq)
		return;
	FC_WRITE(ew->w[1], 0);
	fc_barrier();
	FC_WRITE(*seqp, seq + 2);
}

/* flow_cache_cacheable says whether conntrack entry v, just found live for a packet
 * with check revision revision and VNI identity tunnel_id, may be cached: checked against
 * that revision, and, for a packet in the flow's own direction (established), with that
 * tunnel_id. Replies are not checked (they follow their flow), so theirs does not
 * matter. */
static __always_inline int flow_cache_cacheable(const struct ct_value *v, __u32 tunnel_id,
						__u32 revision, int established)
{
	return v->flags == CT_F_SEEN_REPLY && v->revision == revision &&
	       (!established || v->tunnel_id == tunnel_id);
}

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

/* fc_mix is the slot hash's last steps: the ports, interface, protocol and VNI identity
 * mixed into h, h reduced to a slot index of slots by multiplication (any slot count, no
 * modulo). */
static __always_inline __u32 fc_mix(__u32 h, __be16 lport, __be16 rport, __u32 ifindex,
				    __u32 proto_tunnel, __u32 slots)
{
	h ^= (((__u32)lport << 16) | rport) * 0xC2B2AE3Du;
	h ^= (ifindex ^ (proto_tunnel << 24)) * 0x27D4EB2Fu;
	h ^= h >> 15;
	return (__u32)(((__u64)h * slots) >> 32);
}

/* flow_cache_slot_of returns the entry the flow in want maps to. Its address depends only
 * on the packet, so the caller can load from it before the endpoint lookup: both misses
 * are then in flight at once. */
static __always_inline struct flow_cache_entry *flow_cache_slot_of(const struct flow_cache_entry *want)
{
	__u32 h = want->laddr * 0x9E3779B1u ^ want->raddr * 0x85EBCA77u;

	return fc_slot(&flow_cache, fc_mix(h, want->lport, want->rport, want->ifindex,
					   want->proto_tunnel, RAMPART_FLOW_CACHE_SLOTS),
		       flow_cache_offset, RAMPART_FLOW_CACHE_SLOT_BYTES,
		       sizeof(struct flow_cache_entry));
}

/* flow_cache_eligible: fc_eligible for an IPv4 packet. */
static __always_inline int flow_cache_eligible(const struct pkt *p)
{
	return fc_eligible(p->t.proto, p->tcp_flags, p->icmp_kind);
}

/* flow_cache_hit: fc_hit for an IPv4 entry. */
static __always_inline int flow_cache_hit(struct flow_cache_entry *e, __u64 w0,
					  const struct flow_cache_entry *want, __u32 revision,
					  __u64 now)
{
	return fc_hit(e, w0, want, FC_WORDS, revision, now);
}

/* flow_cache_fill: fc_fill for an IPv4 entry. Out of line: it runs once a window per
 * flow. */
static __noinline void flow_cache_fill(struct flow_cache_entry *e, const struct flow_cache_entry *want,
				       __u32 revision, __u64 now)
{
	fc_fill(e, want, FC_WORDS, revision, now);
}

/* flow_cache_forget: fc_forget for an IPv4 entry. */
static __noinline void flow_cache_forget(struct flow_cache_entry *e, const struct flow_cache_entry *want)
{
	fc_forget(e, want, FC_WORDS);
}

#endif /* __RAMPART_FLOWCACHE_H */
