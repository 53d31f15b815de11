/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* nat.h: beyond the network. Packets from a local endpoint to an address outside every
 * network of its tenant go one of three ways (docs/host-routing.md):
 *   - to an address of this host (cb_host_ips): handed to the host's stack;
 *   - to the gateway: ICMP echo is answered in place, anything else is dropped;
 *   - elsewhere (networks with CB_NET_SNAT): source-NATed to cb_config.snat_ip with a port
 *     (ICMP: an echo id) of its own and sent out of the egress device by the kernel's
 *     neighbour table (bpf_redirect_neigh). Replies arriving at snat_ip are matched in
 *     cb_snat_rev, un-NATed and delivered to the endpoint directly.
 * NAT state is keyed by the tenant's zone (overlapping subnets of two tenants never share
 * an entry), created only by a packet that may open a flow and only after policy allowed
 * it, and ages with the conntrack timeouts of its TCP state. A full table or an exhausted
 * port range refuses the new flow (drop_egress_no_port). The agent's collector deletes
 * expired entries. */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "tcpwin.h"
#include "policy.h"
#include "lb.h"

/* An address of this host (agent-maintained from the host's address list). */
struct cb_host_ip {
	__u32 generation;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __be32);
	__type(value, struct cb_host_ip);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_host_ips SEC(".maps");

/* An endpoint address the host's routing table points at a local veth (host → endpoint).
 * Packets arriving on the egress device for such an address are never passed on to the
 * host's stack (it would forward them around policy when ip_forward is on). */
struct cb_host_route {
	__u32 ifindex;
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, __be32);
	__type(value, struct cb_host_route);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_host_routes SEC(".maps");

/* An egress flow as its endpoint sent it. ICMP echo: both ports hold the echo id. */
struct cb_snat_key {
	__u32 zone;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 kind;   /* enum cb_ct_kind: CB_CT_KIND_NODEPORT for a node port flow sent on */
	__u8 pad[2];
};

struct cb_snat_entry {
	__u64 expires;   /* cb_now() deadline */
	__be16 nat_port; /* port (ICMP: echo id) on snat_ip */
	__u8 state;      /* enum cb_ct_state */
	__u8 tcp_ref_kind; /* enum cb_tcp_ref: what tcp_ref holds (TCP flows) */
	__u32 net;       /* the endpoint's network key */
	__be16 nodeport; /* a node port flow sent to a backend on another host (nodeport.h):
			  * the client's side is the key's source; 0 for egress flows */
	__u16 pad2;
	__u32 tcp_ref;   /* host order: see enum cb_tcp_ref */
};

/* Blind FINs and RSTs (TCP flows): the outside may close a flow only with a sequence
 * number a peer that sees the flow would use. (A node port flow sent to a backend on
 * another host too: its "endpoint" is then the client, whose segments set the reference,
 * and its "outside" the backend's host, where any process can send the backend's
 * segments through the overlay.) The endpoint's own segments set the reference: its SYN
 * the ACK a refusal must carry (its sequence number + 1); its acknowledgments are noted
 * by tcpwin.h's rule, the one conntrack notes the same segments with, and a FIN or RST
 * from outside then closes only inside their window (cb_tcp_in_window). So a FIN that
 * conntrack takes for blind is blind here too, and the other way round. One that is not
 * believed is passed as a plain segment (the endpoint's stack judges it, RFC 5961) and
 * nothing changes. */
enum cb_tcp_ref {
	CB_TCP_REF_NONE = 0, /* nothing seen yet (or an entry of an earlier build): believed */
	CB_TCP_REF_SYN = 1,  /* tcp_ref: the endpoint's SYN's sequence number + 1 */
	CB_TCP_REF_ACK = 2,  /* tcp_ref: the endpoint's acknowledgment noted last (cb_tcp_note) */
};

/* cb_tcp_seq_ack reads the sequence and acknowledgment numbers (host order) of the TCP
 * segment at p->l4_off: 0 when it cannot. */
CB_INLINE int cb_tcp_seq_ack(const struct __sk_buff *skb, const struct cb_pkt *p, __u32 *seq, __u32 *ack)
{
	__u32 sa[2];

	if (bpf_skb_load_bytes(skb, p->l4_off + 4, sa, sizeof(sa)) < 0)
		return 0;
	*seq = bpf_ntohl(sa[0]);
	*ack = bpf_ntohl(sa[1]);
	return 1;
}

/* cb_snat_tcp_note records in e what the endpoint's segment f (at p) says a closing
 * segment from outside must carry (a node port flow's: what its client's acknowledgments
 * say). */
CB_INLINE void cb_snat_tcp_note(const struct __sk_buff *skb, const struct cb_pkt *p, const struct cb_flow *f,
				struct cb_snat_entry *e)
{
	__u32 seq, ack, ref;

	if (f->proto != CB_PROTO_TCP || !cb_tcp_seq_ack(skb, p, &seq, &ack))
		return;
	if (f->tcp_flags & CB_TCP_ACK) {
		/* (After a SYN's reference the first acknowledgment is noted whatever it is.) */
		ref = e->tcp_ref_kind == CB_TCP_REF_ACK ? e->tcp_ref : 0;
		if (cb_tcp_note(&ref, ack)) {
			e->tcp_ref = ref;
			e->tcp_ref_kind = CB_TCP_REF_ACK;
		}
	} else if ((f->tcp_flags & CB_TCP_SYN) && !e->nodeport) {
		/* (Not a node port client's: its flow is not held to an answer of its SYN.) */
		e->tcp_ref = seq + 1;
		e->tcp_ref_kind = CB_TCP_REF_SYN;
	}
}

/* cb_tcp_answers says whether a reply f from outside (sequence and acknowledgment numbers
 * seq/ack, read when have) may make new flow e established: anything but a TCP segment
 * while the endpoint's SYN is unanswered, which only a segment acknowledging that SYN
 * answers (a blind segment would otherwise hold the NAT port for the established
 * timeout, 6 h, instead of the new one's 60 s). */
CB_INLINE int cb_tcp_answers(const struct cb_flow *f, const struct cb_snat_entry *e, int have, __u32 ack)
{
	if (f->proto != CB_PROTO_TCP || e->tcp_ref_kind != CB_TCP_REF_SYN)
		return 1;
	return have && (f->tcp_flags & CB_TCP_ACK) && ack == e->tcp_ref;
}

/* cb_tcp_close_believed says whether a FIN or RST from outside (f, with seq/ack read when
 * have) on flow e may close it (enum cb_tcp_ref). */
CB_INLINE int cb_tcp_close_believed(const struct cb_flow *f, const struct cb_snat_entry *e, int have, __u32 seq,
				    __u32 ack)
{
	if (e->tcp_ref_kind == CB_TCP_REF_NONE)
		return 1;
	if (!have)
		return 0;
	if (e->tcp_ref_kind == CB_TCP_REF_SYN)
		return (f->tcp_flags & CB_TCP_ACK) && ack == e->tcp_ref;
	return cb_tcp_in_window(seq, e->tcp_ref, f->tcp_flags);
}

/* A reply as it arrives at snat_ip: from raddr:rport (ICMP: rport 0) to nat_port. */
struct cb_snat_rkey {
	__be32 raddr;
	__be16 rport;
	__be16 nat_port;
	__u8 proto;
	__u8 pad[3];
};

struct cb_snat_rval {
	__u32 zone;
	__be32 saddr;  /* the endpoint */
	__be16 sport;  /* its port (ICMP: its echo id) */
	__u8 kind;     /* the flow key's (enum cb_ct_kind) */
	__u8 pad;
	__u32 net;     /* its network key */
};

#ifndef CB_SNAT_ENTRIES
#define CB_SNAT_ENTRIES (2 * CB_DEFAULT_ENTRIES)
#endif
#define CB_SNAT_TRIES 32

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_SNAT_ENTRIES);
	__type(key, struct cb_snat_key);
	__type(value, struct cb_snat_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_snat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_SNAT_ENTRIES);
	__type(key, struct cb_snat_rkey);
	__type(value, struct cb_snat_rval);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_snat_rev SEC(".maps");

CB_INLINE void cb_snat_refresh(struct cb_snat_entry *e, __u64 deadline)
{
	if (e->expires != deadline)
		e->expires = deadline;
}

/* cb_dst_link_local says whether egress to a may not leave (link-local, but for the cloud
 * metadata address when the config allows it: enum cb_egress_flags). */
CB_INLINE int cb_dst_link_local(__be32 a, const struct cb_config *cfg)
{
	__u32 h = bpf_ntohl(a);

	if ((h >> 16) != 0xa9fe) /* 169.254.0.0/16 */
		return 0;
	return !(h == 0xa9fea9fe && cfg && (cfg->egress_flags & CB_EGRESS_METADATA));
}

/* cb_metadata_refused says whether a is the cloud metadata address and the config does not
 * allow it: also when this host holds that address itself (a node-local metadata proxy
 * answers as the node too). Other link-local addresses of the host stay reachable (a
 * node-local DNS cache at 169.254.20.10, say). */
CB_INLINE int cb_metadata_refused(__be32 a, const struct cb_config *cfg)
{
	return bpf_ntohl(a) == 0xa9fea9fe && !(cfg && (cfg->egress_flags & CB_EGRESS_METADATA));
}

/* cb_dst_invalid says whether an address can never be an egress destination. */
CB_INLINE int cb_dst_invalid(__be32 a)
{
	__u32 h = bpf_ntohl(a);

	return h == 0xffffffff || (h >> 28) == 0xe || (h >> 24) == 127 || (h >> 24) == 0;
}

/* cb_snat_rev_free says whether the reply mapping under rk may be taken by a new flow of
 * endpoint saddr in zone: it belongs to no live flow any more (its flow expired, was
 * deleted, or moved to another port), or (closing) its flow is a closing TCP flow (FIN or
 * RST seen) of the same endpoint, which its own new SYN may take over like the kernel
 * reuses TIME_WAIT tuples: that flow's entry is deleted (its stragglers find no flow).
 * Another endpoint never takes a port whose flow may still carry data. */
CB_INLINE int cb_snat_rev_free(const struct cb_snat_rkey *rk, __u64 now, int closing, __u32 zone, __u8 kind,
				__be32 saddr)
{
	struct cb_snat_key k = {};
	struct cb_snat_entry *e;
	struct cb_snat_rval *rv = bpf_map_lookup_elem(&cb_snat_rev, rk);

	if (!rv)
		return 1;
	k.zone = rv->zone;
	k.kind = rv->kind;
	k.saddr = rv->saddr;
	k.daddr = rk->raddr;
	k.sport = rv->sport;
	k.dport = rk->rport ? rk->rport : rv->sport;
	k.proto = rk->proto;
	e = bpf_map_lookup_elem(&cb_snat, &k);
	if (!e || e->expires < now || e->nat_port != rk->nat_port)
		return 1;
	if (closing && e->state == CB_CTS_CLOSING && rv->zone == zone && rv->kind == kind && rv->saddr == saddr) {
		bpf_map_delete_elem(&cb_snat, &k);
		return 1;
	}
	return 0;
}

/* cb_snat_egress source-NATs packet f of an endpoint in network net (zone t->zone) whose
 * policy verdict already passed: the flow's port, or a fresh one for a packet that may
 * open a flow. Returns 0 or a reason. */
static __noinline int cb_snat_egress(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				     const struct cb_track *t, __u32 net)
{
	struct cb_config *cfg = cb_get_config();
	struct cb_snat_key k = {};
	struct cb_snat_entry ne = {}, *e;
	struct cb_snat_rkey rk = {};
	struct cb_snat_rval rv = {};
	__u32 span, start, i, lo;
	__u64 now = cb_now();
	__be16 port = 0, old;
	__be32 src;
	int echo, closing, r;

	if (!p || !f || !t || !cfg)
		return CB_DROP_TO_GATEWAY;
	echo = f->proto == CB_PROTO_ICMP && f->icmp_type == CB_ICMP_ECHO;
	if (p->frag != CB_FRAG_NONE || !(f->has_ports || echo))
		return CB_DROP_EGRESS_UNSUPPORTED;
	closing = f->proto == CB_PROTO_TCP && (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST));
	k.zone = t->zone;
	k.kind = cb_ct_kind_of(t);
	k.saddr = f->saddr;
	k.daddr = f->daddr;
	k.sport = f->sport;
	k.dport = f->dport;
	k.proto = f->proto;
	e = bpf_map_lookup_elem(&cb_snat, &k);
	if (e && e->expires >= now && e->nodeport == t->nodeport) {
		port = e->nat_port;
		if (closing)
			e->state = CB_CTS_CLOSING;
		cb_snat_tcp_note(skb, p, f, e);
		cb_snat_refresh(e, now + cb_ct_timeout(f->proto, e->state));
	} else {
		if (f->proto == CB_PROTO_TCP &&
		    (!(f->tcp_flags & CB_TCP_SYN) || (f->tcp_flags & (CB_TCP_ACK | CB_TCP_FIN | CB_TCP_RST))))
			return CB_DROP_EGRESS_NO_FLOW;
		lo = cfg->snat_port_min;
		if (!lo || cfg->snat_port_max < lo)
			return CB_DROP_EGRESS_NO_PORT;
		span = (__u32)cfg->snat_port_max - lo + 1;
		start = bpf_get_prandom_u32();
		rk.raddr = f->daddr;
		rk.rport = echo ? 0 : f->dport;
		rk.proto = f->proto;
		rv.zone = t->zone;
		rv.kind = k.kind;
		rv.saddr = f->saddr;
		rv.sport = f->sport;
		rv.net = net;
		/* First a port no live flow holds; failing that (TCP SYN), one of a closing
		 * flow. */
		for (i = 0; i < 2 * CB_SNAT_TRIES; i++) {
			if (i >= CB_SNAT_TRIES && f->proto != CB_PROTO_TCP)
				break;
			rk.nat_port = bpf_htons((__u16)(lo + (start + i) % span));
			if (bpf_map_update_elem(&cb_snat_rev, &rk, &rv, BPF_NOEXIST) == 0) {
				port = rk.nat_port;
				break;
			}
			if (cb_snat_rev_free(&rk, now, i >= CB_SNAT_TRIES, t->zone, k.kind, f->saddr) &&
			    bpf_map_update_elem(&cb_snat_rev, &rk, &rv, BPF_ANY) == 0) {
				port = rk.nat_port;
				break;
			}
		}
		if (!port)
			return CB_DROP_EGRESS_NO_PORT;
		ne.expires = now + cb_ct_timeout(f->proto, CB_CTS_NEW);
		ne.nat_port = port;
		ne.state = CB_CTS_NEW;
		ne.net = net;
		ne.nodeport = t->nodeport;
		cb_snat_tcp_note(skb, p, f, &ne);
		if (bpf_map_update_elem(&cb_snat, &k, &ne, BPF_ANY) < 0) {
			bpf_map_delete_elem(&cb_snat_rev, &rk);
			return CB_DROP_EGRESS_NO_PORT;
		}
	}
	/* Node port flows to another host go from the VTEP address: the address the backend's
	 * host knows this one by (and sends the replies back through the tunnel to). */
	src = t->nodeport ? cfg->vtep : cfg->snat_ip;
	if (!src)
		return CB_DROP_TO_GATEWAY;
	if (!echo)
		return cb_nat(skb, p, f, 0, src, port);
	old = f->sport;
	r = cb_nat(skb, p, f, 0, src, 0);
	if (r)
		return r;
	r = cb_nat_echo_id(skb, p, old, port);
	f->sport = port;
	f->dport = port;
	return r;
}

/* Where an un-NATed reply goes. */
struct cb_snat_dst {
	__u32 zone;
	__u32 net;
	__be32 ip;
	__be16 nodeport; /* the flow's node port (node port flows only) */
	__u8 kind;       /* enum cb_ct_kind of the flow's keys */
	__u8 pad;
};

/* cb_snat_icmp_error rewrites an ICMP error about an egress flow (quoting snat_ip:nat_port
 * → remote) into what the endpoint sent (its address and port), outer destination
 * included; cb_icmp_quote_nat fixes the checksums. */
static __noinline int cb_snat_icmp_error(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
					 const struct cb_snat_rval *rv)
{
	int r;

	if (!p || !f || !rv)
		return CB_DROP_NAT_ERR;
	r = cb_icmp_quote_nat(skb, p, 1, rv->saddr, rv->sport);
	if (!r)
		r = cb_nat(skb, p, f, 1, rv->saddr, f->dport);
	return r;
}

/* cb_snat_reply matches a packet to snat_ip (parsed into p/f) against the egress flows
 * (nodeport 0: from the egress device) or the node port flows sent to other hosts
 * (nodeport 1: from the overlay, d->zone set by the caller to the node port zone of the
 * network it arrived in), un-NATs its destination and says where it goes (*d).
 * Returns -1 when it is no reply of such a flow (from the egress device: the host's own
 * traffic, pass it on), 0 when translated, or a drop reason. */
static __noinline int cb_snat_reply(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
				    struct cb_snat_dst *d, int nodeport)
{
	struct cb_snat_rkey rk = {};
	struct cb_snat_key k = {};
	struct cb_snat_rval *rv;
	struct cb_snat_entry *e;
	__u64 now = cb_now();
	__u32 seq = 0, ack = 0;
	int error = 0, have = 0, r;

	if (!p || !f || !d)
		return -1;
	rk.proto = f->proto;
	if (f->has_ports) {
		rk.raddr = f->saddr;
		rk.rport = f->sport;
		rk.nat_port = f->dport;
	} else if (f->proto == CB_PROTO_ICMP && f->icmp_type == CB_ICMP_ECHO_REPLY) {
		rk.raddr = f->saddr;
		rk.nat_port = f->sport;
	} else if (f->proto == CB_PROTO_ICMP && p->inner.proto && p->inner.saddr == f->daddr) {
		/* An error about a packet we sent from snat_ip. */
		error = 1;
		rk.proto = p->inner.proto;
		rk.raddr = p->inner.daddr;
		rk.nat_port = p->inner.sport;
		if (p->inner.has_ports)
			rk.rport = p->inner.dport;
		else if (p->inner.proto != CB_PROTO_ICMP)
			return -1;
	} else {
		return -1;
	}
	rv = bpf_map_lookup_elem(&cb_snat_rev, &rk);
	if (!rv)
		return -1;
	k.zone = rv->zone;
	k.kind = rv->kind;
	k.saddr = rv->saddr;
	k.daddr = rk.raddr;
	k.sport = rv->sport;
	k.dport = rk.rport ? rk.rport : rv->sport;
	k.proto = rk.proto;
	e = bpf_map_lookup_elem(&cb_snat, &k);
	if (!e || e->expires < now || e->nat_port != rk.nat_port || (e->nodeport != 0) != (nodeport != 0))
		return -1;
	/* A node port flow's reply comes back through the overlay in its backend's network:
	 * in any other tenant's network it is no reply of it. */
	if (nodeport && (rv->zone != d->zone || rv->kind != d->kind))
		return -1;
	d->zone = rv->zone;
	d->kind = rv->kind;
	d->net = rv->net;
	d->ip = rv->saddr;
	d->nodeport = e->nodeport;
	if (error)
		return cb_snat_icmp_error(skb, p, f, rv);
	/* An egress flow's FIN or RST from outside closes it only inside the window; one
	 * that does not is passed as a plain segment, to conntrack too. Its sequence numbers
	 * are read once, when an egress TCP flow's reference may ask for them. */
	if (f->proto == CB_PROTO_TCP && e->tcp_ref_kind != CB_TCP_REF_NONE)
		have = cb_tcp_seq_ack(skb, p, &seq, &ack);
	/* While the endpoint's SYN is unanswered a segment that does not acknowledge it is
	 * blind: the endpoint could only answer it with a RST (which would close its own
	 * flow), and conntrack would take it as the flow's reply. Dropped. */
	if (e->state == CB_CTS_NEW && !cb_tcp_answers(f, e, have, ack))
		return CB_DROP_EGRESS_UNANSWERED;
	if (f->proto == CB_PROTO_TCP && (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST)) &&
	    !cb_tcp_close_believed(f, e, have, seq, ack))
		f->tcp_flags &= ~(CB_TCP_FIN | CB_TCP_RST);
	if (f->proto == CB_PROTO_TCP && (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST)))
		e->state = CB_CTS_CLOSING;
	else if (e->state == CB_CTS_NEW && cb_tcp_answers(f, e, have, ack))
		e->state = CB_CTS_ESTABLISHED;
	cb_snat_refresh(e, now + cb_ct_timeout(f->proto, e->state));
	if (f->has_ports)
		return cb_nat(skb, p, f, 1, rv->saddr, rv->sport);
	r = cb_nat(skb, p, f, 1, rv->saddr, 0);
	if (r)
		return r;
	r = cb_nat_echo_id(skb, p, rk.nat_port, rv->sport);
	f->sport = rv->sport;
	f->dport = rv->sport;
	return r;
}

/* cb_echo_reply turns an ICMP echo request to an address this datapath answers for (the
 * gateway, a service VIP) into its reply, in place, from the router MAC, and sends it back
 * to the endpoint, counted as reason. */
static __noinline int cb_echo_reply(struct __sk_buff *skb, const struct cb_pkt *p, const struct cb_iface *ifc,
				    __u32 reason)
{
	struct cb_config *cfg = cb_get_config();
	__u32 off = p ? p->l4_off : 0;
	void *data, *data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	__u8 *icmp;
	__be32 a;

	if (!p || !ifc || !cfg || off < ETH_HLEN + 20 || off > ETH_HLEN + 60)
		return cb_drop(skb, CB_DROP_NAT_ERR);
	if (bpf_l4_csum_replace(skb, off + 2, bpf_htons(CB_ICMP_ECHO << 8), bpf_htons(CB_ICMP_ECHO_REPLY << 8), 2) < 0)
		return cb_drop(skb, CB_DROP_NAT_ERR);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = data + ETH_HLEN;
	icmp = data + off;
	if ((void *)(ip + 1) > data_end || (void *)(icmp + 8) > data_end)
		return cb_drop(skb, CB_DROP_NAT_ERR);
	icmp[0] = CB_ICMP_ECHO_REPLY;
	a = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = a;
	cb_mac_copy(eth->h_dest, ifc->mac);
	cb_mac_copy(eth->h_source, cfg->gw_mac);
	cb_count(skb, reason);
	return bpf_redirect(skb->ifindex, 0);
}
