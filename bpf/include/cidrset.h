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

/* One bank's host table: slot s is element s, a u64 with the address (host order) in the
 * low 32 bits and the set mask in the high 32 bits. The agent creates it with as many
 * slots as the bank's addresses need (BPF_F_INNER_MAP: tables of any size can take the
 * place of this template). */
struct cidr_host_bank {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE | BPF_F_INNER_MAP);
	__uint(max_entries, CIDR_HOST_MIN_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
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

struct host_probe {
	void *table; /* the bank's host table */
	__u32 a;     /* address looked up (host order) */
	__u32 slot;  /* next slot to read */
	__u32 slots; /* table size */
	__u32 mask;  /* result */
};

/* host_probe_step reads one slot of the probe sequence (a bpf_loop step). */
static long host_probe_step(__u64 i, void *arg)
{
	struct host_probe *p = arg;
	__u64 *sp, v;

	sp = bpf_map_lookup_elem(p->table, &p->slot);
	if (!sp)
		return 1; /* outside the table: a corrupt configuration, nothing found */
	v = *(volatile __u64 *)sp;
	if (!v)
		return 1; /* empty slot: the address has no host entry */
	if ((__u32)v == p->a) {
		p->mask = (__u32)(v >> 32);
		return 1;
	}
	if (++p->slot >= p->slots)
		p->slot = 0;
	return 0;
}

/* cidr_sets4 returns the mask of the CIDR sets containing addr (IPv4, network order):
 * the config, the bank's two tables (map-in-map), a top row and at most CIDR_MAX_PROBE
 * slot reads. A global function, so the verifier checks it once on its own rather than at
 * every call site, and the probe loop runs through bpf_loop, whose step is checked once
 * rather than per iteration. */
__attribute__((noinline)) __u32 cidr_sets4(__be32 addr)
{
	struct cidr_config *cfg;
	struct host_probe p = { .a = bpf_ntohl(addr) };
	__u32 zero = 0, bank, mask = 0;
	void *table;
	__u64 *top;

	cfg = bpf_map_lookup_elem(&cidr4_config, &zero);
	if (!cfg)
		return 0;
	bank = *(volatile __u32 *)&cfg->bank & 1;

	table = bpf_map_lookup_elem(&cidr4_top, &bank);
	if (table) {
		top = bpf_map_lookup_elem(table, &(__u32){ p.a >> 9 });
		if (top)
			mask = (__u32)(*(volatile __u64 *)top >> (((p.a >> 8) & 1) * 32));
	}

	if (p.a == 0)
		return mask | *(volatile __u32 *)&cfg->zero_mask[bank];
	p.slots = *(volatile __u32 *)&cfg->host_slots[bank];
	if (!p.slots)
		return mask;
	p.table = bpf_map_lookup_elem(&cidr4_host, &bank);
	if (!p.table)
		return mask;
	/* Home slot: the hash scaled to [0, slots) (multiply-shift, no division). */
	p.slot = (__u32)(((__u64)cidr_hash(p.a, *(volatile __u32 *)&cfg->seed[bank]) * p.slots) >> 32);
	bpf_loop(CIDR_MAX_PROBE, host_probe_step, &p, 0);
	return mask | p.mask;
}

#endif /* __RAMPART_CIDRSET_H */
