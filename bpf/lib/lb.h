/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb.h: service load balancing on the client's host. The first packet of a flow to
 * VIP:port/proto picks a backend by flow hash and records two conntrack entries: the
 * client→VIP tuple (which backend) and the client→backend tuple (which VIP to restore on
 * replies). Later packets follow the first entry; replies are rewritten back to VIP:port
 * wherever they reach the client's host (local backend or overlay). */
#pragma once

#include <bpf/bpf_core_read.h>

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"

struct cb_svc_key {
	__u32 zone;    /* the service's tenant routing domain */
	__be32 vip;
	__be16 port;   /* network order */
	__u8 proto;
	__u8 pad;
};

enum cb_svc_flags {
	CB_SVC_AFFINITY = 1, /* sessionAffinity ClientIP: the client address picks the backend */
};

struct cb_svc {
	__u32 id;          /* index space of cb_backends */
	__u32 count;       /* number of backends taking new flows, 0 = drop */
	__be16 target_port;
	__u16 flags;       /* enum cb_svc_flags */
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

/* Backend membership (re-validates the backend a conntrack entry chose). */
struct cb_member_key {
	__u32 svc_id;
	__be32 ip;
};

struct cb_member {
	__u32 net;
	__u32 generation;
};

struct cb_vip_key {
	__u32 zone;
	__be32 vip;
};

struct cb_vip {
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
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
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_member_key);
	__type(value, struct cb_member);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_vip_key);
	__type(value, struct cb_vip);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_vips SEC(".maps");

/* Backend revisions: cb_svc_revs[svc_id mod CB_SVC_REV_SLOTS] changes whenever a backend
 * leaves service svc_id (the agent bumps it after deleting the membership, and whenever it
 * writes the service). A client→VIP entry records in its epoch the revision read before its
 * backend was last found a member (cb_lb_forward): while the two are equal the backend
 * still is one, and cb_svc_fast needs no membership lookup. Ids only grow (the agent never
 * reuses one), so ids a multiple of CB_SVC_REV_SLOTS apart share a slot: a bump for either
 * makes the other's entries look again, never skip a look. 0 (an entry whose backend was
 * just chosen, a slot never bumped): the full stage checks. */
#define CB_SVC_REV_SLOTS 65536 /* a power of two; the agent's svcRevSlots */

struct cb_svc_rev {
	__u32 rev;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_SVC_REV_SLOTS);
	__type(key, __u32); /* service id mod CB_SVC_REV_SLOTS */
	__type(value, struct cb_svc_rev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_svc_revs SEC(".maps");

CB_INLINE __u32 cb_svc_rev_of(__u32 id)
{
	__u32 slot = id & (CB_SVC_REV_SLOTS - 1);
	struct cb_svc_rev *r = bpf_map_lookup_elem(&cb_svc_revs, &slot);

	return r ? r->rev : 0;
}

/* cb_svc_memo_stamp is the stamp of a memo (CB_CT_MEMO) taken now, for a client→VIP entry
 * whose backend is a member at revision rev, of its flow's own entry, which must have
 * reached policy stamp need (cb_epg_track of the client's and the backend's groups): the
 * revision, need and the memo generation (cb_ct_gens) summed. Each only grows (a group
 * change stamps the new group with the newest clock, so need grows with it too), so any
 * change moves the sum (it would take 2^32 changes within one tick to come back). 0 (no
 * memo) when rev is. */
CB_INLINE __u32 cb_svc_memo_stamp(__u32 rev, __u32 need)
{
	return rev ? rev + need + cb_ct_gen_now() : 0;
}

CB_INLINE int cb_is_vip(__u32 zone, __be32 ip)
{
	struct cb_vip_key k = {.zone = zone, .vip = ip};

	return bpf_map_lookup_elem(&cb_vips, &k) != 0;
}

/* The kernel's sk_buff, as far as the NAT needs it (CO-RE: the loader finds the field in
 * the running kernel's BTF): how far its L4 checksum is done (CHECKSUM_NONE 0,
 * UNNECESSARY 1, COMPLETE 2, PARTIAL 3). */
struct sk_buff___cb {
	__u8 ip_summed : 2;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

#define CB_CHECKSUM_COMPLETE 2
#define CB_CHECKSUM_PARTIAL 3

/* cb_l4_csum_nat updates the TCP or UDP checksum at csum (in the packet) for an address
 * change whose one's complement difference is diff (csum_sub(new, old)) and a port
 * old_port → port (equal: none) as bpf_l4_csum_replace does (by the difference with the
 * pseudo header, then inet_proto_csum_replace2; a UDP checksum of 0 is none, and a result
 * of 0 is written 0xffff), for an skb whose checksum is not COMPLETE (then skb->csum
 * follows too, which only the helper can write): with CHECKSUM_PARTIAL the field holds
 * the pseudo header's sum, which takes the address and not the port; otherwise it is the
 * checksum, which takes both. No call. */
CB_INLINE void cb_l4_csum_nat(__sum16 *csum, __u32 summed, int udp, __u32 diff, __be16 old_port, __be16 port)
{
	__u32 sum, field = (__u16)*csum;

	if (udp && !field)
		return;
	if (summed == CB_CHECKSUM_PARTIAL) {
		/* ~csum_fold(csum_add(csum_unfold(*sum), diff)) */
		sum = (__u16)~cb_csum_fold(cb_csum_add(field, diff));
	} else {
		/* csum_fold(csum_add(diff, ~csum_unfold(*sum))) */
		sum = cb_csum_fold(cb_csum_add(diff, ~field));
		if (udp && !sum)
			sum = 0xffff;
		if (old_port != port) {
			/* csum_replace2: ~csum16_add(csum16_sub(~*sum, old), new) */
			sum = (~sum & 0xffff) + (~(__u32)old_port & 0xffff);
			sum = (sum & 0xffff) + (sum >> 16);
			sum += port;
			sum = (sum & 0xffff) + (sum >> 16);
			sum = ~sum & 0xffff;
		}
	}
	if (udp && !sum)
		sum = 0xffff;
	*csum = (__sum16)sum;
}

/* cb_l4_nat updates the TCP or UDP checksum of a packet whose address changes by diff
 * (csum_sub(new, old)) and whose port changes; at (cb_l4_at) holds where the checksum is,
 * whether it is UDP's, and the old and new ports. cb_l4_csum_nat when the skb's checksum
 * is not COMPLETE and the field lies in the linear part, else the helper (which also
 * follows a COMPLETE skb->csum). A call of its own, with three arguments that the
 * registers a call keeps hold over the kfunc, so that the full stages that inline cb_nat
 * keep their frames. Returns 0 or CB_DROP_NAT_ERR. */
#define CB_L4_NAT_UDP 0x10000
#define cb_l4_at(off, udp, old_port, port) \
	((__u64)(off) | ((udp) ? CB_L4_NAT_UDP : 0) | (__u64)(__u16)(old_port) << 32 | (__u64)(__u16)(port) << 48)

/* cb_l4_nat_helper is cb_l4_nat through the helpers. */
static __noinline int cb_l4_nat_helper(struct __sk_buff *skb, __u32 diff, __u64 at)
{
	if (!skb)
		return CB_DROP_NAT_ERR;
	if (bpf_l4_csum_replace(skb, at & 0xffff, 0, diff,
				BPF_F_PSEUDO_HDR | ((at & CB_L4_NAT_UDP) ? BPF_F_MARK_MANGLED_0 : 0)) < 0)
		return CB_DROP_NAT_ERR;
	if ((__u16)(at >> 32) != (__u16)(at >> 48) &&
	    bpf_l4_csum_replace(skb, at & 0xffff, (__u16)(at >> 32), (__u16)(at >> 48),
				((at & CB_L4_NAT_UDP) ? BPF_F_MARK_MANGLED_0 : 0) | 2) < 0)
		return CB_DROP_NAT_ERR;
	return 0;
}

static __noinline int cb_l4_nat(struct __sk_buff *skb, __u32 diff, __u64 at)
{
	struct sk_buff___cb *kskb;
	void *data_end;
	__sum16 *csum;
	__u32 summed;

	if (!skb)
		return CB_DROP_NAT_ERR;
	kskb = bpf_cast_to_kern_ctx(skb);
	summed = BPF_CORE_READ_BITFIELD(kskb, ip_summed);
	if (summed == CB_CHECKSUM_COMPLETE || (at & 0xffff) > ETH_HLEN + 60 + 16)
		return cb_l4_nat_helper(skb, diff, at);
	csum = (void *)(long)skb->data + (at & 0xffff);
	data_end = (void *)(long)skb->data_end;
	if ((void *)(csum + 1) > data_end)
		return cb_l4_nat_helper(skb, diff, at);
	cb_l4_csum_nat(csum, summed, at & CB_L4_NAT_UDP, diff, at >> 32, at >> 48);
	return 0;
}

/* cb_nat_rewrite rewrites the destination (dst=1) or source address of an IPv4 packet
 * whose L4 header is at l4_off from old_ip to ip and, when it has ports (TCP or UDP), its
 * port from old_port to port, fixing the L4 checksum (cb_l4_nat) and the IPv4 one as
 * csum_replace4 does, writing the fields directly. Returns 0 or CB_DROP_NAT_ERR. */
CB_INLINE int cb_nat_rewrite(struct __sk_buff *skb, __u32 l4_off, __u8 proto, int ports, int dst,
			     __be32 old_ip, __be32 ip, __be16 old_port, __be16 port)
{
	__u32 addr_off = ETH_HLEN + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
	__u32 port_off = l4_off + (dst ? 2 : 0);
	__u32 sum;
	void *data, *data_end;
	struct iphdr *iph;

	if (ports && cb_l4_nat(skb, cb_csum_add(ip, ~old_ip),
			       cb_l4_at(l4_off + (proto == CB_PROTO_TCP ? 16 : 6), proto != CB_PROTO_TCP, old_port, port)))
		return CB_DROP_NAT_ERR;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	iph = data + ETH_HLEN;
	if ((void *)(iph + 1) > data_end || addr_off > ETH_HLEN + 16 || data + addr_off + 4 > data_end)
		return CB_DROP_NAT_ERR;
	/* The IPv4 checksum, as csum_replace4 (bpf_l3_csum_replace) computes it, without the
	 * call: ~(~check + ~old_ip + ip) in 32-bit one's complement, folded. */
	sum = cb_csum_add(cb_csum_add(~(__u32)iph->check, ~old_ip), ip);
	iph->check = (__sum16)cb_csum_fold(sum);
	*(__be32 *)(data + addr_off) = ip;
	if (ports && port != old_port) {
		if (port_off > ETH_HLEN + 60 + 2 || data + port_off + 2 > data_end)
			return CB_DROP_NAT_ERR;
		*(__be16 *)(data + port_off) = port;
	}
	return 0;
}

/* cb_nat rewrites the destination (dst=1) or source address and port of an IPv4 packet
 * whose identity is f (cb_nat_rewrite). Updates f. Returns 0 or a reason. */
CB_INLINE int cb_nat(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f, int dst,
		     __be32 ip, __be16 port)
{
	int r;

	r = cb_nat_rewrite(skb, p->l4_off, f->proto, f->has_ports, dst, dst ? f->daddr : f->saddr, ip,
			   dst ? f->dport : f->sport, port);
	if (r)
		return r;
	if (dst) {
		f->daddr = ip;
		f->dport = port;
	} else {
		f->saddr = ip;
		f->sport = port;
	}
	return 0;
}

/* cb_icmp_quote_nat rewrites one side of the packet an ICMP error quotes (p->inner, as its
 * sender sent it): its source (src=1) or destination address and port (TCP/UDP; a quoted
 * ICMP echo: its id, either side) become ip:port. Like the kernel's NAT of related errors
 * (nf_nat_icmp_reply_translation): the quoted IPv4 checksum is fixed; the quoted L4
 * checksum is updated incrementally (pseudo header and port: right for the whole original
 * packet even though the quote holds only its start) where the quote holds it: always for
 * UDP (unless 0, no checksum) and ICMP (no pseudo header), for TCP only when the quote
 * holds the whole header; the ICMP checksum follows the port and the L4 checksum (the
 * quoted address and IPv4 checksum cancel out in it). Updates p->inner. Returns 0 or
 * CB_DROP_NAT_ERR. */
static __noinline int cb_icmp_quote_nat(struct __sk_buff *skb, struct cb_pkt *p, int src, __be32 ip, __be16 port)
{
	__u32 ioff, l4off, icsum, coff = 0, end;
	__u64 mangled = 0;
	__be16 old_port, tot = 0, oc = 0, nc = 0;
	__be32 old_ip;
	int icmp;

	if (!p)
		return CB_DROP_NAT_ERR;
	icmp = p->inner.proto == CB_PROTO_ICMP;
	ioff = p->inner_off;
	l4off = p->inner_l4_off;
	icsum = p->l4_off + 2;
	old_ip = src ? p->inner.saddr : p->inner.daddr;
	old_port = src ? p->inner.sport : p->inner.dport;
	if (old_ip == ip && old_port == port)
		return 0;
	if (ioff < ETH_HLEN + 28 || ioff > ETH_HLEN + 60 + 8 || l4off < ioff + 20 || l4off > ioff + 60 ||
	    icsum < ETH_HLEN + 22 || icsum > ETH_HLEN + 62 || !(p->inner.has_ports || icmp))
		return CB_DROP_NAT_ERR;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tot_len), &tot, 2) < 0)
		return CB_DROP_NAT_ERR;
	end = ETH_HLEN + bpf_ntohs(tot);
	if (icmp) {
		coff = l4off + 2;
	} else if (p->inner.proto == CB_PROTO_UDP) {
		coff = l4off + 6;
		mangled = BPF_F_MARK_MANGLED_0;
	} else if (l4off + 20 <= end) {
		coff = l4off + 16; /* TCP: only a quote of the whole header holds it */
	}
	if (coff) {
		if (bpf_skb_load_bytes(skb, coff, &oc, 2) < 0 ||
		    (!icmp && bpf_l4_csum_replace(skb, coff, old_ip, ip, mangled | 4) < 0) ||
		    (port != old_port && bpf_l4_csum_replace(skb, coff, old_port, port, mangled | 2) < 0) ||
		    bpf_skb_load_bytes(skb, coff, &nc, 2) < 0)
			return CB_DROP_NAT_ERR;
		if (nc != oc && bpf_l4_csum_replace(skb, icsum, oc, nc, 2) < 0)
			return CB_DROP_NAT_ERR;
	}
	if (port != old_port &&
	    (bpf_l4_csum_replace(skb, icsum, old_port, port, 2) < 0 ||
	     bpf_skb_store_bytes(skb, l4off + (icmp ? 4 : src ? 0 : 2), &port, 2, 0) < 0))
		return CB_DROP_NAT_ERR;
	if (ip != old_ip &&
	    (bpf_l3_csum_replace(skb, ioff + offsetof(struct iphdr, check), old_ip, ip, 4) < 0 ||
	     bpf_skb_store_bytes(skb, ioff + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr)),
				 &ip, 4, 0) < 0))
		return CB_DROP_NAT_ERR;
	if (src) {
		p->inner.saddr = ip;
		p->inner.sport = port;
	} else {
		p->inner.daddr = ip;
		p->inner.dport = port;
	}
	if (icmp) {
		p->inner.sport = port; /* the echo id is both "ports" */
		p->inner.dport = port;
	}
	return 0;
}

/* cb_nat_icmp_hairpin turns an ICMP error a hairpin client sent to the VIP (f: client →
 * VIP) about a packet of its hairpin flow into one from the VIP to the client about the
 * packet as the other end of the flow (the client too) sent it: the quote becomes
 * client:sport → VIP:dport, the error's addresses swap. Returns 0 or a reason. */
CB_INLINE int cb_nat_icmp_hairpin(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
				 __be16 sport, __be16 dport)
{
	__be32 client = f->saddr, vip = f->daddr;
	int r;

	r = cb_icmp_quote_nat(skb, p, 1, client, sport);
	if (!r)
		r = cb_icmp_quote_nat(skb, p, 0, vip, dport);
	if (!r)
		r = cb_nat(skb, p, f, 1, client, f->dport);
	if (!r)
		r = cb_nat(skb, p, f, 0, vip, f->sport);
	return r;
}

/* cb_nat_icmp_error restores the VIP in an ICMP error a backend's side sent about a packet
 * the client had sent to the VIP (e: that flow's DNAT entry): the quoted destination
 * (address, port) becomes VIP:port again, and the outer source too when the backend itself
 * sent the error (cb_icmp_quote_nat fixes the checksums). A hairpin client's error about
 * its own balanced packet (quoting VIP:cport → client:target) goes back to it as an error
 * from the VIP about client:cport → VIP:port. Returns 0 or a reason. */
static __noinline int cb_nat_icmp_error(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
					const struct cb_ct_entry *e)
{
	__be32 old_ip = p->inner.daddr;
	int r;

	if (e->flags & CB_CT_HAIRPIN)
		return cb_nat_icmp_hairpin(skb, p, f, p->inner.sport, e->nat_port);
	r = cb_icmp_quote_nat(skb, p, 0, e->nat_ip, e->nat_port);
	if (!r && f->saddr == old_ip)
		r = cb_nat(skb, p, f, 0, e->nat_ip, f->sport);
	return r;
}

/* cb_nat_hairpin_reply turns a hairpin reply (client:target → VIP:cport) back into what
 * the client expects: VIP:port → client:cport. */
static __noinline int cb_nat_hairpin_reply(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
					   const struct cb_ct_entry *e)
{
	__be32 client = f->saddr, vip = e->nat_ip;
	__be16 vport = e->nat_port;
	int r;

	r = cb_nat(skb, p, f, 1, client, f->dport);
	if (r)
		return r;
	return cb_nat(skb, p, f, 0, vip, vport);
}

/* cb_lb_choice is a service flow's backend, decided by cb_lb_forward and committed to
 * conntrack by cb_lb_commit once policy allowed the flow. */
struct cb_lb_choice {
	struct cb_ct_entry *svc_ct; /* the client→VIP entry, if it exists */
	__be32 ip;
	__be16 port;
	__u8 commit;                /* 1: write (or rewrite) the client→VIP entry */
	__u8 frag_snat;             /* a later fragment of a reply: source back to ip */
	__u32 net;
	__u32 svc_id;
};

/* Fragments of service flows. A later fragment carries no ports: the first fragment of a
 * balanced datagram records where its later fragments go (their destination becomes the
 * backend), and the first fragment of a reply records the VIP its later fragments come
 * from; both by (zone, addresses as they arrive, IP id, proto), for CB_FRAG_TIMEOUT. A
 * hairpin datagram, either way, arrives from the client to the VIP and leaves from the VIP
 * to the client: its first fragment records that both addresses of its later ones swap. */
enum cb_natfrag_dir {
	CB_NATFRAG_DST = 1,
	CB_NATFRAG_SRC = 2,
	CB_NATFRAG_HAIRPIN = 3,
};

struct cb_natfrag {
	__u64 expires;
	__be32 addr;  /* backend (DST), VIP (SRC), or the client (HAIRPIN) */
	__u32 net;    /* network key of the packet's destination after the rewrite */
	__u32 dir;    /* enum cb_natfrag_dir */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct cb_frag_key);
	__type(value, struct cb_natfrag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_nat_frags SEC(".maps");

/* cb_natfrag_record: later fragments of datagram (k's zone, addresses, id, proto) get their
 * destination (dir DST) or source (SRC) rewritten to addr. */
CB_INLINE void cb_natfrag_record(const struct cb_frag_key *k, __u32 dir, __be32 addr, __u32 net)
{
	struct cb_natfrag v = {.expires = cb_now() + CB_FRAG_TIMEOUT, .addr = addr, .net = net, .dir = dir};

	bpf_map_update_elem(&cb_nat_frags, k, &v, BPF_ANY);
}

/* cb_lb_frag handles a later fragment (no ports) while services exist: one of a balanced
 * datagram is DNATed to its backend now (t->svc, c->net), one of a hairpin datagram (either
 * way) goes from the VIP back to the client now (t->svc, t->hairpin), one of a reply is
 * marked for its source to go back to the VIP after policy (t->svc_reply, c->frag_snat,
 * c->ip, c->net); any other to a VIP is dropped. DST and HAIRPIN records apply only to a
 * local client's fragments (t->client_net set), a HAIRPIN one only in the client's own
 * network. Returns 0 or a reason. */
static __noinline int cb_lb_frag(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				 struct cb_track *t, struct cb_lb_choice *c)
{
	struct cb_frag_key k = {};
	struct cb_natfrag *n;
	int r;

	cb_frag_key_of(&k, f, t);
	n = bpf_map_lookup_elem(&cb_nat_frags, &k);
	if (n && n->expires >= cb_now()) {
		if (n->dir == CB_NATFRAG_DST && t->client_net) {
			t->svc = 1;
			t->vip = f->daddr;
			c->net = n->net;
			return cb_nat(skb, p, f, 1, n->addr, 0);
		}
		if (n->dir == CB_NATFRAG_HAIRPIN && t->client_net && t->client_net == n->net &&
		    n->addr == f->saddr) {
			t->svc = 1;
			t->hairpin = 1;
			t->vip = f->daddr;
			c->net = n->net;
			r = cb_nat(skb, p, f, 1, n->addr, 0);
			if (!r)
				r = cb_nat(skb, p, f, 0, t->vip, 0);
			return r;
		}
		if (n->dir == CB_NATFRAG_SRC) {
			t->svc_reply = 1;
			c->frag_snat = 1;
			c->ip = n->addr;
			c->net = n->net;
			return 0;
		}
	}
	if (t->client_net && cb_is_vip(t->zone, f->daddr))
		return CB_DROP_FRAG_TO_SERVICE;
	return 0;
}

/* cb_lb_finish runs after policy passed a packet: the source of a reply's later fragment
 * goes back to the VIP, and a reply's first fragment records that for its later ones (a
 * hairpin reply's: that they go from the VIP to the client). Inlined: on most packets it
 * does nothing, and a call would cost more (cb_track_flags). */
CB_INLINE int cb_lb_finish(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				   const struct cb_track *t, const struct cb_lb_choice *c)
{
	struct cb_frag_key fk = {};

	if (c->frag_snat)
		return cb_nat(skb, p, f, 0, c->ip, 0);
	if (t->rev_nat && p->frag == CB_FRAG_FIRST && !t->inner) {
		cb_frag_key_of(&fk, f, t);
		if (t->rev_nat->flags & CB_CT_HAIRPIN)
			cb_natfrag_record(&fk, CB_NATFRAG_HAIRPIN, f->saddr, t->rev_nat->nat_net);
		else
			cb_natfrag_record(&fk, CB_NATFRAG_SRC, t->rev_nat->nat_ip, t->rev_nat->nat_net);
	}
	return 0;
}

/* cb_lb_key is the client→VIP key of a service flow whose packet (already DNATed or not)
 * is f: the VIP:port come from t. */
CB_INLINE void cb_lb_key(struct cb_ct_key *k, const struct cb_flow *f, const struct cb_track *t)
{
	k->zone = t->zone;
	k->saddr = t->hairpin ? f->daddr : f->saddr; /* hairpin: the client is the backend */
	k->daddr = t->vip;
	k->sport = f->sport;
	k->dport = t->vport;
	k->proto = f->proto;
}

/* cb_lb_seed keys the flow hash of cb_lb_pick: random, set by the agent at load, so a
 * client cannot choose its backend by choosing its ports. */
volatile __u32 cb_lb_seed;

CB_INLINE __u32 cb_rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

CB_INLINE __u32 cb_mix32(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = cb_rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = cb_rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

/* cb_flow_hash is MurmurHash3 (x86_32) of the 5-tuple's three words, as they lie in the
 * packet, seeded with cb_lb_seed ^ proto (pkg/dataplane/ebpf/service.go: flowHash).
 * Not the kernel's skb hash: that one leaves the ports out of a fragment's, so every
 * fragmented flow between two addresses would go to one backend. */
CB_INLINE __u32 cb_flow_hash(const struct cb_flow *f)
{
	__u32 h = cb_lb_seed ^ f->proto;

	h = cb_mix32(h, f->saddr);
	h = cb_mix32(h, f->daddr);
	h = cb_mix32(h, (__u32)f->sport | (__u32)f->dport << 16);
	h ^= 12;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* cb_lb_pick chooses a backend of svc for flow f: by its 5-tuple's hash, or with
 * session affinity by the client's address alone. */
CB_INLINE int cb_lb_pick(const struct cb_flow *f, const struct cb_svc *svc, struct cb_lb_choice *c)
{
	struct cb_backend_key bk = {};
	struct cb_backend *be;
	__u32 h;

	if (!svc->count)
		return CB_DROP_NO_BACKEND;
	bk.svc_id = svc->id;
	if (svc->flags & CB_SVC_AFFINITY) {
		h = bpf_ntohl(f->saddr) * 2654435761U; /* Knuth's multiplicative hash */
		h ^= h >> 16;
	} else {
		h = cb_flow_hash(f);
	}
	bk.index = h % svc->count;
	be = bpf_map_lookup_elem(&cb_backends, &bk);
	if (!be)
		return CB_DROP_NO_BACKEND;
	c->ip = be->ip;
	c->port = svc->target_port;
	c->net = be->net;
	c->svc_id = svc->id;
	c->commit = 1;
	return 0;
}

/* cb_lb_forward applies service DNAT to a packet from a local client of zone t->zone, whose
 * network key the caller put in t->client_net; c->net is then the backend's network. The backend a live client→VIP
 * entry remembers is used while it is still a member of the service; otherwise the flow
 * is re-balanced on this packet. Returns 0 or a drop reason; sets t->svc for service
 * flows. */
static __noinline int cb_lb_forward(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				    struct cb_track *t, struct cb_lb_choice *c)
{
	struct cb_svc_key sk = {};
	struct cb_member_key mk = {};
	struct cb_ct_key key = {};
	struct cb_ct_entry *ct;
	struct cb_svc *svc;
	__be32 client;
	__u32 rev;
	int r;

	if (f->proto != CB_PROTO_TCP && f->proto != CB_PROTO_UDP)
		return 0;
	if (!f->has_ports)
		return 0; /* later fragments: cb_lb_frag */
	/* Node port flows keep their state in the node port zone; the service is the tenant's. */
	sk.zone = t->nodeport ? t->zone ^ CB_ZONE_NODEPORT : t->zone;
	sk.vip = f->daddr;
	sk.port = f->dport;
	sk.proto = f->proto;
	cb_ct_key_of(&key, t->zone, f, 0);
	ct = cb_ct_live(&key, cb_now());
	if (ct && !(ct->flags & CB_CT_SVC))
		ct = 0;
	c->svc_ct = ct;
	if (ct) {
		/* An established service flow: its entry names the backend, re-validated by
		 * membership on every packet; the service itself is looked up only when the
		 * backend is gone (to re-balance, or to notice the service is gone too). */
		mk.svc_id = ct->svc_id;
		mk.ip = ct->nat_ip;
		rev = cb_svc_rev_of(ct->svc_id); /* before the membership: a removal bumps it after */
		if (bpf_map_lookup_elem(&cb_members, &mk)) {
			/* Checked at this revision (an entry whose flow policy then denies keeps
			 * it: the check holds all the same). */
			if ((ct->epoch != rev || ct->state != CB_CTS_NEW) && ct->nat_ip == mk.ip) {
				ct->epoch = rev;
				ct->state = CB_CTS_NEW; /* (a memo's stamp no more) */
			}
			c->ip = ct->nat_ip;
			c->port = ct->nat_port;
			c->net = ct->nat_net;
			c->svc_id = ct->svc_id;
		} else if (!(svc = bpf_map_lookup_elem(&cb_services, &sk))) {
			/* The service is gone: the flow is no longer a service flow. */
			bpf_map_delete_elem(&cb_ct, &key);
			c->svc_ct = 0;
			return 0;
		} else if ((r = cb_lb_pick(f, svc, c))) {
			return r;
		}
	} else {
		svc = bpf_map_lookup_elem(&cb_services, &sk);
		if (!svc)
			return 0;
		if ((r = cb_lb_pick(f, svc, c)))
			return r;
	}
	t->svc = 1;
	t->vip = f->daddr;
	t->vport = f->dport;
	client = f->saddr;
	r = cb_nat(skb, p, f, 1, c->ip, c->port);
	if (r || c->ip != client || c->net != t->client_net)
		return r;
	/* Hairpin: the client is its own backend. Its packet would arrive from its own
	 * address (a martian); it comes from the VIP instead, and replies go back through the
	 * VIP's entry. */
	t->hairpin = 1;
	return cb_nat(skb, p, f, 0, t->vip, f->sport);
}

/* cb_lb_commit records (or refreshes) the client→VIP entry after policy passed the flow;
 * it lives as long as the flow's entry. Returns 0 or CB_DROP_CT_FULL. */
static __noinline int cb_lb_commit(const struct cb_lb_choice *c, const struct cb_pkt *p, const struct cb_flow *f,
				   const struct cb_track *t)
{
	struct cb_ct_entry e = {};
	struct cb_ct_entry *cur = c->svc_ct;
	struct cb_ct_key key = {};
	struct cb_frag_key fk = {};
	__u8 was;

	if (!t->entry) {
		/* passed without a flow entry (e.g. a RST): nothing to remember */
	} else if (cur && !c->commit) {
		/* (Written only when it moves: the entry's line stays clean between ticks.) */
		if (cur->expires != t->entry->expires)
			cur->expires = t->entry->expires;
	} else if (cur) {
		cur->nat_ip = c->ip;
		cur->nat_port = c->port;
		cur->nat_net = c->net;
		cur->svc_id = c->svc_id;
		cur->epoch = 0; /* a new backend: its membership looked up on the next packet */
		cur->state = CB_CTS_NEW; /* (no memo) */
		cur->expires = t->entry->expires;
		/* A memo another CPU writes meanwhile, of the old backend's flow, is stale. */
		cb_ct_changed(CB_CT_DNAT);
	} else {
		e.flags = CB_CT_SVC;
		e.state = CB_CTS_NEW;
		e.nat_ip = c->ip;
		e.nat_port = c->port;
		e.nat_net = c->net;
		e.svc_id = c->svc_id;
		e.expires = t->entry->expires; /* epoch 0: the next packet checks the backend */
		/* Counts against the flow's owner, never refused by its quota: the flow's own
		 * entry was admitted. */
		e.owner = t->owner;
		cb_lb_key(&key, f, t);
		/* It may replace a service flow's entry: one whose backend is this VIP's address
		 * (a service on an endpoint's address and port). */
		cur = bpf_map_lookup_elem(&cb_ct, &key);
		was = cur ? cur->flags : 0;
		if (cb_ct_insert(&key, &e, 0))
			return CB_DROP_CT_FULL;
		cb_ct_changed(was);
		cb_ct_shadow(&key);
	}
	if (p->frag == CB_FRAG_FIRST) {
		/* Later fragments of this datagram go to the same backend (a hairpin's: also from
		 * the VIP). */
		cb_frag_key_of(&fk, f, t);
		cb_natfrag_record(&fk, t->hairpin ? CB_NATFRAG_HAIRPIN : CB_NATFRAG_DST, f->daddr, c->net);
	}
	return 0;
}

/* cb_lb_reply finds the service flow a packet is the reply of (before the destination
 * lookup, which needs the client's network); the VIP is restored after policy. An ICMP
 * error about a packet the client sent to a backend (inner = client→backend) belongs to
 * that flow too. */
CB_INLINE struct cb_ct_entry *cb_lb_reply(const struct cb_pkt *p, const struct cb_flow *f, __u32 zone)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;

	if (f->proto == CB_PROTO_ICMP && p->inner.proto) {
		if (f->saddr != p->inner.daddr || f->daddr != p->inner.saddr)
			return 0; /* not from the quoted packet's destination to its sender */
		cb_ct_key_of(&k, zone, &p->inner, 0);
	} else if (f->has_ports) {
		cb_ct_key_of(&k, zone, f, 1);
	} else {
		return 0;
	}
	e = cb_ct_live(&k, cb_now());
	if (!e || (e->flags & (CB_CT_ALLOWED | CB_CT_DNAT)) != (CB_CT_ALLOWED | CB_CT_DNAT))
		return 0;
	return e;
}

/* cb_lb_icmp_client says whether an ICMP error a local client (network t->client_net)
 * sends is about a reply it received from a service: quoting VIP:port → client:cport, sent
 * to the VIP. It is when the client→VIP entry is live and the flow's own entry
 * (client:cport → backend:bport; a hairpin's VIP:cport → client:target) is live, allowed
 * and restores that VIP:port: then t->svc_icmp (t->hairpin) is set and c holds the
 * backend:bport and its network for cb_nat_icmp_client. (Lookups only: the rewrite runs in
 * a frame of its own, the stack is short.) */
static __noinline int cb_lb_icmp_client(const struct cb_pkt *p, const struct cb_flow *f, struct cb_track *t,
					struct cb_lb_choice *c)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *svc, *flow;
	__u64 now = cb_now();
	int hairpin;

	if (!p || !f || !t || !c || p->frag != CB_FRAG_NONE || !p->inner.has_ports ||
	    f->saddr != p->inner.daddr || f->daddr != p->inner.saddr)
		return 0;
	k.zone = t->zone;
	k.saddr = f->saddr;
	k.daddr = f->daddr;
	k.sport = p->inner.dport;
	k.dport = p->inner.sport;
	k.proto = p->inner.proto;
	svc = cb_ct_live(&k, now);
	if (!svc || !(svc->flags & CB_CT_SVC))
		return 0;
	c->ip = svc->nat_ip;
	c->port = svc->nat_port;
	c->net = svc->nat_net;
	hairpin = c->ip == f->saddr && c->net == t->client_net;
	if (hairpin)
		k.saddr = f->daddr;
	k.daddr = c->ip;
	k.dport = c->port;
	flow = cb_ct_flow(&k, now);
	if (!flow || !(flow->flags & CB_CT_DNAT) || !(flow->flags & CB_CT_HAIRPIN) != !hairpin ||
	    flow->nat_ip != f->daddr || flow->nat_port != p->inner.sport)
		return 0;
	t->svc_icmp = 1;
	t->hairpin = hairpin;
	return 1;
}

/* cb_nat_icmp_client turns the error cb_lb_icmp_client matched into one about the packet
 * the backend (c) sent: to the backend, quoting backend:bport → client:cport; a hairpin's
 * from the VIP to the client, quoting client:target → VIP:cport. Returns 0 or a reason. */
static __noinline int cb_nat_icmp_client(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
					 const struct cb_track *t, const struct cb_lb_choice *c)
{
	int r;

	if (!p || !f || !t || !c)
		return CB_DROP_NAT_ERR;
	if (t->hairpin)
		return cb_nat_icmp_hairpin(skb, p, f, c->port, p->inner.dport);
	r = cb_icmp_quote_nat(skb, p, 1, c->ip, c->port);
	if (!r)
		r = cb_nat(skb, p, f, 1, c->ip, f->dport);
	return r;
}

/* The keys of the fast path: the packet's tuple, and the service its destination would be. */
struct cb_fast_keys {
	struct cb_ct_key ct;
	struct cb_svc_key svc;
};

/* cb_fast_pass decides, for cb_ipv4_fast, whether an unfragmented TCP or UDP packet (not
 * SYN, FIN or RST) from a local endpoint to an endpoint of its network, keys in k (its
 * tuple may be left reversed; e: the entry under it, never a client→VIP one with services
 * on), may skip the full stage. With services on (lb), it must not be addressed to
 * a service (cb_lb_forward's test) nor be a service flow's reply (cb_lb_reply's). An entry
 * under its own tuple answers both without a lookup when it is live, of the current
 * policy epoch and nobody's service flow (flags exactly CB_CT_ALLOWED): a service flow's
 * entry under the reverse tuple would have marked it (CB_CT_SHADOW, cb_ct_shadow), and a
 * service on the destination's address and port added since its verdict moved the epoch
 * (the driver bumps it when a service takes an endpoint's address).
 * When the flow is tracked (a group with rules, or a pod with a NetworkPolicy entry, at
 * either end), a live entry of the current policy epoch that policy allowed and that is
 * nobody's service flow (flags exactly CB_CT_ALLOWED) must hold its tuple, either way; it
 * then does to that entry what cb_ct_check would (refresh; a first reply makes it
 * ESTABLISHED). The reply of a service flow (not a hairpin's; no entry under its own
 * tuple) to a client of net, whose flow entry is of the current policy epoch, is that
 * entry's reply as cb_ct_check takes it: *rev is then the entry, whose VIP:port the
 * caller restores as the packet's source. "Of the current policy epoch": not older than
 * need, the stamp of the flow's groups and zone (cb_epg_track; a service taking an
 * endpoint's address stamps the endpoint's group). Returns 1 to pass, or 0 having written
 * nothing: the full stage decides. */
CB_INLINE int cb_fast_pass(struct cb_fast_keys *k, struct cb_ct_entry *e, int tracked, int lb, __u32 net,
			   __u32 need, struct cb_ct_entry **rev)
{
	struct cb_ct_entry *r = 0;
	__u64 now = cb_now();
	int plain = e && e->expires >= now && e->flags == CB_CT_ALLOWED && cb_stamp_ok(e->epoch, need);
	__be32 a;
	__be16 port;

	if (!e) {
		a = k->ct.saddr;
		k->ct.saddr = k->ct.daddr;
		k->ct.daddr = a;
		port = k->ct.sport;
		k->ct.sport = k->ct.dport;
		k->ct.dport = port;
		r = bpf_map_lookup_elem(&cb_ct, &k->ct);
	}
	if (lb && !plain) {
		/* Marked: its packets may be a service flow's replies. */
		if (e && (e->flags & CB_CT_SHADOW))
			return 0;
		if (r && r->expires >= now && (r->flags & (CB_CT_ALLOWED | CB_CT_DNAT)) == (CB_CT_ALLOWED | CB_CT_DNAT)) {
			/* A service flow's reply: only from a backend that is no hairpin, with no
			 * entry of its own direction, to a client of net (where its destination was
			 * looked up), and of the current policy epoch. */
			if (r->flags != (CB_CT_ALLOWED | CB_CT_DNAT) || !cb_stamp_ok(r->epoch, need) || r->nat_net != net)
				return 0;
			if (r->state == CB_CTS_NEW) {
				r->state = CB_CTS_ESTABLISHED;
				cb_ct_changed(r->flags);
			}
			cb_ct_refresh(r, now + cb_ct_timeout(k->ct.proto, r->state));
			*rev = r;
			return 1;
		}
		if (bpf_map_lookup_elem(&cb_services, &k->svc))
			return 0;
	}
	if (!tracked)
		return 1;
	if (e) {
		if (!plain)
			return 0;
	} else {
		if (!r || r->expires < now || r->flags != CB_CT_ALLOWED || !cb_stamp_ok(r->epoch, need))
			return 0;
		if (r->state == CB_CTS_NEW)
			r->state = CB_CTS_ESTABLISHED;
		e = r;
	}
	cb_ct_refresh(e, now + cb_ct_timeout(k->ct.proto, e->state));
	return 1;
}
