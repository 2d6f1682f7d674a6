/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* CIDR sets: up to RAMPART_CIDR_SETS named lists of prefixes (threat lists of millions of
 * entries), each with the fixed identity ID_CIDR_SET_FIRST + index. The membership of an
 * address is a u32 mask (bit i: the address is in set i), computed in constant time
 * whatever the number of prefixes:
 *
 *   IPv4: top[bank][a >> 8] | host_lookup(bank, a)
 *     top   one u32 per /24 (2^24 rows): prefixes /0../24 are expanded into the rows they
 *           cover;
 *     host  open-addressing hash table of {addr, mask} slots: prefixes /25../32 expanded
 *           to addresses; linear probing, at most CIDR_MAX_PROBE slots (the agent places
 *           every entry that close to its home slot); a slot of 0 is empty, a slot with an
 *           address and mask 0 is a removed entry that probes continue past.
 *   Each table of each bank is its own array map, reached through the map-in-map arrays
 *   cidr4_top and cidr4_host (index: the bank), and exists only when the bank's content
 *   needs it: no top table when no set has a prefix of /24 or shorter, no host table when
 *   none has a longer one, and the host table sized to its addresses. The agent creates
 *   the tables of the inactive bank, fills them, then switches cidr4_config.bank, so a
 *   reload never has a moment in which the tables are half written; after an RCU grace
 *   period it frees the old bank's tables. Single additions and removals change the
 *   active bank in place.
 *
 *   IPv6: the LPM trie cidr6 (see struct cidr6_key), one lookup. The IPv6 packet path is
 *   not enforced yet (IPv6 packets are dropped as unsupported), so only the agent reads it.
 *
 * The agent writes the arrays through mmap (BPF_F_MMAPABLE) with aligned 4- and 8-byte
 * stores; the program reads each slot with one 8-byte load, so it never sees half a slot. */
#ifndef __RAMPART_CIDRSET_H
#define __RAMPART_CIDRSET_H

#include "common.h"

/* Which bank is active, and each bank's host table size and hash seed (index 0). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cidr_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cidr4_config SEC(".maps");

/* One bank's top table: u32 row r is the r-th u32. Rows are packed in pairs into u64
 * elements because an ARRAY rounds every value up to 8 bytes: 2^24 rows x 4 bytes =
 * 64 MiB. Every top table has this size, so lookups in it are inlined array reads. */
struct cidr_top_bank {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, CIDR_TOP_ROWS / 2);
	__type(key, __u32);
	__type(value, __u64);
};

/* The top table of bank b at index b (empty: no set has a prefix of /24 or shorter). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 2);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct cidr_top_bank);
} cidr4_top SEC(".maps");

/* A bucket of host table slots: slot s of a table is slot[s % CIDR_HOST_BUCKET] of
 * element s / CIDR_HOST_BUCKET, a u64 with the address (host order) in the low 32 bits and
 * the set mask in the high 32 bits; through mmap the table is one array of slots. A probe
 * reads slots within a bucket through one element pointer: a table of variable size
 * (BPF_F_INNER_MAP) is looked up by a helper call, not inlined, so one call per bucket
 * rather than per slot. */
struct cidr_host_bucket {
	__u64 slot[CIDR_HOST_BUCKET];
};
/* A global of the type makes clang emit the bucket's full BTF (a type reached only from an
 * inner map's definition is emitted as a forward declaration, which has no size). */
const struct cidr_host_bucket *unused_cidr_host_bucket __attribute__((unused));

/* One bank's host table. The agent creates it with as many buckets as the bank's
 * addresses need (BPF_F_INNER_MAP: tables of any size can take the place of this
 * template). */
struct cidr_host_bank {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE | BPF_F_INNER_MAP);
	__uint(max_entries, CIDR_HOST_MIN_SLOTS / CIDR_HOST_BUCKET);
	__type(key, __u32);
	__type(value, struct cidr_host_bucket);
};

/* The host table of bank b at index b (empty: no set has a prefix longer than /24). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 2);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct cidr_host_bank);
} cidr4_host SEC(".maps");

/* IPv6 prefixes -> set mask (longest match). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, RAMPART_CIDR6_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cidr6_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cidr6 SEC(".maps");

/* cidr_hash mixes an address with the bank's seed (lowbias32, a bijective 32-bit mixer
 * whose high bits are well mixed, which the range reduction below uses). The seed makes
 * the slots an address lands in unpredictable, so a list cannot be crafted to collide.
 * The agent computes the same function (internal/datapath, cidrHash). */
static __always_inline __u32 cidr_hash(__u32 a, __u32 seed)
{
	__u32 x = a ^ seed;

	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

/* host_lookup returns the set mask of address a (host order, not 0) in the host table
 * of slots slots (at most CIDR_MAX_PROBE slot reads, one helper call per bucket). */
static __always_inline __u32 host_lookup(void *table, __u32 a, __u32 slot, __u32 slots)
{
	struct cidr_host_bucket *b;
	__u32 i, k = slot / CIDR_HOST_BUCKET;
	__u64 v;

	b = bpf_map_lookup_elem(table, &k);
	for (i = 0; i < CIDR_MAX_PROBE; i++) {
		if (!b)
			return 0; /* outside the table: a corrupt configuration, nothing found */
		v = *(volatile __u64 *)&b->slot[slot & (CIDR_HOST_BUCKET - 1)];
		if (!v)
			return 0; /* empty slot: the address has no host entry */
		if ((__u32)v == a)
			return (__u32)(v >> 32);
		if (++slot >= slots) {
			slot = 0;
			k = 0;
			b = bpf_map_lookup_elem(table, &k);
		} else if (!(slot & (CIDR_HOST_BUCKET - 1))) {
			k = slot / CIDR_HOST_BUCKET;
			b = bpf_map_lookup_elem(table, &k);
		}
	}
	return 0;
}

/* cidr_sets4 returns the mask of the CIDR sets containing addr (IPv4, network order):
 * the config, the bank's two tables (map-in-map), a top row and at most CIDR_MAX_PROBE
 * slot reads. A global function, so the verifier checks it (and its probe loop) once on
 * its own rather than at every call site. */
__attribute__((noinline)) __u32 cidr_sets4(__be32 addr)
{
	struct cidr_config *cfg;
	__u32 zero = 0, bank, mask = 0, a = bpf_ntohl(addr), slots, slot;
	void *table;
	__u64 *top;

	cfg = bpf_map_lookup_elem(&cidr4_config, &zero);
	if (!cfg)
		return 0;
	bank = *(volatile __u32 *)&cfg->bank & 1;

	/* The outer maps' keys are copies: bank itself is not address-taken, so it stays a
	 * bounded register the verifier accepts as an index into cfg's arrays. */
	table = bpf_map_lookup_elem(&cidr4_top, &(__u32){ bank });
	if (table) {
		top = bpf_map_lookup_elem(table, &(__u32){ a >> 9 });
		if (top)
			mask = (__u32)(*(volatile __u64 *)top >> (((a >> 8) & 1) * 32));
	}

	if (a == 0)
		return mask | *(volatile __u32 *)&cfg->zero_mask[bank];
	slots = *(volatile __u32 *)&cfg->host_slots[bank];
	if (!slots)
		return mask;
	table = bpf_map_lookup_elem(&cidr4_host, &(__u32){ bank });
	if (!table)
		return mask;
	/* Home slot: the hash scaled to [0, slots) (multiply-shift, no division). */
	slot = (__u32)(((__u64)cidr_hash(a, *(volatile __u32 *)&cfg->seed[bank]) * slots) >> 32);
	return mask | host_lookup(table, a, slot, slots);
}

#endif /* __RAMPART_CIDRSET_H */
