/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* native.h: native routing of routing-mode VLAN networks when the host speaks BGP
 * (docs/bgp.md). The agent's BGP speaker advertises its endpoints' /32 routes and writes
 * the routes it learns into cb_bgp_routes; packets of those networks to another host's
 * endpoint (or, with NAT off, to the outside) leave the uplink untagged towards the
 * learned next hop, and the uplink's untagged packets to local endpoints of those
 * networks are routed in (cb_native_rx in contivbpf.c). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"

struct cb_bgp_key {
	__u32 prefixlen; /* LPM trie: bits of addr that count */
	__be32 addr;
};

struct cb_bgp_route {
	__be32 nexthop;   /* on-link next hop (the neighbour's address) */
	__u32 ifindex;    /* the uplink it is reached by */
	__u32 generation; /* agent bookkeeping */
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_bgp_key);
	__type(value, struct cb_bgp_route);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_bgp_routes SEC(".maps");

#ifndef AF_INET
#define AF_INET 2
#endif

/* cb_native_out sends an already routed packet (TTL decremented) to daddr's learned next
 * hop; the kernel fills in both MACs from its neighbour table. No route: dropped, never
 * tagged or tunnelled instead. */
static __noinline int cb_native_out(struct __sk_buff *skb, __be32 daddr)
{
	struct cb_bgp_key k = {.prefixlen = 32, .addr = daddr};
	struct bpf_redir_neigh nh = {};
	struct cb_bgp_route *rt;

	rt = bpf_map_lookup_elem(&cb_bgp_routes, &k);
	if (!rt || !rt->ifindex)
		return cb_drop(skb, CB_DROP_NO_ROUTE);
	nh.nh_family = AF_INET;
	nh.ipv4_nh = rt->nexthop;
	cb_count(skb, CB_FWD_NATIVE);
	return bpf_redirect_neigh(rt->ifindex, &nh, sizeof(nh), 0);
}
