/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* parse.h: Ethernet and IPv4 header parsing with bounds checks. Every rejection names a
 * drop reason; nothing here forwards or counts. */
#pragma once

#include "common.h"
#include "drop.h"

enum cb_frag {
	CB_FRAG_NONE = 0,
	CB_FRAG_FIRST = 1, /* MF set, offset 0: carries the L4 header */
	CB_FRAG_LATER = 2, /* offset != 0: no L4 header, never parse one */
};

#define CB_PROTO_ICMP 1
#define CB_PROTO_TCP 6
#define CB_PROTO_UDP 17

#define CB_TCP_FIN 0x01
#define CB_TCP_SYN 0x02
#define CB_TCP_RST 0x04
#define CB_TCP_ACK 0x10

#define CB_ICMP_ECHO_REPLY 0
#define CB_ICMP_DEST_UNREACH 3
#define CB_ICMP_ECHO 8
#define CB_ICMP_TIME_EXCEEDED 11
#define CB_ICMP_PARAM_PROB 12

/* cb_flow is the L3/L4 identity of a packet as policy, conntrack and LB see it. Ports are
 * in network order; ICMP echo request/reply use the echo id as both ports so a reply's
 * reversed tuple matches its request. */
struct cb_flow {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags;
	__u8 has_ports; /* sport/dport are real L4 ports (TCP/UDP) */
	__u8 icmp_type; /* ICMP only */
};

/* cb_tcp_opens says whether f is a TCP SYN without ACK: a segment that opens a flow of
 * its own, never the reply of another (whatever else it carries). */
CB_INLINE int cb_tcp_opens(const struct cb_flow *f)
{
	return f->proto == CB_PROTO_TCP && (f->tcp_flags & (CB_TCP_SYN | CB_TCP_ACK)) == CB_TCP_SYN;
}

/* cb_tcp_seqs is the sequence and acknowledgment numbers (host order) of the TCP segment
 * cb_parse_l4 read last on this CPU, with its source address and port to tell it from any
 * other: per-packet state for conntrack's window (conntrack.h, cb_ct_window), which the
 * callers' stacks have no room to carry. A stage reached by tail call finds its packet's
 * there: nothing else runs on the CPU in between. */
struct cb_tcp_seqs {
	__be32 saddr;
	__be16 sport;
	__u16 valid; /* 1: seq and ack were read */
	__u32 seq;
	__u32 ack;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_tcp_seqs);
} cb_tcp_scratch SEC(".maps");

/* cb_tcp_seqs_note records the sequence numbers of f's TCP segment, whose header is at
 * off. A call of its own, reading through the helper: its frame and registers stay off
 * its callers' packet pointers. */
static __noinline void cb_tcp_seqs_note(struct __sk_buff *skb, __u32 off, const struct cb_flow *f)
{
	__u32 zero = 0, sa[2];
	struct cb_tcp_seqs *s = bpf_map_lookup_elem(&cb_tcp_scratch, &zero);

	if (!s || !skb || !f)
		return;
	s->valid = 0;
	if (bpf_skb_load_bytes(skb, off + 4, sa, sizeof(sa)) < 0)
		return;
	s->saddr = f->saddr;
	s->sport = f->sport;
	s->seq = bpf_ntohl(sa[0]);
	s->ack = bpf_ntohl(sa[1]);
	s->valid = 1;
}

struct cb_pkt {
	struct ethhdr *eth;
	struct iphdr *ip;
	__u16 l3_len;  /* IPv4 header length in bytes (20..60) */
	__u16 l4_off;  /* offset of the L4 header from skb->data, 0 if none */
	__u8 frag;     /* enum cb_frag */
	__u8 proto;    /* IPv4 protocol */
	__be16 ip_id;  /* IPv4 identification (pairs fragments of one datagram) */
	/* ICMP errors (dest unreachable, time exceeded, parameter problem): the quoted
	 * packet's identity as its sender saw it (inner.proto 0: not an error) and where its
	 * IPv4 and L4 headers start. */
	struct cb_flow inner;
	__u16 inner_off;
	__u16 inner_l4_off;
};

/* cb_pull makes the first len bytes directly accessible when the skb is non-linear. */
CB_INLINE void cb_pull(struct __sk_buff *skb, __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	if (data + len > data_end && skb->len >= len)
		bpf_skb_pull_data(skb, len);
}

/* cb_parse_eth returns 0 or a drop reason. */
CB_INLINE int cb_parse_eth(struct __sk_buff *skb, struct cb_pkt *p)
{
	void *data, *data_end;

	cb_pull(skb, ETH_HLEN);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN > data_end)
		return CB_DROP_MALFORMED_ETH;
	p->eth = data;
	return 0;
}

/* cb_parse_ipv4 validates the IPv4 header after the Ethernet header. IP options are
 * accepted (and skipped); fragments are classified so later stages never read an L4
 * header out of a non-first fragment. Returns 0 or a drop reason. Invalidates p->eth
 * (re-read it from the returned pointers). */
CB_INLINE int cb_parse_ipv4(struct __sk_buff *skb, struct cb_pkt *p)
{
	void *data, *data_end;
	struct iphdr *ip;
	__u32 hlen, tot, frag;

	cb_pull(skb, ETH_HLEN + sizeof(struct iphdr));
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	p->eth = data;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end)
		return CB_DROP_MALFORMED_IP;
	if (ip->version != 4 || ip->ihl < 5)
		return CB_DROP_MALFORMED_IP;
	hlen = ip->ihl * 4;
	if (hlen > sizeof(struct iphdr)) {
		cb_pull(skb, ETH_HLEN + hlen);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		p->eth = data;
		ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > data_end)
			return CB_DROP_MALFORMED_IP;
		if (data + ETH_HLEN + hlen > data_end)
			return CB_DROP_MALFORMED_IP;
	}
	tot = bpf_ntohs(ip->tot_len);
	/* tot_len 0 is legal only for a GSO super-packet (BIG TCP). */
	if (tot == 0 && skb->gso_size == 0)
		return CB_DROP_MALFORMED_IP;
	if (tot != 0 && (tot < hlen || tot > skb->len - ETH_HLEN))
		return CB_DROP_MALFORMED_IP;

	frag = bpf_ntohs(ip->frag_off);
	/* Fragments whose offset no real datagram has: past its largest size (the receiver's
	 * reassembly drops them), or a TCP fragment at offset 8, inside the TCP header (RFC
	 * 1858: it could rewrite the flags policy judged on the first fragment). */
	if ((frag & 0x1fff) && ((frag & 0x1fff) * 8 + tot - hlen > 65535 ||
				((frag & 0x1fff) == 1 && ip->protocol == CB_PROTO_TCP)))
		return CB_DROP_MALFORMED_IP;
	p->frag = CB_FRAG_NONE;
	p->l4_off = ETH_HLEN + hlen;
	if (frag & 0x1fff) {
		p->frag = CB_FRAG_LATER;
		p->l4_off = 0;
	} else if (frag & 0x2000) {
		p->frag = CB_FRAG_FIRST;
	}
	p->ip = ip;
	p->l3_len = hlen;
	p->proto = ip->protocol;
	p->ip_id = ip->id;
	return 0;
}

struct cb_l4_ports {
	__be16 sport;
	__be16 dport;
};

/* cb_parse_icmp_inner reads the packet an ICMP error quotes, at off: an IPv4 header and at
 * least the first 8 bytes of its payload (ports, or an echo id). Returns 0 or
 * CB_DROP_MALFORMED_L4 (a truncated or bogus quote). */
CB_INLINE int cb_parse_icmp_inner(struct __sk_buff *skb, struct cb_pkt *p, __u32 off)
{
	void *data, *data_end;
	struct iphdr *ip;
	__u8 *l4;
	__u32 hlen;

	if (off > ETH_HLEN + 60 + 8)
		return CB_DROP_MALFORMED_L4;
	cb_pull(skb, off + sizeof(struct iphdr) + 8);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + off;
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5)
		return CB_DROP_MALFORMED_L4;
	hlen = ip->ihl * 4;
	p->inner.saddr = ip->saddr;
	p->inner.daddr = ip->daddr;
	p->inner.proto = ip->protocol;
	if (hlen > sizeof(struct iphdr))
		cb_pull(skb, off + hlen + 8);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	l4 = data + off + hlen;
	if ((void *)(l4 + 8) > data_end)
		return CB_DROP_MALFORMED_L4;
	switch (p->inner.proto) {
	case CB_PROTO_TCP:
	case CB_PROTO_UDP:
		p->inner.sport = ((struct cb_l4_ports *)l4)->sport;
		p->inner.dport = ((struct cb_l4_ports *)l4)->dport;
		p->inner.has_ports = 1;
		break;
	case CB_PROTO_ICMP:
		if (l4[0] == CB_ICMP_ECHO || l4[0] == CB_ICMP_ECHO_REPLY) {
			p->inner.sport = *(__be16 *)(l4 + 4);
			p->inner.dport = p->inner.sport;
		}
		break;
	}
	p->inner_off = off;
	p->inner_l4_off = off + hlen;
	return 0;
}

/* cb_parse_l4_bare fills f from the IPv4 header p->ip and, unless the packet is a
 * non-first fragment, the L4 header. Returns 0 or CB_DROP_MALFORMED_L4. Must run right
 * after cb_parse_ipv4 (packet pointers unchanged). */
CB_INLINE int cb_parse_l4_bare(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 off = p->l4_off;
	__u8 *l4;

	f->saddr = p->ip->saddr;
	f->daddr = p->ip->daddr;
	f->proto = p->proto;
	f->sport = 0;
	f->dport = 0;
	f->tcp_flags = 0;
	f->has_ports = 0;
	f->icmp_type = 0;
	if (p->frag == CB_FRAG_LATER || off == 0 || off > ETH_HLEN + 60)
		return 0;
	switch (p->proto) {
	case CB_PROTO_TCP:
		cb_pull(skb, off + 20);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		l4 = data + off;
		if ((void *)(l4 + 20) > data_end)
			return CB_DROP_MALFORMED_L4;
		f->sport = ((struct cb_l4_ports *)l4)->sport;
		f->dport = ((struct cb_l4_ports *)l4)->dport;
		f->tcp_flags = l4[13];
		f->has_ports = 1;
		break;
	case CB_PROTO_UDP:
		cb_pull(skb, off + 8);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		l4 = data + off;
		if ((void *)(l4 + 8) > data_end)
			return CB_DROP_MALFORMED_L4;
		f->sport = ((struct cb_l4_ports *)l4)->sport;
		f->dport = ((struct cb_l4_ports *)l4)->dport;
		f->has_ports = 1;
		break;
	case CB_PROTO_ICMP:
		cb_pull(skb, off + 8);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		l4 = data + off;
		if ((void *)(l4 + 8) > data_end)
			return CB_DROP_MALFORMED_L4;
		f->icmp_type = l4[0];
		if (l4[0] == CB_ICMP_DEST_UNREACH || l4[0] == CB_ICMP_TIME_EXCEEDED ||
		    l4[0] == CB_ICMP_PARAM_PROB)
			return cb_parse_icmp_inner(skb, p, off + 8);
		if (l4[0] == CB_ICMP_ECHO || l4[0] == CB_ICMP_ECHO_REPLY) {
			f->sport = *(__be16 *)(l4 + 4);
			f->dport = f->sport;
		}
		break;
	}
	return 0;
}

/* cb_parse_l4 is cb_parse_l4_bare for a packet conntrack may see: a TCP segment's
 * sequence numbers are noted too (cb_tcp_scratch). (Only an ICMP error's own parse of the
 * packet it answers does without: the call, in the middle of its packet pointers, makes
 * the compiler shift them.) */
CB_INLINE int cb_parse_l4(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f)
{
	int r = cb_parse_l4_bare(skb, p, f);

	if (!r && f->has_ports && f->proto == CB_PROTO_TCP)
		cb_tcp_seqs_note(skb, p->l4_off, f);
	return r;
}
