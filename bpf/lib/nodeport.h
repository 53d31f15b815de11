/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* nodeport.h: a service port reachable on the host's own address (docs/host-routing.md
 * "Node ports"). A TCP/UDP packet arriving on the egress device for snat_ip:nodeport is
 * steered to the service's VIP:port and balanced like a local client's flow, among the
 * backends on this host (the client's address is kept, as Kubernetes'
 * externalTrafficPolicy=Local); its conntrack entry carries CB_CT_NODEPORT and the node
 * port, so a backend's replies leave from snat_ip:nodeport out of the egress device.
 *
 * A backend on another host (VXLAN) gets the flow source-NATed to snat_ip (cb_snat with
 * the node port recorded) through the overlay. That host sees a packet whose inner source is
 * the sending peer itself: it judges it as a node port flow from outside whose client is
 * the peer's address (cb_peer_host_rx), remembers it in cb_peer_flows, and the backend's
 * replies to the peer's address go back through the tunnel to that peer, which un-NATs them
 * (cb_snat_reply) and sends them out from snat_ip:nodeport.
 *
 * A client from the wire never has an address of the service's tenant's networks: those
 * live behind the tenant's veths and tunnels. One that claims one (to match rules written
 * for internal clients, and have the backend's answer reflected to the real endpoint) is
 * dropped (cb_tenant_src). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "tcpwin.h"
#include "policy.h"
#include "lb.h"
#include "nat.h"

struct cb_np_key {
	__be16 port;  /* the node port, network order */
	__u8 proto;
	__u8 pad;
};

struct cb_np {
	__u32 zone;      /* the service's tenant */
	__be32 vip;
	__be16 svc_port; /* network order */
	__u16 pad;
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct cb_np_key);
	__type(value, struct cb_np);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_nodeports SEC(".maps");

/* The subnets of every tenant's networks (the agent writes one per network, by zone), so
 * the node port stage knows an address of the service's tenant when a client claims one. */
struct cb_tnet_key {
	__u32 prefixlen; /* 32 (the zone) + the subnet's length */
	__u32 zone;
	__be32 addr;
};

struct cb_tnet {
	__u32 net;        /* network key of the subnet's network */
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 4096); /* = cb_networks */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_tnet_key);
	__type(value, struct cb_tnet);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_tenant_nets SEC(".maps");

/* cb_tenant_src says whether addr lies in a network of the tenant with zone zone. A call of
 * its own: its key stays off the node port stage's frame (on the deepest chain). */
static __noinline int cb_tenant_src(__u32 zone, __be32 addr)
{
	struct cb_tnet_key k = {.prefixlen = 64, .zone = zone, .addr = addr};

	return bpf_map_lookup_elem(&cb_tenant_nets, &k) != 0;
}

/* cb_nodeport_lookup returns the service behind packet f's destination port, if f is a
 * TCP/UDP packet to a node port. */
CB_INLINE struct cb_np *cb_nodeport_lookup(const struct cb_flow *f)
{
	struct cb_np_key k = {};

	if (!f->has_ports || (f->proto != CB_PROTO_TCP && f->proto != CB_PROTO_UDP))
		return 0;
	k.port = f->dport;
	k.proto = f->proto;
	return bpf_map_lookup_elem(&cb_nodeports, &k);
}

/* A flow a peer host started to a local endpoint from its own address (a node port flow
 * it balanced here), by the tuple as it arrived: the endpoint's replies to that peer's
 * address go back through the tunnel. */
struct cb_peer_flow_key {
	__u32 zone;
	__be32 saddr;  /* the peer host (its VTEP) */
	__be32 daddr;  /* the local endpoint */
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct cb_peer_flow {
	__u64 expires;
	__be32 vtep;
	__u32 net;     /* the network key the flow arrived in */
	__u8 state;    /* enum cb_ct_state: NEW until the endpoint answered */
	__u8 pad[3];
	__u32 tcp_ack; /* TCP: the endpoint's acknowledgment last noted (host order, 0: none),
			* where the peer's FIN or RST must lie (tcpwin.h) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_peer_flow_key);
	__type(value, struct cb_peer_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_peer_flows SEC(".maps");

/* cb_peer_flow_window applies the window (tcpwin.h) to TCP segment f of peer
 * flow v, with the sequence numbers cb_parse_l4 read (cb_tcp_scratch): 1 when f is a FIN
 * or RST from the peer outside the window of the endpoint's last noted acknowledgment
 * (anyone on the peer host can send from its address: a blind one moves nothing);
 * otherwise an acknowledgment of the endpoint's (reply) is noted as due, and 0. */
static __noinline int cb_peer_flow_window(struct cb_peer_flow *v, const struct cb_flow *f, int reply)
{
	struct cb_tcp_seqs *s;
	__u32 zero = 0;

	if (!v || !f || f->proto != CB_PROTO_TCP)
		return 0;
	s = bpf_map_lookup_elem(&cb_tcp_scratch, &zero);
	if (!s || !s->valid || s->saddr != f->saddr || s->sport != f->sport)
		return 0;
	if (!reply)
		return (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST)) && !cb_tcp_in_window(s->seq, v->tcp_ack, f->tcp_flags);
	if (f->tcp_flags & CB_TCP_ACK)
		cb_tcp_note(&v->tcp_ack, s->ack);
	return 0;
}

/* cb_peer_flow_step moves a peer flow's state with packet f (reply: from the endpoint) and
 * returns its new deadline: conntrack's timeouts, NEW until the endpoint answered. A blind
 * FIN or RST from the peer (cb_peer_flow_window) moves nothing, not even the deadline. */
CB_INLINE __u64 cb_peer_flow_step(struct cb_peer_flow *v, const struct cb_flow *f, int reply)
{
	if (cb_peer_flow_window(v, f, reply))
		return v->expires;
	if (f->proto == CB_PROTO_TCP && (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST)))
		v->state = CB_CTS_CLOSING;
	else if (reply && v->state == CB_CTS_NEW)
		v->state = CB_CTS_ESTABLISHED;
	return cb_now() + cb_ct_timeout(f->proto, v->state);
}

/* Services for the host's own processes (socket level, cgroup/connect4): a connection to a
 * VIP:port, or to one of the host's addresses at a node port, is made to a backend on this
 * host instead. A VIP:port answers here only when one tenant has it (the host belongs to no
 * tenant): the agent keeps cb_host_svcs to those. */
struct cb_host_svc_key {
	__be32 vip;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct cb_host_svc {
	__u32 zone;
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_host_svc_key);
	__type(value, struct cb_host_svc);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_host_svcs SEC(".maps");

#define CB_SOCK_LB_TRIES 256 /* backends scanned for a local one (services larger than that may miss it) */

/* cb_nodeport_icmp_in translates an ICMP error from outside about a node port flow's
 * reply (it quotes snat_ip:node port → client:cport, as the reply left) for the flow's
 * local backend: the quoted source becomes backend:target port and the outer destination
 * the backend (cb_icmp_quote_nat, cb_nat), in the node port zone (t->zone) and the
 * backend's network (c->net). Only when the client→VIP entry and the flow's own entry are
 * live, allowed and of that node port, and the backend is on this host (a remote one's
 * flow left through the overlay from a NAT port: its errors stay the host's). Returns 0,
 * a drop reason, or -1 when the error is about no such flow. */
static __noinline int cb_nodeport_icmp_in(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
					  struct cb_track *t, struct cb_lb_choice *c)
{
	struct cb_config *cfg = cb_get_config();
	struct cb_np_key nk = {};
	struct cb_ct_key k = {};
	struct cb_ep_key ek = {};
	struct cb_ct_entry *svc, *flow;
	struct cb_endpoint *ep;
	struct cb_np *np;
	__u64 now = cb_now();
	int r;

	if (!p || !f || !t || !c || !cfg || !p->inner.has_ports || p->inner.saddr != cfg->snat_ip)
		return -1;
	nk.port = p->inner.sport;
	nk.proto = p->inner.proto;
	np = bpf_map_lookup_elem(&cb_nodeports, &nk);
	if (!np)
		return -1;
	k.zone = np->zone;
	k.kind = CB_CT_KIND_NODEPORT;
	k.saddr = p->inner.daddr;
	k.daddr = np->vip;
	k.sport = p->inner.dport;
	k.dport = np->svc_port;
	k.proto = p->inner.proto;
	svc = cb_ct_live(&k, now);
	if (!svc || !(svc->flags & CB_CT_SVC))
		return -1;
	c->ip = svc->nat_ip;
	c->port = svc->nat_port;
	c->net = svc->nat_net;
	k.daddr = c->ip;
	k.dport = c->port;
	flow = cb_ct_flow(&k, now);
	if (!flow || !(flow->flags & CB_CT_NODEPORT) || flow->nodeport != nk.port)
		return -1;
	ek.net = c->net;
	ek.ip = c->ip;
	ep = bpf_map_lookup_elem(&cb_endpoints, &ek);
	if (!ep || !(ep->flags & CB_EP_LOCAL))
		return -1;
	t->zone = k.zone;
	t->kind = CB_FLOW_NODEPORT;
	r = cb_icmp_quote_nat(skb, p, 1, c->ip, c->port);
	if (!r)
		r = cb_nat(skb, p, f, 1, c->ip, 0);
	return r;
}

/* Fragments of node port flows with a local backend (cb_nat_frags records, written only
 * once the first fragment passed policy, so a later fragment passes only behind one that
 * did): a client's datagram to the node port is keyed (CB_NATFRAG_NODEPORT_IN, client,
 * host address, id, proto), its later fragments go to the backend (DST); a backend's
 * reply is keyed (the node port zone, backend, client, id, proto), its later fragments
 * leave from the host's address (SRC). The inbound key's zone is no tenant's: later
 * fragments carry no node port to find the tenant by, and the host's address as
 * destination sets these apart from every other record. */
#define CB_NATFRAG_NODEPORT_IN 0xffffffffu

CB_INLINE void cb_np_frag_key(struct cb_frag_key *k, __u32 zone, __u8 kind, __be32 saddr, __be32 daddr,
			      const struct cb_pkt *p, __u8 proto)
{
	k->zone = zone;
	k->kind = kind;
	k->saddr = saddr;
	k->daddr = daddr;
	k->id = p->ip_id;
	k->proto = proto;
}

/* cb_np_frag_find returns the live record of a later fragment's datagram (dir), or 0. */
CB_INLINE struct cb_natfrag *cb_np_frag_find(const struct cb_frag_key *k, __u32 dir)
{
	struct cb_natfrag *n = bpf_map_lookup_elem(&cb_nat_frags, k);

	if (!n || n->dir != dir || n->expires < cb_now())
		return 0;
	return n;
}

/* Blind FINs and RSTs (node port flows; the rule: tcpwin.h). Conntrack notes the
 * backend's acknowledgments in the flow's entry (tcp_ack[1], cb_ct_window) like any
 * flow's; the client's FIN or RST closes the flow only inside their window. A blind one is
 * dropped here (drop_nodeport_blind), before conntrack, as the backend's stack would
 * discard it (RFC 5961): passed on, it would move a remote backend's host's state. A
 * client SYN on an established flow with a noted acknowledgment does not replace the
 * flow's entry (a spoofed SYN would clear it for the RST after it): it goes on as a plain
 * segment, and the backend's stack answers it with a challenge ACK, whose acknowledgment
 * a real client's RST then carries. Before the backend's first acknowledgment the
 * client's RST is believed: the flow is new, and a new flow expires in a minute anyway. */

/* cb_np_ref is the backend's noted acknowledgment in node port flow entry e (0: none). An
 * entry of the build before tcpwin.h kept it in svc_id (CB_CT_TCP_REF_OLD, until
 * cb_ct_window's next note moves it): read for this build, so an upgrade loses no flow's
 * window. A flag read with a svc_id another CPU's move already cleared falls to tcp_ack[1],
 * which that move wrote first. */
CB_INLINE __u32 cb_np_ref(const struct cb_ct_entry *e)
{
	__u32 old = (e->flags & CB_CT_TCP_REF_OLD) ? e->svc_id : 0;

	return old ? old : e->tcp_ack[1];
}

/* cb_np_blind_check judges the client's segment f (at p) of node port flow t against its
 * live entry's noted acknowledgment (cb_np_ref): drop_nodeport_blind for a FIN or RST
 * outside the window; a SYN on an established flow loses its SYN for conntrack (a plain
 * segment); 0 otherwise. */
static __noinline int cb_np_blind_check(const struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
					const struct cb_track *t)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;
	__u32 seq, ack, ref;

	if (!p || !f || !t || f->proto != CB_PROTO_TCP ||
	    !(f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST | CB_TCP_SYN)))
		return 0;
	cb_ct_key_of(&k, t->zone, cb_ct_kind_of(t), f, 0);
	e = cb_ct_live(&k, cb_now());
	if (!e || !(e->flags & CB_CT_NODEPORT))
		return 0;
	ref = cb_np_ref(e);
	if (!ref)
		return 0;
	if (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST)) {
		/* (Whatever else it carries: a SYN|RST is a RST to the backend's host.) */
		if (cb_tcp_seq_ack(skb, p, &seq, &ack) && cb_tcp_in_window(seq, ref, f->tcp_flags))
			return 0;
		return CB_DROP_NODEPORT_BLIND;
	}
	if ((f->tcp_flags & (CB_TCP_SYN | CB_TCP_ACK)) == CB_TCP_SYN && e->state == CB_CTS_ESTABLISHED)
		f->tcp_flags &= ~CB_TCP_SYN;
	return 0;
}
