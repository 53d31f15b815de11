/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* netpol.h: the Kubernetes NetworkPolicy layer (docs/kubernetes.md "NetworkPolicy").
 * Per (zone, pod address): whether the pod is isolated for ingress and for egress, and the
 * rule set of each isolated direction (allow-lists: remote prefix, protocol, destination
 * port range). A new flow passes only if the sender, when isolated for egress, has an
 * egress rule matching the receiver, and the receiver, when isolated for ingress, has an
 * ingress rule matching the sender; this is ANDed with the endpoint-group verdict. Rule
 * sets are shared by pods whose compiled rules are equal (cb_ksets, by id; 0 = none). */
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

struct cb_kmatch_ctx {
	const struct cb_kset *set;
	__be32 remote;
	__u16 dport;    /* host order; 0 = the packet has no ports */
	__u8 proto;
	__u8 found;
};

static long cb_krule_step(__u32 i, void *data)
{
	struct cb_kmatch_ctx *c = data;
	const struct cb_krule *r;

	if (i >= CB_MAX_KRULES)
		return 1;
	r = &c->set->rules[i];
	if ((c->remote & r->remote_mask) != r->remote_ip)
		return 0;
	if (r->proto && r->proto != c->proto)
		return 0;
	if (r->port_min && (c->dport < r->port_min || c->dport > r->port_max))
		return 0;
	c->found = 1;
	return 1;
}

/* cb_kset_allows says whether rule set id (0: none) has a rule for a flow of protocol
 * proto to destination port dport (host order, 0: none) whose other end is remote. A
 * global function: verified once. */
__noinline int cb_kset_allows(__u32 id, __u32 remote, __u32 proto, __u32 dport)
{
	struct cb_kmatch_ctx c = {};
	struct cb_kset *set;
	__u32 n;

	if (!id)
		return 0;
	set = bpf_map_lookup_elem(&cb_ksets, &id);
	if (!set)
		return 0;
	n = set->count;
	if (n > CB_MAX_KRULES)
		n = CB_MAX_KRULES;
	c.set = set;
	c.remote = remote;
	c.proto = proto;
	c.dport = dport;
	bpf_loop(n, cb_krule_step, &c, 0);
	return c.found;
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
