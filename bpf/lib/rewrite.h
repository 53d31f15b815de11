/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* rewrite.h: rewriting a packet's addresses and ports in place with their checksums (the
 * IPv4 header's, TCP's and UDP's incrementally as the kernel's NAT does, ICMP's), for
 * service DNAT and its replies, the ICMP errors that quote them, hairpins, and egress and
 * node port NAT (lb.h, nat.h, nodeport.h decide; this header rewrites). */
#pragma once

#include <bpf/bpf_core_read.h>

#include "common.h"
#include "drop.h"
#include "parse.h"
#include "conntrack.h"

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

/* cb_nat_echo_id rewrites the id of the ICMP echo at p->l4_off (the ICMP checksum covers
 * no pseudo header). Returns 0 or a reason. */
CB_INLINE int cb_nat_echo_id(struct __sk_buff *skb, const struct cb_pkt *p, __be16 old, __be16 id)
{
	__u32 off = p->l4_off;
	void *data, *data_end;

	if (old == id)
		return 0;
	if (off < ETH_HLEN + 20 || off > ETH_HLEN + 60)
		return CB_DROP_NAT_ERR;
	if (bpf_l4_csum_replace(skb, off + 2, old, id, 2) < 0)
		return CB_DROP_NAT_ERR;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (data + off + 8 > data_end)
		return CB_DROP_NAT_ERR;
	*(__be16 *)(data + off + 4) = id;
	return 0;
}
