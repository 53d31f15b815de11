/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* netpol.h: the Kubernetes NetworkPolicy layer (docs/kubernetes.md "NetworkPolicy").
 * Per (zone, pod address): whether the pod is isolated for ingress and for egress, and the
 * rule set of each isolated direction (allow-lists: remote prefix, protocol, destination
 * port range). A new flow passes only if the sender, when isolated for egress, has an
 * egress rule matching the receiver, and the receiver, when isolated for ingress, has an
 * ingress rule matching the sender; this is ANDed with the endpoint-group verdict. Rule
 * sets are shared by pods whose compiled rules are equal (cb_ksets, by id; 0 = none), and
 * looked up in their compiled form (below), never scanned. */
#pragma once

#include "common.h"
#include "parse.h"

#define CB_MAX_KRULES 1024

enum cb_kpod_flags {
	CB_KPOD_IN_ISOLATED = 1,
	CB_KPOD_OUT_ISOLATED = 2,
};

struct cb_kpod_key {
	__u32 zone;
	__be32 addr;
};

struct cb_kpod {
	__u32 flags;     /* enum cb_kpod_flags */
	__u32 in_set;    /* cb_ksets id of the ingress rules, 0 = none (isolated: deny all) */
	__u32 out_set;   /* likewise for egress */
	__u32 generation;
};

struct cb_krule {
	__be32 remote_ip;   /* masked prefix; 0/0 = anywhere */
	__be32 remote_mask;
	__u16 port_min;     /* destination port range, host order; 0 = any port */
	__u16 port_max;
	__u8 proto;         /* 0 = any */
	__u8 pad[3];
};

struct cb_kset {
	__u32 count;
	__u32 generation;
	struct cb_krule rules[CB_MAX_KRULES];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_kpod_key);
	__type(value, struct cb_kpod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_kpods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cb_kset);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ksets SEC(".maps");

CB_INLINE struct cb_kpod *cb_kpod_of(__u32 zone, __be32 addr)
{
	struct cb_kpod_key k = {.zone = zone, .addr = addr};

	return bpf_map_lookup_elem(&cb_kpods, &k);
}

/* Compiled rule sets. The programs never scan a set: the agent compiles each set of
 * cb_ksets (which stays the record: listings, verify, a start's recompile) into
 * cb_kset_heads and cb_kcidrs. A rule's destination port range is cut into aligned blocks
 * (2^k ports from a multiple of 2^k, k = 0..16; "any port" is the one block of k = 16),
 * and every (set, protocol or 0 for any, k, block) holds the rule's remote prefix in the
 * LPM trie. A port p lies in block p >> k of each size k: a flow is allowed when, for a
 * size the set uses, the longest-prefix lookup of (set, protocol, k, p >> k, remote)
 * finds a prefix, with its own protocol or with 0. At most 2 x 17 lookups whatever the
 * number of rules (a set of single ports and "any": one or two). A set's entries are all
 * written before its head, and its head goes before its entries: a half-written or
 * half-deleted set admits no more than the whole one, and a pod points at a set only once
 * it is written (netpol.go). */
struct cb_kset_head {
	__u32 sizes;      /* bit k: blocks of 2^k ports under a protocol */
	__u32 sizes_any;  /* bit k: blocks of 2^k ports for any protocol */
	__u32 generation;
	__u32 pad;
};

struct cb_kcidr_key {
	__u32 prefixlen;  /* 64 + the remote prefix's length */
	__u32 set;
	__u16 block;      /* port >> k */
	__u8 proto;       /* 0: any */
	__u8 k;
	__be32 remote;
};

struct cb_kcidr {
	__u32 generation;
};

#define CB_KCIDR_FIXED_BITS 64

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct cb_kset_head);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_kset_heads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_kcidr_key);
	__type(value, struct cb_kcidr);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_kcidrs SEC(".maps");

/* cb_kset_allows says whether rule set id (0: none) has a rule for a flow of protocol
 * proto to destination port dport (host order, 0: none) whose other end is remote. A
 * global function: verified once. */
__noinline int cb_kset_allows(__u32 id, __u32 remote, __u32 proto, __u32 dport)
{
	struct cb_kcidr_key k = {};
	struct cb_kset_head *h;
	__u32 sizes, any, i;

	if (!id)
		return 0;
	h = bpf_map_lookup_elem(&cb_kset_heads, &id);
	if (!h)
		return 0;
	k.prefixlen = CB_KCIDR_FIXED_BITS + 32;
	k.set = id;
	k.remote = remote;
	for (any = 0; any < 2; any++) {
		sizes = any ? h->sizes_any : h->sizes;
		k.proto = any ? 0 : (__u8)proto;
		if (!any && !k.proto)
			continue;
		for (i = 0; i <= 16; i++) {
			if (!(sizes & (1u << i)))
				continue;
			k.k = i;
			k.block = (__u16)((dport & 0xffff) >> i);
			if (bpf_map_lookup_elem(&cb_kcidrs, &k))
				return 1;
		}
	}
	return 0;
}

/* cb_netpol_judge decides the NetworkPolicy layer for the flow of packet f as an opening,
 * in the packet's own orientation or (reverse=1) in the other one, in zone: 1 allowed. */
static __noinline int cb_netpol_judge(const struct cb_flow *f, __u32 zone, int reverse)
{
	__be32 saddr, daddr;
	__u16 dport = 0;
	struct cb_kpod *p;

	if (!f)
		return 0;
	saddr = reverse ? f->daddr : f->saddr;
	daddr = reverse ? f->saddr : f->daddr;
	if (f->has_ports)
		dport = bpf_ntohs(reverse ? f->sport : f->dport);
	p = cb_kpod_of(zone, saddr);
	if (p && (p->flags & CB_KPOD_OUT_ISOLATED) && !cb_kset_allows(p->out_set, daddr, f->proto, dport))
		return 0;
	p = cb_kpod_of(zone, daddr);
	if (p && (p->flags & CB_KPOD_IN_ISOLATED) && !cb_kset_allows(p->in_set, saddr, f->proto, dport))
		return 0;
	return 1;
}
