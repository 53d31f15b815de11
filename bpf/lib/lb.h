/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb.h: service load balancing on the client's host. The first packet of a flow to
 * VIP:port/proto picks a backend by flow hash and records two conntrack entries: the
 * client→VIP tuple (which backend) and the client→backend tuple (which VIP to restore on
 * replies). Later packets follow the first entry; replies are rewritten back to VIP:port
 * wherever they reach the client's host (local backend or overlay). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"

struct cb_svc_key {
	__be32 vip;
	__be16 port;   /* network order */
	__u8 proto;
	__u8 pad;
};

struct cb_svc {
	__u32 id;          /* index space of cb_backends */
	__u32 count;       /* number of backends, 0 = drop */
	__be16 target_port;
	__u16 pad;
	__u32 generation;
};

struct cb_backend_key {
	__u32 svc_id;
	__u32 index;
};

struct cb_backend {
	__be32 ip;
	__u32 net;         /* network key of the backend endpoint */
	__u32 generation;
};

struct cb_vip {
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct cb_svc_key);
	__type(value, struct cb_svc);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_backend_key);
	__type(value, struct cb_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __be32);
	__type(value, struct cb_vip);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_vips SEC(".maps");

/* cb_nat rewrites the destination (dst=1) or source address and port of an IPv4 packet
 * whose identity is f, fixing the IP and L4 checksums. Updates f. Returns 0 or a reason. */
CB_INLINE int cb_nat(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f, int dst,
		     __be32 ip, __be16 port)
{
	__u32 addr_off = ETH_HLEN + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
	__u32 port_off = p->l4_off + (dst ? 2 : 0);
	__be32 old_ip = dst ? f->daddr : f->saddr;
	__be16 old_port = dst ? f->dport : f->sport;
	__u32 csum_off = 0;
	__u64 mangled = 0;

	if (f->has_ports) {
		if (f->proto == CB_PROTO_TCP) {
			csum_off = p->l4_off + 16;
		} else {
			csum_off = p->l4_off + 6;
			mangled = BPF_F_MARK_MANGLED_0;
		}
		if (bpf_l4_csum_replace(skb, csum_off, old_ip, ip, BPF_F_PSEUDO_HDR | mangled | 4) < 0)
			return CB_DROP_NAT_ERR;
		if (port != old_port) {
			if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | 2) < 0)
				return CB_DROP_NAT_ERR;
			if (bpf_skb_store_bytes(skb, port_off, &port, 2, 0) < 0)
				return CB_DROP_NAT_ERR;
		}
	}
	if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old_ip, ip, 4) < 0)
		return CB_DROP_NAT_ERR;
	if (bpf_skb_store_bytes(skb, addr_off, &ip, 4, 0) < 0)
		return CB_DROP_NAT_ERR;
	if (dst) {
		f->daddr = ip;
		f->dport = port;
	} else {
		f->saddr = ip;
		f->sport = port;
	}
	return 0;
}

/* cb_lb_forward applies service DNAT to a packet from a local client. *net is the network
 * key to look the (new) destination up in. Returns 0 or a drop reason. */
CB_INLINE int cb_lb_forward(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f, __u32 *net)
{
	struct cb_svc_key sk = {};
	struct cb_backend_key bk = {};
	struct cb_ct_entry *ct;
	struct cb_backend *be;
	struct cb_svc *svc;
	struct cb_flow orig;
	__be32 ip;
	__be16 port;
	__u32 bnet;

	if (f->proto != CB_PROTO_TCP && f->proto != CB_PROTO_UDP)
		return 0;
	if (!f->has_ports) {
		if (bpf_map_lookup_elem(&cb_vips, &f->daddr))
			return CB_DROP_FRAG_TO_SERVICE;
		return 0;
	}
	ct = cb_ct_find(f, 0, CB_CT_SVC);
	if (ct) {
		ip = ct->nat_ip;
		port = ct->nat_port;
		bnet = ct->nat_net;
	} else {
		sk.vip = f->daddr;
		sk.port = f->dport;
		sk.proto = f->proto;
		svc = bpf_map_lookup_elem(&cb_services, &sk);
		if (!svc)
			return 0;
		if (!svc->count)
			return CB_DROP_NO_BACKEND;
		bk.svc_id = svc->id;
		bk.index = bpf_get_hash_recalc(skb) % svc->count;
		be = bpf_map_lookup_elem(&cb_backends, &bk);
		if (!be)
			return CB_DROP_NO_BACKEND;
		ip = be->ip;
		port = svc->target_port;
		bnet = be->net;
		cb_ct_add(f, CB_CT_SVC, ip, port, bnet);
		orig = *f;
		orig.daddr = ip;
		orig.dport = port;
		cb_ct_add(&orig, CB_CT_DNAT, f->daddr, f->dport, *net);
	}
	*net = bnet;
	return cb_nat(skb, p, f, 1, ip, port);
}

/* cb_lb_reply finds the service connection a reply belongs to; the caller restores the
 * VIP with cb_lb_unnat after policy (which sees the backend's address). */
CB_INLINE struct cb_ct_entry *cb_lb_reply(const struct cb_flow *f)
{
	if (!f->has_ports)
		return 0;
	return cb_ct_find(f, 1, CB_CT_DNAT);
}
