// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* contivbpf.c: the entry programs.
 *
 *   cb_from_container  tcx ingress on every local endpoint's host-side veth
 *   cb_from_overlay    tcx ingress on the collect_md vxlan device
 *   cb_from_wire       tcx ingress on the VLAN uplink (HostConfig.VLANIf); with BGP also
 *                      the natively routed packets to local endpoints (native.h)
 *   cb_from_uplink     tcx ingress on the egress device: replies of egress (NAT) flows
 *   cb_test_overlay    never attached: cb_from_overlay's pipeline with the tunnel key taken
 *                      from skb->cb[0..1], so BPF_PROG_TEST_RUN can run it: `netctl trace`
 *                      of a packet from another host (pkg/dataplane/ebpf/trace.go) and tests
 *
 * Stage order (design.md section 6):
 *   [VLAN pop on the uplink] → parse → ARP responder → service LB (DNAT / reply match,
 *   conntrack) → destination lookup → policy (EPG + L4, stateful) → [undo DNAT on replies]
 *   → forward (local redirect_peer | VXLAN | VLAN uplink) → counters
 */
#include "lib/common.h"
#include "lib/drop.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/arp.h"
#include "lib/encap.h"
#include "lib/vlan.h"
#include "lib/conntrack.h"
#include "lib/policy.h"
#include "lib/lb.h"
#include "lib/nat.h"
#include "lib/nodeport.h"
#include "lib/native.h"
#include "lib/icmp.h"
#include "lib/handoff.h"
#include "lib/qos.h"
#include "lib/prefilter.h"
#include "lib/xdp.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* bpf2go -type needs every exported type to be reachable from a symbol. */
const enum cb_reason cb_reason_unused __attribute__((unused));
const enum cb_encap cb_encap_unused __attribute__((unused));
const enum cb_ep_flags cb_ep_flags_unused __attribute__((unused));
const enum cb_features cb_features_unused __attribute__((unused));
const enum cb_egress_flags cb_egress_flags_unused __attribute__((unused));
const enum cb_ct_flags cb_ct_flags_unused __attribute__((unused));
const enum cb_ct_state cb_ct_state_unused __attribute__((unused));
const enum cb_epg_flags cb_epg_flags_unused __attribute__((unused));
const enum cb_pol_dir cb_pol_dir_unused __attribute__((unused));
const enum cb_rule_action cb_rule_action_unused __attribute__((unused));
const struct cb_event cb_event_unused __attribute__((unused));
const enum cb_net_flags cb_net_flags_unused __attribute__((unused));
const enum cb_qos_flags cb_qos_flags_unused __attribute__((unused));

/* cb_deliver_to rewrites the destination MAC to mac and hands the frame to the container
 * end of host veth ifindex directly (no host stack, ip_forward stays 0), counted as
 * verdict and in counter slot. Every delivery to a local endpoint passes here: with
 * limited set, its ingress bucket is charged first (qos.h). */
CB_INLINE int cb_deliver_to(struct __sk_buff *skb, const __u8 *mac, __u32 slot, __u32 ifindex,
			    enum cb_reason verdict, int limited)
{
	void *data, *data_end;
	struct ethhdr *eth;
	int r;

	if (limited) {
		r = cb_qos_police(skb, slot, 1);
		if (r)
			return cb_drop(skb, r);
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	cb_mac_copy(eth->h_dest, mac);
	cb_ep_rx(skb, slot);
	cb_count(skb, verdict);
	return bpf_redirect_peer(ifindex, 0);
}

/* cb_deliver_as delivers to local endpoint ep (cb_deliver_to), counted as verdict and in
 * ep's counter slot; cb_deliver_local counts it as CB_FWD_LOCAL. */
CB_INLINE int cb_deliver_as(struct __sk_buff *skb, const struct cb_endpoint *ep,
			    enum cb_reason verdict)
{
	return cb_deliver_to(skb, ep->mac, ep->slot, ep->ifindex, verdict, ep->flags & CB_EP_QOS_IN);
}

#define cb_deliver_local(skb, ep) cb_deliver_as(skb, ep, CB_FWD_LOCAL)

/* cb_gateway_of is the gateway address of network net (0: none). */
CB_INLINE __be32 cb_gateway_of(__u32 net)
{
	struct cb_network *n = bpf_map_lookup_elem(&cb_networks, &net);

	return n ? n->gateway : 0;
}

/* cb_route_rewrite turns a frame into a routed one: TTL decremented (checksum fixed),
 * source MAC = router MAC. Returns 0 or a drop reason. */
CB_INLINE int cb_route_rewrite(struct __sk_buff *skb, const struct cb_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	__u8 ttl;

	if ((void *)(ip + 1) > data_end || !cfg)
		return CB_DROP_MALFORMED_IP;
	ttl = ip->ttl;
	if (ttl <= 1)
		return CB_DROP_TTL_EXCEEDED;
	ip->ttl = ttl - 1;
	cb_mac_copy(eth->h_source, cfg->gw_mac);
	if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), bpf_htons(ttl << 8),
				bpf_htons((ttl - 1) << 8), 2) < 0)
		return CB_DROP_NAT_ERR;
	return 0;
}

/* A packet of a local endpoint to no endpoint it reaches directly: cb_nodeport_out, then
 * cb_outside (the entry program calls them one after the other). */
#define CB_OUTSIDE (-2)
/* cb_outside handed an egress flow's packet over to cb_stage_egress (cb_egress). */
#define CB_EGRESS (-10)

/* cb_outside handles a packet of a local endpoint whose destination is no endpoint it can
 * reach directly (nat.h): the gateway, this host, or the outside through egress NAT. */
static __noinline int cb_outside(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_ep_key dkey = {};
	struct cb_peer_flow_key pk = {};
	struct cb_endpoint peer = {};
	struct cb_peer_flow *pf;
	struct cb_host_route *hr;
	struct cb_network *net;
	struct cb_config *cfg;
	__u32 nk;
	int r;

	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	nk = ifc->net;
	r = cb_parse_ipv4(skb, &p);
	if (r)
		return cb_drop(skb, r);
	r = cb_parse_l4(skb, &p, &f);
	if (r)
		return cb_drop(skb, r);
	net = bpf_map_lookup_elem(&cb_networks, &nk);
	if (!net)
		return cb_drop(skb, CB_DROP_UNKNOWN_NETWORK);
	/* A VIP of the tenant is no address beyond the network: pinged, it answers (whole echo
	 * requests; as the gateway does, before policy); anything else to it (a port or
	 * protocol without a service) goes nowhere, never out. (Here, after the node port
	 * stage: the reply of a node port flow goes to an outside client even if its address
	 * is one of the tenant's VIPs.) */
	if ((cb_features & CB_FEAT_LB) && cb_is_vip(ifc->vrf, f.daddr)) {
		if (f.proto == CB_PROTO_ICMP && f.icmp_type == CB_ICMP_ECHO && p.frag == CB_FRAG_NONE)
			return cb_echo_reply(skb, &p, ifc, CB_ICMP_VIP_REPLY);
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	}
	/* Flows out of the network are judged by the endpoint's group as flows to an address
	 * of no group (its out-rules with addresses and ports decide). */
	t.zone = ifc->vrf;
	t.frag = p.frag;
	t.ip_id = p.ip_id;
	t.src_epg = ifc->epg;
	t.owner = cb_ct_owner(ifc->slot);
	t.local = 1;
	if (p.inner.proto)
		t.inner = &p.inner;
	if (net->gateway && f.daddr == net->gateway) {
		if (f.proto == CB_PROTO_ICMP && f.icmp_type == CB_ICMP_ECHO && p.frag == CB_FRAG_NONE)
			return cb_echo_reply(skb, &p, ifc, CB_ICMP_GW_REPLY);
		cfg = cb_get_config();
		if (cfg && cfg->dns_ip && f.proto == CB_PROTO_UDP && f.dport == bpf_htons(53) &&
		    p.frag == CB_FRAG_NONE) {
			/* The network's DNS server is its gateway: the agent's responder answers
			 * (from the gateway's address, on the veth it asked on). Policy first: a
			 * group that may not send anywhere does not get a DNS channel out either.
			 * (NetworkPolicy treats it as the node's: the responder runs there.) */
			t.kind = CB_FLOW_HOST;
			r = cb_stateful(&f, &t);
			if (!r)
				r = cb_nat(skb, &p, &f, 1, cfg->dns_ip, f.dport);
			if (r)
				return cb_drop(skb, r);
			bpf_skb_change_type(skb, 0 /* PACKET_HOST */);
			cb_ep_tx(skb, ifc->slot);
			cb_count(skb, CB_FWD_DNS);
			return TC_ACT_OK;
		}
		return cb_drop(skb, CB_DROP_TO_GATEWAY);
	}
	if ((f.daddr & net->mask) == net->subnet)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	if (f.has_ports && bpf_map_lookup_elem(&cb_peers, &f.daddr)) {
		/* The reply of a node port flow a peer host balanced here goes back to it. */
		pk.zone = ifc->vrf;
		pk.saddr = f.daddr;
		pk.daddr = f.saddr;
		pk.sport = f.dport;
		pk.dport = f.sport;
		pk.proto = f.proto;
		pf = bpf_map_lookup_elem(&cb_peer_flows, &pk);
		if (pf && pf->expires >= cb_now()) {
			/* Judged as the node port flow it is (cb_peer_host_rx): the reply of one
			 * the endpoint's in-rules allowed passes, anything else meets its
			 * out-rules. */
			t.zone = ifc->vrf;
			t.kind = CB_FLOW_NODEPORT;
			r = cb_stateful(&f, &t);
			if (r)
				return cb_drop(skb, r);
			pf->expires = cb_peer_flow_step(pf, &f, 1);
			peer.vtep = pf->vtep;
			net = bpf_map_lookup_elem(&cb_networks, &pf->net);
			if (!net)
				return cb_drop(skb, CB_DROP_UNKNOWN_NETWORK);
			cb_ep_tx(skb, ifc->slot);
			return cb_encap_vxlan(skb, net, &peer);
		}
	}
	if (bpf_map_lookup_elem(&cb_host_ips, &f.daddr)) {
		/* The host's own address: its stack takes it (local delivery, no forwarding),
		 * from the endpoint its route to that source leads to: never from an endpoint of
		 * another tenant that holds the same address. Not the metadata address, even
		 * the host's own (a metadata proxy answers as the node). */
		if (cb_metadata_refused(f.daddr, cb_get_config()))
			return cb_drop(skb, CB_DROP_EGRESS_LINK_LOCAL);
		hr = bpf_map_lookup_elem(&cb_host_routes, &f.saddr);
		if (!hr || hr->ifindex != skb->ifindex)
			return cb_drop(skb, CB_DROP_HOST_NO_ROUTE);
		t.kind = CB_FLOW_HOST;
		r = cb_stateful(&f, &t);
		if (r)
			return cb_drop(skb, r);
		bpf_skb_change_type(skb, 0 /* PACKET_HOST */);
		cb_ep_tx(skb, ifc->slot);
		cb_count(skb, CB_FWD_HOST);
		return TC_ACT_OK;
	}
	cfg = cb_get_config();
	if ((cb_features & CB_FEAT_BGP) && net->encap == CB_ENCAP_VLAN && !(net->flags & CB_NET_SNAT)) {
		/* Native routing without NAT: out of the uplink by a learned route, from the
		 * endpoint's own address (the fabric routes the replies back by its /32). */
		if (cb_dst_invalid(f.daddr))
			return cb_drop(skb, CB_DROP_EGRESS_INVALID_DST);
		if (cb_dst_link_local(f.daddr, cfg))
			return cb_drop(skb, CB_DROP_EGRESS_LINK_LOCAL);
		r = cb_stateful(&f, &t);
		if (!r)
			r = cb_route_rewrite(skb, cfg);
		if (r)
			return cb_drop(skb, r);
		cb_ep_tx(skb, ifc->slot);
		return cb_native_out(skb, f.daddr);
	}
	if (!cfg || !cfg->snat_ip || !cfg->egress_ifindex || !(net->flags & CB_NET_SNAT))
		return cb_drop(skb, CB_DROP_TO_GATEWAY);
	if (cb_dst_invalid(f.daddr))
		return cb_drop(skb, CB_DROP_EGRESS_INVALID_DST);
	if (cb_dst_link_local(f.daddr, cfg))
		return cb_drop(skb, CB_DROP_EGRESS_LINK_LOCAL);
	/* From this host's address, a datagram to the overlay's port would be a tunnel packet
	 * of this host on the peer it reaches (any VNI, any inner source): never. */
	if (f.proto == CB_PROTO_UDP && cfg->vxlan_port && f.dport == cfg->vxlan_port)
		return cb_drop(skb, CB_DROP_EGRESS_OVERLAY);
	dkey.net = nk;
	if (!cb_hand(&p, &f, &t, 0, &dkey))
		return cb_drop(skb, CB_DROP_NO_STAGE);
	return CB_EGRESS;
}

/* cb_egress takes an egress flow's packet cb_outside handed over (s) on: policy and
 * conntrack, source NAT to this host's address, out of the egress device. */
static __noinline int cb_egress(struct __sk_buff *skb, const struct cb_iface *ifc, struct cb_handoff *s)
{
	struct cb_config *cfg = cb_get_config();
	struct cb_track t;
	int r;

	if (!s || !ifc)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	if (!cfg || !cfg->egress_ifindex)
		return cb_drop(skb, CB_DROP_TO_GATEWAY);
	cb_taken(s, &t, 0);
	r = cb_stateful(&s->f, &t);
	if (!r)
		r = cb_snat_egress(skb, &s->p, &s->f, &t, s->dkey.net);
	if (!r)
		r = cb_route_rewrite(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	cb_ep_tx(skb, ifc->slot);
	cb_count(skb, CB_FWD_EGRESS);
	return bpf_redirect_neigh(cfg->egress_ifindex, 0, 0, 0);
}

/* cb_nodeport_out sends a local backend's reply to a node port client (its flow's DNAT
 * entry in the node port zone): the reply is judged as its flow's, its source becomes
 * VIP:port and then the host's address and node port, and it leaves by the egress device.
 * Any other packet: CB_OUTSIDE. */
static __noinline int cb_nodeport_out(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_frag_key fk = {};
	struct cb_natfrag *n;
	struct cb_ct_entry *rev;
	__be32 backend;
	struct cb_config *cfg;
	__be16 np;
	int r;

	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	cfg = cb_get_config();
	if (!cfg || !cfg->snat_ip || !cfg->egress_ifindex)
		return CB_OUTSIDE;
	if (cb_parse_ipv4(skb, &p) || cb_parse_l4(skb, &p, &f))
		return CB_OUTSIDE; /* cb_outside judges it */
	t.zone = ifc->vrf;
	t.kind = CB_FLOW_NODEPORT;
	if (p.frag == CB_FRAG_LATER) {
		/* A later fragment of a reply whose first fragment left as the node port's. */
		cb_np_frag_key(&fk, t.zone, CB_CT_KIND_NODEPORT, f.saddr, f.daddr, &p, f.proto);
		n = cb_np_frag_find(&fk, CB_NATFRAG_SRC);
		if (!n)
			return CB_OUTSIDE;
		r = cb_nat(skb, &p, &f, 0, n->addr, 0);
		goto out;
	}
	if (p.inner.proto && p.frag != CB_FRAG_NONE)
		return CB_OUTSIDE;
	/* A reply, or the backend's ICMP error about the client's packet (cb_lb_reply). */
	rev = cb_lb_reply(&p, &f, t.zone, cb_ct_kind_of(&t));
	if (!rev || !(rev->flags & CB_CT_NODEPORT))
		return CB_OUTSIDE;
	np = rev->nodeport;
	t.src_epg = ifc->epg;
	t.owner = cb_ct_owner(ifc->slot);
	t.local = 1;
	t.svc_reply = 1;
	t.frag = p.frag;
	t.ip_id = p.ip_id;
	if (p.inner.proto)
		t.inner = &p.inner;
	r = cb_stateful(&f, &t);
	if (r)
		return cb_drop(skb, r);
	if (p.inner.proto) {
		/* It quotes client:cport → backend:target: the client sent it to the node port. */
		r = cb_icmp_quote_nat(skb, &p, 0, cfg->snat_ip, np);
		if (!r)
			r = cb_nat(skb, &p, &f, 0, cfg->snat_ip, 0);
	} else {
		backend = f.saddr;
		r = cb_nat(skb, &p, &f, 0, rev->nat_ip, rev->nat_port);
		if (!r)
			r = cb_nat(skb, &p, &f, 0, cfg->snat_ip, np);
		if (!r && p.frag == CB_FRAG_FIRST) {
			cb_np_frag_key(&fk, t.zone, CB_CT_KIND_NODEPORT, backend, f.daddr, &p, f.proto);
			cb_natfrag_record(&fk, CB_NATFRAG_SRC, cfg->snat_ip, 0);
		}
	}
out:
	if (!r)
		r = cb_route_rewrite(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	cb_ep_tx(skb, ifc->slot);
	cb_count(skb, CB_FWD_NODEPORT_REPLY);
	return bpf_redirect_neigh(cfg->egress_ifindex, 0, 0, 0);
}

/* cb_send_remote sends a local endpoint's packet (source MAC set) to remote endpoint ep
 * of network dnet (daddr: the packet's destination): VXLAN, VLAN, or routed natively,
 * counted in the sender's counter slot. */
static __noinline int cb_send_remote(struct __sk_buff *skb, __u32 slot, const struct cb_endpoint *ep, __u32 dnet,
				     __be32 daddr)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct cb_network *net;
	int r;

	if (!ep)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	if ((void *)(eth + 1) > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	/* The network is looked up only off the local fast path. */
	net = bpf_map_lookup_elem(&cb_networks, &dnet);
	if (!net)
		return cb_drop(skb, CB_DROP_UNKNOWN_NETWORK);
	cb_mac_copy(eth->h_dest, ep->mac);
	if (net->encap == CB_ENCAP_VLAN && (cb_features & CB_FEAT_BGP))
		r = cb_native_out(skb, daddr); /* routed (cb_route_rewrite before), untagged */
	else if (net->encap == CB_ENCAP_VLAN)
		r = cb_encap_vlan(skb, net);
	else
		r = cb_encap_vxlan(skb, net, ep);
	if (r != TC_ACT_SHOT)
		cb_ep_tx(skb, slot);
	return r;
}

/* cb_send_to forwards a local endpoint's packet (source MAC set) to endpoint ep of network
 * dnet: a local one's veth, or the remote one's host (cb_send_remote). */
CB_INLINE int cb_send_to(struct __sk_buff *skb, const struct cb_iface *ifc, const struct cb_endpoint *ep,
			 __u32 dnet, __be32 daddr)
{
	/* An unlimited local endpoint with one test, as before rate limits (qos.h). */
	if (ep->flags == CB_EP_LOCAL) {
		cb_ep_tx(skb, ifc->slot);
		return cb_deliver_to(skb, ep->mac, ep->slot, ep->ifindex, CB_FWD_LOCAL, 0);
	}
	if (ep->flags & CB_EP_LOCAL) {
		cb_ep_tx(skb, ifc->slot);
		return cb_deliver_local(skb, ep);
	}
	return cb_send_remote(skb, ifc->slot, ep, dnet, daddr);
}

/* cb_dst_noted returns the interface entry of local endpoint net:ip, and its host veth in
 * *ifindex, when entry e's note (dst_ifindex: cb_dst_note) still names it: the array read
 * the verifier inlines instead of the endpoint table's hash lookup. The entry under that
 * ifindex is the endpoint's while it lives there (an endpoint that moves or goes takes
 * its entry with it; an ifindex reused holds another address or none). 0: look it up. */
CB_INLINE const struct cb_iface *cb_dst_noted(const struct cb_ct_entry *e, __u32 net, __be32 ip, __u32 *ifindex)
{
	const struct cb_iface *d;
	__u32 ifx = e->dst_ifindex;

	if (!ifx || (e->flags & CB_CT_NODEPORT))
		return 0;
	d = bpf_map_lookup_elem(&cb_iface_direct, &ifx);
	if (!d || d->ip != ip || d->net != net)
		return 0;
	*ifindex = ifx;
	return d;
}

/* cb_dst_note notes in entry e (not a node port flow's, whose field it shares) the host
 * veth of its direction's destination ep when that is a local endpoint cb_dst_noted can
 * find (ifindex below CB_IFACE_DIRECT). */
CB_INLINE void cb_dst_note(struct cb_ct_entry *e, const struct cb_endpoint *ep)
{
	if ((ep->flags & CB_EP_LOCAL) && ep->ifindex < CB_IFACE_DIRECT && !(e->flags & CB_CT_NODEPORT) &&
	    e->dst_ifindex != ep->ifindex)
		e->dst_ifindex = ep->ifindex;
}

/* cb_deliver_noted delivers to the local endpoint cb_dst_noted found (d, behind ifindex)
 * as cb_send_to delivers to a local endpoint. */
CB_INLINE int cb_deliver_noted(struct __sk_buff *skb, const struct cb_iface *ifc, const struct cb_iface *d,
			       __u32 ifindex)
{
	cb_ep_tx(skb, ifc->slot);
	/* d is an array entry: never an endpoint with QoS (ifaces.go), whose packets take
	 * cb_deliver_as with its endpoint entry's flag. */
	return cb_deliver_to(skb, d->mac, d->slot, ifindex, CB_FWD_LOCAL, 0);
}

/* cb_svc_ct_again is the client→VIP entry of service flow f (t) again, for the judging
 * program when the service stage found one: live and a service flow's, else 0. (A call
 * of its own: its key stays off the judging frames.) */
static __noinline struct cb_ct_entry *cb_svc_ct_again(const struct cb_flow *f, const struct cb_track *t)
{
	struct cb_ct_key key = {};
	struct cb_ct_entry *cur;

	if (!f || !t)
		return 0;
	cb_lb_key(&key, f, t);
	cur = cb_ct_live(&key, cb_now());
	return cur && (cur->flags & CB_CT_SVC) ? cur : 0;
}

/* cb_ipv4_front returns CB_JUDGE with the packet's state in cb_handoff_scratch (the second
 * program's), a tc verdict, or CB_OUTSIDE for cb_stage_outside. */
#define CB_JUDGE (-8)

static __noinline int cb_ipv4_front(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_lb_choice lc = {};
	struct cb_endpoint *ep;
	struct cb_ct_entry *rev = 0;
	struct cb_ep_key dkey = {};
	struct cb_handoff *s;
	__u32 features = 0, dnet = ifc->net;
	int r;

	r = cb_parse_ipv4(skb, &p);
	if (r)
		return cb_drop(skb, r);
	if (p.ip->saddr != ifc->ip)
		return cb_drop(skb, CB_DROP_SPOOFED_SRC);
	f.saddr = p.ip->saddr;
	f.daddr = p.ip->daddr;
	t.zone = ifc->vrf;
	t.frag = p.frag;
	t.ip_id = p.ip_id;
	t.owner = cb_ct_owner(ifc->slot); /* the sender's flows count against it */
	t.local = 1;

	features = cb_features;
	if (features & (CB_FEAT_POLICY | CB_FEAT_LB)) {
		r = cb_parse_l4(skb, &p, &f);
		if (r)
			return cb_drop(skb, r);
	}
	if ((features & CB_FEAT_LB) && p.frag == CB_FRAG_LATER) {
		t.client_net = dnet;
		r = cb_lb_frag(skb, &p, &f, &t, &lc);
		if (r)
			return cb_drop(skb, r);
		if (t.svc || lc.frag_snat)
			dnet = lc.net;
	} else if (features & CB_FEAT_LB) {
		/* A reply from a local backend: the VIP is restored after policy. */
		rev = cb_lb_reply(&p, &f, t.zone, cb_ct_kind_of(&t));
		if (rev) {
			dnet = rev->nat_net;
			t.svc_reply = 1;
			/* A hairpin reply goes to the VIP: its real destination is its sender. */
			if (rev->flags & CB_CT_HAIRPIN)
				t.hairpin = 1;
		} else if (p.inner.proto) {
			/* An ICMP error about a service's reply goes to its backend. */
			t.client_net = dnet;
			if (cb_lb_icmp_client(&p, &f, &t, &lc)) {
				r = cb_nat_icmp_client(skb, &p, &f, &t, &lc);
				if (r)
					return cb_drop(skb, r);
				dnet = lc.net;
			}
		} else {
			/* Service LB: DNAT before the destination lookup. Non-first fragments
			 * carry no ports (p.frag == CB_FRAG_LATER) and are never balanced. */
			t.client_net = dnet;
			r = cb_lb_forward(skb, &p, &f, &t, &lc);
			if (r == CB_DROP_NO_BACKEND)
				return cb_reject_no_backend(skb, &p, &f, 0);
			if (r)
				return cb_drop(skb, r);
			if (t.svc)
				dnet = lc.net;
		}
	}

	dkey.net = dnet;
	dkey.ip = t.svc_reply && t.hairpin ? f.saddr : f.daddr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
	if (!ep && (features & CB_FEAT_ROUTING)) {
		/* Routing mode: any network of the tenant. */
		ep = cb_route_lookup(ifc->net, f.daddr, &dnet);
		dkey.net = dnet;
	}
	if (!ep) {
		if (t.svc || t.svc_reply)
			return cb_drop(skb, CB_DROP_UNKNOWN_DST);
		return CB_OUTSIDE;
	}
	/* A client talking to itself through its service is not policy's business. */
	if (!t.hairpin) {
		t.src_epg = ifc->epg;
		t.dst_epg = ep->epg;
	}
	s = cb_hand(&p, &f, &t, &lc, &dkey);
	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	s->ep = *ep;
	s->features = features;
	return CB_JUDGE;
}

/* cb_ipv4_judge takes the packet cb_ipv4_front handed over (its state in s) on: policy
 * and conntrack, the service's choice committed and its replies un-NATed, routed, sent.
 * It returns a tc verdict, or CB_TTL_OUT for cb_ttl_exceeded (the packet as it came: in a
 * frame beside this one). */
#define CB_TTL_OUT (-7)

static __noinline int cb_ipv4_judge(struct __sk_buff *skb, const struct cb_iface *ifc, struct cb_handoff *s)
{
	struct cb_pkt *p;
	struct cb_flow *f;
	struct cb_track t;
	struct cb_lb_choice lc;
	struct cb_endpoint *ep;
	struct cb_config *cfg;
	struct ethhdr *eth;
	void *data_end;
	__u32 features, dnet;
	int r;

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	p = &s->p; /* (read and rewritten in place: the frame is short) */
	f = &s->f;
	cb_taken(s, &t, &lc);
	features = s->features;
	dnet = s->dkey.net;
	ep = &s->ep; /* the destination as it was judged */

	if (features & (CB_FEAT_POLICY | CB_FEAT_LB)) {
		if (s->svc_ct && t.svc)
			lc.svc_ct = cb_svc_ct_again(f, &t);
		r = cb_stateful(f, &t);
		if (r)
			return cb_drop(skb, r);
		if (t.svc) {
			r = cb_lb_commit(&lc, p, f, &t);
			if (r)
				return cb_drop(skb, r);
		}
		r = cb_lb_finish(skb, p, f, &t, &lc);
		if (r)
			return cb_drop(skb, r);
		if (t.rev_nat) {
			if (t.inner)
				r = cb_nat_icmp_error(skb, p, f, t.rev_nat);
			else if (t.rev_nat->flags & CB_CT_HAIRPIN)
				r = cb_nat_hairpin_reply(skb, p, f, t.rev_nat);
			else
				r = cb_lb_unnat(skb, p->l4_off, f->proto, f->has_ports, f->saddr, f->sport, t.rev_nat);
			if (r)
				return cb_drop(skb, r);
		}
	}

	if (features & CB_FEAT_ROUTING) {
		cfg = cb_get_config();
		r = cb_route_rewrite(skb, cfg);
		/* Its TTL ran out: the program answers it from the router it addressed, unless
		 * the packet was translated (a service flow's: the error would quote what the
		 * client never sent). The packet is as it came: cb_route_rewrite changes nothing
		 * when it refuses. */
		if (r == CB_DROP_TTL_EXCEEDED && !t.svc && !t.svc_reply && !t.svc_icmp)
			return CB_TTL_OUT;
		if (r)
			return cb_drop(skb, r);
	}

	cb_barrier_var(skb); /* (else the compiler reads the context through a moved pointer) */
	data_end = (void *)(long)skb->data_end;
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	if (!(features & CB_FEAT_ROUTING))
		cb_mac_copy(eth->h_source, ifc->mac);

	return cb_send_to(skb, ifc, ep, dnet, f->daddr);
}

#define CB_SLOW (-6)

/* cb_ipv4_simple says whether ip is what the fast paths take: an IPv4 header without
 * options, in the linear part, not a fragment, from address own (the interface's), with a
 * total length the frame holds (cb_parse_ipv4 passes all of these). */
CB_INLINE int cb_ipv4_simple(const struct __sk_buff *skb, const struct iphdr *ip, void *data_end, __be32 own)
{
	__u32 tot;

	if ((void *)(ip + 1) > data_end || *(__u8 *)ip != 0x45 || (ip->frag_off & bpf_htons(0x3fff)) ||
	    ip->saddr != own)
		return 0;
	tot = bpf_ntohs(ip->tot_len);
	return tot >= sizeof(struct iphdr) && tot <= skb->len - ETH_HLEN;
}

/* cb_svc_memo_off, set by the agent, turns the memo below off: its soundness rests on
 * loads not passing loads (x86), and on other machines the agent sets it. */
volatile __u32 cb_svc_memo_off;

/* cb_svc_fast takes, for cb_ipv4_fast, a packet of an established service flow (svc: the
 * live-or-not client→VIP entry under its tuple, k->ct) to its backend exactly as the full
 * stage would (cb_lb_reply, cb_lb_forward, cb_ct_check, cb_lb_commit): when the entry is
 * live and not shadowed (no service flow's entry under the reverse tuple can make the
 * packet a reply: cb_ct_shadow), its backend still a member and not the client itself,
 * the flow's own entry (client→backend) live, not older than its groups' stamps, allowed and a
 * service flow's of this VIP and network with nothing else (flags exactly ALLOWED and
 * DNAT), and the backend an endpoint: the destination becomes the backend, the flow's
 * entry is refreshed and the client→VIP entry follows its deadline. Otherwise CB_SLOW,
 * nothing changed.
 * The membership holds without a lookup while the service's revision (cb_svc_revs) is the
 * one the entry recorded (cb_lb_forward) or its memo's stamp is current. The memo
 * (CB_CT_MEMO; docs/conntrack.md "The service fast path's memo") is what this path last
 * found of the flow's entry, stamped (cb_svc_memo_stamp) before it looked: while the
 * stamp is current and the tick the same, nothing of that entry changed and a refresh
 * would write what it holds, so the entry is not looked up. */
CB_INLINE int cb_svc_fast(struct __sk_buff *skb, const struct cb_iface *ifc, struct cb_fast_keys *k,
			  struct cb_ct_entry *svc, __u32 ack)
{
	__u64 now = cb_now();
	struct cb_ct_entry *e = 0;
	struct cb_ep_key dkey;
	struct cb_endpoint *ep = 0;
	const struct cb_iface *d;
	void *data, *data_end;
	__be32 client = k->ct.saddr, vip = k->ct.daddr, backend = svc->nat_ip;
	__be16 vport = k->ct.dport, bport = svc->nat_port;
	__u32 bnet = svc->nat_net, dif = 0, rev, stamp, need = 0;
	__u16 bepg;
	__u8 memo = svc->state;
	int r;

	if (svc->expires < now || (svc->flags & CB_CT_SHADOW) || (backend == client && bnet == ifc->net))
		return CB_SLOW;
	/* The backend (its group: read before the groups' stamps, stamps.h). */
	d = cb_dst_noted(svc, bnet, backend, &dif);
	if (d) {
		bepg = d->epg;
	} else {
		dkey.net = bnet;
		dkey.ip = backend;
		ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
		if (!ep)
			return CB_SLOW;
		bepg = ep->epg;
	}
	cb_epg_track(ifc->epg, bepg, ifc->vrf, &need); /* the flow's entry must have reached need */
	rev = cb_svc_rev_of(svc->svc_id); /* before the membership: a removal bumps it after */
	stamp = cb_svc_memo_off ? 0 : cb_svc_memo_stamp(rev, need); /* before the flow's entry is looked at */
	if (!(memo & CB_CT_MEMO) || svc->epoch != stamp || !stamp) {
		/* No current memo: the backend must still be a member (cb_lb_member, as the
		 * full stage asks). */
		if (!rev || !cb_lb_member(svc, backend, rev))
			return CB_SLOW;
		memo = 0;
	} else if (svc->expires != now + cb_ct_timeout(k->ct.proto, memo & CB_CT_MEMO_STATE) ||
		   cb_tcp_note_due(ack, svc->tcp_ack[0])) {
		memo = 0; /* current, but a refresh would move the deadline, or a note is due */
	}
	if (!memo) {
		/* The flow's own entry: client:cport → backend:bport. (With a current memo in
		 * the tick it was taken in, nothing of it changed since and its refresh would
		 * write what it holds.) */
		k->ct.daddr = backend;
		k->ct.dport = bport;
		e = bpf_map_lookup_elem(&cb_ct, &k->ct);
		if (!cb_ct_trusted(e, now, CB_CT_ALLOWED | CB_CT_DNAT, need) || !cb_ct_restores(e, vip, vport, ifc->net))
			return CB_SLOW;
	}
	r = cb_nat_rewrite(skb, ETH_HLEN + sizeof(struct iphdr), k->ct.proto, 1, 1, vip, backend, vport, bport);
	if (r)
		return cb_drop(skb, r);
	if (e) {
		cb_ct_pass(e, k->ct.proto, 0, ack, now, 1); /* its note: into the memo below */
		cb_lb_follow(svc, e->expires);
		/* The memo: what was just found, under the stamp read before (memo off: the
		 * revision the membership was found at, as cb_lb_forward records it); not when
		 * the entry names another backend meanwhile (a re-pick on another CPU) or is no
		 * client→VIP entry any more (deleted, its element reused). */
		memo = stamp ? CB_CT_MEMO | (e->state & CB_CT_MEMO_STATE) : CB_CTS_NEW;
		if (!stamp)
			stamp = rev;
		if ((svc->epoch != stamp || svc->state != memo || svc->tcp_ack[0] != e->tcp_ack[0]) &&
		    svc->nat_ip == backend && svc->nat_port == bport && svc->nat_net == bnet && (svc->flags & CB_CT_SVC)) {
			svc->epoch = stamp;
			svc->state = memo;
			svc->tcp_ack[0] = e->tcp_ack[0];
		}
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	cb_mac_copy(((struct ethhdr *)data)->h_source, ifc->mac);
	if (d)
		return cb_deliver_noted(skb, ifc, d, dif);
	if (!ep) /* never: found above (for the verifier) */
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	cb_dst_note(svc, ep);
	return cb_send_to(skb, ifc, ep, bnet, backend);
}

/* cb_ipv4_fast is the fast stage's path with policy, services or NetworkPolicy on (not
 * routing), for cb_fast_stage, which checked the frame and its IPv4 header against ifc
 * (cb_ipv4_simple): a TCP or UDP packet, neither opening nor closing, to an endpoint of
 * its network, that cb_fast_pass lets through (established flows, flows between groups
 * without rules, no service flow), goes to that endpoint (cb_send_to) exactly as the
 * container stage would take it (same checks, state changes, rewrites and counters).
 * Anything else returns CB_SLOW having changed nothing. Inlined into the fast stage: one
 * call and return less per packet and one frame less on the deepest chain (the fast
 * stage's sits under nothing but the entry program's). */
CB_INLINE int cb_ipv4_fast(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	void *data, *data_end;
	struct iphdr *ip;
	struct cb_l4_ports *l4;
	struct cb_fast_keys k = {};
	struct cb_ep_key dkey;
	struct cb_endpoint *ep = 0;
	const struct cb_iface *d = 0;
	struct cb_ct_entry *e, *rev = 0;
	__u32 features = cb_features, tracked, dif = 0, need = 0, ack = 0;
	__u16 depg;
	__be16 sport;
	__be32 saddr;
	int r;

	if (!skb || !ifc)
		return CB_SLOW;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	l4 = (void *)(ip + 1);
	/* The caller found the header simple (cb_ipv4_simple) and from ifc's address. */
	if ((void *)l4 > data_end)
		return CB_SLOW;
	/* The L4 header cb_parse_l4 would read, whole in the linear part. */
	if (ip->protocol == CB_PROTO_TCP) {
		if ((void *)l4 + 20 > data_end || (((__u8 *)l4)[13] & (CB_TCP_SYN | CB_TCP_FIN | CB_TCP_RST)))
			return CB_SLOW;
		if (((__u8 *)l4)[13] & CB_TCP_ACK)
			ack = bpf_ntohl(*(__u32 *)((__u8 *)l4 + 8)); /* (conntrack's window) */
	} else if (ip->protocol != CB_PROTO_UDP || (void *)l4 + 8 > data_end) {
		return CB_SLOW;
	}
	k.ct.zone = ifc->vrf;
	k.ct.saddr = ip->saddr;
	k.ct.daddr = ip->daddr;
	saddr = ip->saddr;
	sport = l4->sport;
	k.ct.sport = sport;
	k.ct.dport = l4->dport;
	k.ct.proto = ip->protocol;
	k.svc.zone = ifc->vrf;
	k.svc.vip = ip->daddr;
	k.svc.port = l4->dport;
	k.svc.proto = ip->protocol;
	e = bpf_map_lookup_elem(&cb_ct, &k.ct);
	if ((features & CB_FEAT_LB) && e && (e->flags & CB_CT_SVC))
		return cb_svc_fast(skb, ifc, &k, e, ack);
	dkey.net = ifc->net;
	dkey.ip = ip->daddr;
	/* The destination: noted in the flow's entry, else looked up. */
	if (e)
		d = cb_dst_noted(e, dkey.net, dkey.ip, &dif);
	if (d) {
		depg = d->epg;
	} else {
		ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
		/* (A VIP, a service reply's destination, or outside the network: the
		 * container stage's.) */
		if (!ep)
			return CB_SLOW;
		depg = ep->epg;
	}
	/* Tracked: a group with rules, or (NetworkPolicy) a pod with an entry (cb_track_flags).
	 * An entry is trusted when not older than need, its groups' (and zone's) stamps. */
	tracked = cb_epg_track(ifc->epg, depg, ifc->vrf, &need);
	if (!tracked && (features & CB_FEAT_NETPOL))
		tracked = cb_kpod_of(ifc->vrf, k.ct.saddr) || cb_kpod_of(ifc->vrf, k.ct.daddr);
	if (!cb_fast_pass(&k, e, tracked, features & CB_FEAT_LB, ifc->net, need, ack, &rev))
		return CB_SLOW;
	if (rev) {
		/* A service's reply leaves from its VIP:port (after policy, as in the full stage).
		 * The source as the packet carries it (checked against the entry's address
		 * once): the entry in place may be freed meanwhile, its address read as 0
		 * (TestServiceFastReplyEntryFreed). */
		r = cb_lb_unnat(skb, ETH_HLEN + sizeof(struct iphdr), k.ct.proto, 1, saddr, sport, rev);
		if (r)
			return cb_drop(skb, r);
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	cb_mac_copy(((struct ethhdr *)data)->h_source, ifc->mac);
	if (d)
		return cb_deliver_noted(skb, ifc, d, dif);
	if (!ep) /* never: found above (for the verifier) */
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	if (e)
		cb_dst_note(e, ep);
	return cb_send_to(skb, ifc, ep, dkey.net, dkey.ip);
}

/* cb_fast_stage is cb_from_container's one stage of its own, the fast stage: ifc is the
 * packet's interface entry read in place from cb_iface_direct (an entry in the cb_ifaces
 * hash, past that array, of an endpoint with QoS, or an earlier build's not yet moved,
 * goes to the container stage, which copies it: the agent gives every host veth an ifindex
 * inside the array where one is free, ifaces.go and vethindex.go). Inlined into the entry
 * program, its only caller: a call and return less per packet (a global function cost the
 * local path about a nanosecond, 4 % of the reference forwarder), and the entry's own body
 * is nothing but this stage and its tail call (TestOneWayIn). Its address is read once,
 * and must be set: an array entry being freed loses its address first (ifaces.go), so no
 * packet from 0.0.0.0 matches a free place. The other fields are read as needed; the
 * agent's second write of a free (zeroes) can land meanwhile, and then the lookups by them
 * miss or the packet goes to the container stage, which takes a copy. It takes (not in
 * routing mode) an untagged IPv4 frame, with the entry's MAC and a header cb_ipv4_simple
 * takes, from an endpoint without QoS: with a stage with state on to cb_ipv4_fast,
 * otherwise to its endpoint, local or remote (cb_send_to), exactly as the container stage
 * would take it (same checks, state changes, rewrites and counters). Anything else
 * returns CB_SLOW having changed nothing: the container stage takes it from the start,
 * every identity check made again (an endpoint with QoS has all its packets judged
 * there, after its rate and DSCP). */
CB_INLINE int cb_fast_stage(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct cb_ep_key dkey;
	struct cb_endpoint *ep;
	__be32 own;

	if (!skb || !ifc)
		return CB_SLOW;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) || skb->vlan_present)
		return CB_SLOW;
	own = *(volatile const __be32 *)&ifc->ip; /* one read: the check and the match see the same */
	if (!own || ifc->qos || !cb_mac_eq(eth->h_source, ifc->mac) || !cb_ipv4_simple(skb, ip, data_end, own))
		return CB_SLOW;
	if (cb_features & CB_FEAT_STATEFUL)
		return cb_ipv4_fast(skb, ifc);
	dkey.net = ifc->net;
	dkey.ip = ip->daddr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
	if (!ep)
		return CB_SLOW; /* outside its network: the container stage's */
	return cb_send_to(skb, ifc, ep, dkey.net, dkey.ip);
}

/* ---- Stages reached by tail call ----
 * An entry program classifies its packet and takes what its fast paths take; the rest it
 * hands to a stage: a program of its own, verified on its own budget (1,000,000
 * instructions, 512 bytes of stack), reached through the program array cb_calls. Each load
 * of the programs has its own array (never shared between builds), which the driver pins
 * under calls/ before any link takes the programs and unpins once no link runs the
 * programs of an earlier load: the kernel empties a program array its last pin or file
 * goes from, and a running entry program is never left without its stages (docs/ebpf.md
 * "Stages"). The interface entry the container stage copied (cb_iface_scratch, per CPU) is
 * the later stages': nothing else runs on the CPU between a program and its tail call. A
 * missing stage drops the packet, counted (drop_no_stage): never forwarded unjudged. */
enum cb_call {
	CB_CALL_CONTAINER = 0, /* cb_stage_container: what the fast stage left of a container's packet */
	CB_CALL_OUTSIDE = 1, /* cb_stage_outside: a container's packet bound outside its network */
	CB_CALL_IPV4_JUDGE = 2, /* cb_stage_ipv4_judge: the full stage's policy, conntrack, forwarding */
	CB_CALL_REMOTE_JUDGE = 3, /* cb_stage_remote_judge: from another host, policy to delivery */
	CB_CALL_PEER_HOST = 4,  /* cb_stage_peer_host: from a peer host's own address */
	CB_CALL_NODEPORT_BACK = 5, /* cb_stage_nodeport_back: a remote backend's node port reply */
	CB_CALL_UPLINK_DELIVER = 6, /* cb_stage_uplink_deliver: from outside to a local endpoint */
	CB_CALL_NODEPORT_JUDGE = 7, /* cb_stage_nodeport_judge: a node port flow, policy to delivery */
	CB_CALL_EGRESS = 8,     /* cb_stage_egress: an egress flow, policy to source NAT */
	CB_CALL_MAX = 16,
};

/* cb_ipv4_outside takes a local endpoint's packet to no endpoint it reaches directly: a node
 * port flow's reply (cb_nodeport_out), else cb_outside. */
CB_INLINE int cb_ipv4_outside(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	int r;

	if (cb_features & CB_FEAT_NODEPORT) {
		r = cb_nodeport_out(skb, ifc);
		if (r != CB_OUTSIDE)
			return r;
	}
	return cb_outside(skb, ifc);
}

/* cb_iface_copied is the interface entry the container stage copied for this packet. */
CB_INLINE struct cb_iface *cb_iface_copied(void)
{
	__u32 zero = 0;
	struct cb_iface *ifc = bpf_map_lookup_elem(&cb_iface_scratch, &zero);

	return ifc && ifc->ip ? ifc : 0;
}

CB_INLINE int cb_stage(struct __sk_buff *skb, __u32 call);

/* cb_stage_container is cb_from_container's one way on (CB_CALL_CONTAINER): every packet
 * the fast stage (cb_fast_stage) did not finish, from the start. It copies the interface
 * entry (cb_iface_get: the stages after it read the copy), checks the frame's identity
 * (source MAC, no VLAN tag), answers ARP, applies an endpoint's QoS, then the first program
 * of the full IPv4 stage: source, service, destination (cb_ipv4_front); then the second
 * program (cb_stage_ipv4_judge) or the way outside (cb_stage_outside). */
SEC("tc")
int cb_stage_container(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct cb_iface *ifc;
	int r;

	cb_clock_start(); /* the full stage's verdicts record the clock as of now (stamps.h) */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	ifc = cb_iface_get(skb->ifindex);
	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	/* A container speaks only with its own MAC (its IPv4 source and ARP sender are checked
	 * by their stages). */
	if (!cb_mac_eq(eth->h_source, ifc->mac))
		return cb_drop(skb, CB_DROP_SPOOFED_SRC);
	/* A container never sends VLAN tags (VLAN hopping): offloaded or in the frame. */
	if (skb->vlan_present || eth->h_proto == bpf_htons(CB_ETH_P_8021Q) ||
	    eth->h_proto == bpf_htons(CB_ETH_P_8021AD))
		return cb_drop(skb, CB_DROP_VLAN_TAGGED);
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return cb_arp_respond(skb, ifc);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return cb_drop(skb, CB_DROP_NOT_IPV4);
	/* Its rate and DSCP before anything else (the fast stage never takes its packets). */
	if (ifc->qos) {
		r = cb_qos_out(skb, ifc->slot, ifc->qos);
		if (r)
			return cb_drop(skb, r);
	}
	r = cb_ipv4_front(skb, ifc);
	if (r == CB_JUDGE)
		return cb_stage(skb, CB_CALL_IPV4_JUDGE);
	if (r == CB_OUTSIDE)
		return cb_stage(skb, CB_CALL_OUTSIDE);
	return r;
}

/* cb_stage_ipv4_judge is the second program of the full IPv4 stage (CB_CALL_IPV4_JUDGE):
 * policy, conntrack, forwarding (cb_ipv4_judge) of what cb_stage_container handed over, then an
 * expired TTL's answer. */
SEC("tc")
int cb_stage_ipv4_judge(struct __sk_buff *skb)
{
	struct cb_iface *ifc = cb_iface_copied();
	int r;

	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	r = cb_ipv4_judge(skb, ifc, cb_handoff_get());
	if (r == CB_TTL_OUT)
		return cb_ttl_exceeded(skb, cb_gateway_of(ifc->net));
	return r;
}

/* cb_stage_outside takes (CB_CALL_OUTSIDE) a packet cb_stage_container found bound outside
 * its network, from the address of its copy. */
SEC("tc")
int cb_stage_outside(struct __sk_buff *skb)
{
	struct cb_iface *ifc = cb_iface_copied();

	int r;

	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	r = cb_ipv4_outside(skb, ifc);
	if (r == CB_EGRESS)
		return cb_stage(skb, CB_CALL_EGRESS);
	return r;
}

/* cb_stage_egress takes (CB_CALL_EGRESS) an egress flow's packet cb_outside handed over:
 * policy, conntrack, source NAT, out (cb_egress). */
SEC("tc")
int cb_stage_egress(struct __sk_buff *skb)
{
	struct cb_iface *ifc = cb_iface_copied();

	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	return cb_egress(skb, ifc, cb_handoff_get());
}

/* (The stages of packets from other hosts, defined below.) */
int cb_stage_remote_judge(struct __sk_buff *skb);
int cb_stage_peer_host(struct __sk_buff *skb);
int cb_stage_nodeport_back(struct __sk_buff *skb);
int cb_stage_uplink_deliver(struct __sk_buff *skb);
int cb_stage_nodeport_judge(struct __sk_buff *skb);

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, CB_CALL_MAX);
	__uint(key_size, sizeof(__u32));
	__array(values, int(struct __sk_buff *));
} cb_calls SEC(".maps") = {
	.values = {
		[CB_CALL_CONTAINER] = (void *)&cb_stage_container,
		[CB_CALL_OUTSIDE] = (void *)&cb_stage_outside,
		[CB_CALL_IPV4_JUDGE] = (void *)&cb_stage_ipv4_judge,
		[CB_CALL_REMOTE_JUDGE] = (void *)&cb_stage_remote_judge,
		[CB_CALL_PEER_HOST] = (void *)&cb_stage_peer_host,
		[CB_CALL_NODEPORT_BACK] = (void *)&cb_stage_nodeport_back,
		[CB_CALL_UPLINK_DELIVER] = (void *)&cb_stage_uplink_deliver,
		[CB_CALL_NODEPORT_JUDGE] = (void *)&cb_stage_nodeport_judge,
		[CB_CALL_EGRESS] = (void *)&cb_stage_egress,
	},
};

/* cb_stage hands the packet to stage call; it returns only when the stage is missing. */
CB_INLINE int cb_stage(struct __sk_buff *skb, __u32 call)
{
	bpf_tail_call(skb, &cb_calls, call);
	return cb_drop(skb, CB_DROP_NO_STAGE);
}

/* cb_from_container is the way in of a container's packets, one per packet: the fast
 * stage on the interface entry read in place from the array (not in routing mode; the
 * array alone: a hash lookup behind it cost the established flow's packet 2-4 ns), and
 * whatever that does not finish, or whose entry is not in the array, by one tail call to
 * the container stage, which checks and judges it from the start. Nothing else: the entry
 * program holds no second copy of any check or path. */
SEC("tc")
int cb_from_container(struct __sk_buff *skb)
{
	const struct cb_iface *ifc;
	__u32 ifx = skb->ifindex;
	int r;

	cb_pull(skb, ETH_HLEN);
	if (!(cb_features & CB_FEAT_ROUTING) && ifx < CB_IFACE_DIRECT) {
		ifc = bpf_map_lookup_elem(&cb_iface_direct, &ifx);
		if (ifc) {
			r = cb_fast_stage(skb, ifc);
			if (r != CB_SLOW)
				return r;
		}
	}
	return cb_stage(skb, CB_CALL_CONTAINER);
}

/* cb_remote_rx takes a frame that arrived from another host in network net_key (already
 * validated; zone is its tenant's routing domain) to the local endpoint it is addressed
 * to, as far as the hand-over: it returns CB_JUDGE (cb_stage_remote_judge), CB_PEER_HOST
 * or CB_NODEPORT_BACK with the packet's state noted (cb_handoff), or a tc verdict. vtep is
 * the outer source of an overlay packet (0 on the VLAN uplink): the inner source must be a
 * remote endpoint behind that VTEP. */
#define CB_PEER_HOST (-4)       /* from the peer host's own address: cb_stage_peer_host */
#define CB_NODEPORT_BACK (-5)   /* to this host's address: cb_stage_nodeport_back */

/* cb_remote_hand notes where a packet from another host arrived (network net_key of zone,
 * from VTEP vtep) for the stage cb_remote_rx returns (code; cb_remote_staged calls it). */
CB_INLINE int cb_remote_hand(struct __sk_buff *skb, __u32 net_key, __u32 zone, __be32 vtep, int code)
{
	struct cb_handoff *s = cb_handoff_get();

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	s->net_key = net_key;
	s->zone = zone;
	s->vtep = vtep;
	return code;
}

static __noinline int cb_remote_rx(struct __sk_buff *skb, __u32 net_key, __u32 zone, __be32 vtep)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_lb_choice lc = {};
	struct cb_endpoint *ep, *src;
	struct cb_ct_entry *rev = 0;
	struct cb_ep_key skey = {}, dkey = {};
	struct cb_config *cfg;
	struct cb_handoff *s;
	__u32 features = 0, src_net = 0;
	int r;

	r = cb_parse_eth(skb, &p);
	if (r)
		return cb_drop(skb, r);
	if (p.eth->h_proto == bpf_htons(ETH_P_ARP))
		return cb_drop(skb, CB_DROP_ARP_FROM_OVERLAY);
	if (p.eth->h_proto != bpf_htons(ETH_P_IP))
		return cb_drop(skb, CB_DROP_NOT_IPV4);
	r = cb_parse_ipv4(skb, &p);
	if (r)
		return cb_drop(skb, r);
	f.saddr = p.ip->saddr;
	f.daddr = p.ip->daddr;
	t.zone = zone;
	t.frag = p.frag;
	t.ip_id = p.ip_id;

	features = cb_features;
	skey.net = net_key;
	skey.ip = f.saddr;
	src = bpf_map_lookup_elem(&cb_endpoints, &skey);
	if (!src && (features & CB_FEAT_ROUTING))
		src = cb_route_lookup(net_key, f.saddr, &src_net); /* routed from another network */
	if (src && (src->flags & CB_EP_LOCAL))
		return cb_drop(skb, CB_DROP_REMOTE_SRC);
	if (vtep && !src && f.saddr == vtep)
		return cb_remote_hand(skb, net_key, zone, vtep, CB_PEER_HOST); /* the peer host itself */
	/* The overlay proves nothing but the outer source: the inner source must be an
	 * endpoint that host owns. */
	if (vtep && (!src || src->vtep != vtep))
		return cb_drop(skb, CB_DROP_OVERLAY_SPOOF);
	if (features & (CB_FEAT_POLICY | CB_FEAT_LB)) {
		r = cb_parse_l4(skb, &p, &f);
		if (r)
			return cb_drop(skb, r);
	}
	dkey.net = net_key;
	if ((features & CB_FEAT_LB) && p.frag == CB_FRAG_LATER) {
		/* A later fragment of a remote backend's reply. */
		r = cb_lb_frag(skb, &p, &f, &t, &lc);
		if (r)
			return cb_drop(skb, r);
		if (lc.frag_snat)
			dkey.net = lc.net;
	} else if (features & CB_FEAT_LB) {
		/* A reply from a remote backend to a local client. */
		rev = cb_lb_reply(&p, &f, zone, CB_CT_KIND_TENANT);
		if (rev) {
			dkey.net = rev->nat_net;
			t.svc_reply = 1;
		}
	}
	dkey.ip = f.daddr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
	if (!ep || !(ep->flags & CB_EP_LOCAL)) {
		cfg = cb_get_config();
		if (vtep && cfg && cfg->vtep && f.daddr == cfg->vtep)
			return cb_remote_hand(skb, net_key, zone, vtep, CB_NODEPORT_BACK); /* a backend's reply to a node port flow */
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	}
	/* Policy is enforced on every host a packet enters (both hold the same rules). */
	t.src_epg = src ? src->epg : 0;
	t.dst_epg = ep->epg;
	t.owner = cb_ct_owner_in(ep->slot); /* opened to the local receiver */
	s = cb_hand(&p, &f, &t, &lc, &dkey);
	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	s->ep = *ep;
	s->features = features;
	return cb_remote_hand(skb, net_key, zone, vtep, CB_JUDGE);
}

/* cb_remote_judge takes a packet from another host that cb_remote_rx handed over (its
 * state in s) on: policy and conntrack, a service reply un-NATed, delivered to its local
 * endpoint. */
static __noinline int cb_remote_judge(struct __sk_buff *skb, struct cb_handoff *s)
{
	struct cb_pkt *p;
	struct cb_flow *f;
	struct cb_track t;
	struct cb_lb_choice lc;
	struct cb_endpoint *ep;
	int r;

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	p = &s->p; /* (read and rewritten in place: the frame is short) */
	f = &s->f;
	cb_taken(s, &t, &lc);
	ep = &s->ep; /* the destination as it was judged (local: cb_remote_rx checked) */
	if (s->features & (CB_FEAT_POLICY | CB_FEAT_LB)) {
		r = cb_stateful(f, &t);
		if (r)
			return cb_drop(skb, r);
		r = cb_lb_finish(skb, p, f, &t, &lc);
		if (r)
			return cb_drop(skb, r);
		if (t.rev_nat) {
			if (t.inner)
				r = cb_nat_icmp_error(skb, p, f, t.rev_nat);
			else
				r = cb_lb_unnat(skb, p->l4_off, f->proto, f->has_ports, f->saddr, f->sport, t.rev_nat);
			if (r)
				return cb_drop(skb, r);
		}
	}
	return cb_deliver_local(skb, ep);
}

/* cb_peer_host_rx delivers a packet a peer host sent from its own address (VTEP vtep) in
 * network net_key: a node port flow it balanced to a local endpoint. Anyone on the peer
 * can send such a packet (VXLAN is plain UDP), so it is judged here like a node port
 * flow from outside whose client is the peer's address: by the endpoint's in-rules and
 * NetworkPolicy, with conntrack in the tenant's node port zone. A flow that passed is
 * remembered so the endpoint's replies go back to that peer through the tunnel
 * (nodeport.h). */
static __noinline int cb_peer_host_rx(struct __sk_buff *skb, __u32 net_key, __u32 zone, __be32 vtep)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_peer_flow_key k = {};
	struct cb_peer_flow v = {};
	struct cb_peer_flow *pf;
	struct cb_ep_key dkey = {};
	struct cb_track t = {};
	struct cb_endpoint *ep;
	int r;

	r = cb_parse_eth(skb, &p);
	if (!r)
		r = cb_parse_ipv4(skb, &p);
	if (!r)
		r = cb_parse_l4(skb, &p, &f);
	if (r)
		return cb_drop(skb, r);
	if (p.frag != CB_FRAG_NONE || !f.has_ports)
		return cb_drop(skb, CB_DROP_OVERLAY_SPOOF);
	dkey.net = net_key;
	dkey.ip = f.daddr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
	if (!ep || !(ep->flags & CB_EP_LOCAL))
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	t.zone = zone;
	t.kind = CB_FLOW_NODEPORT;
	t.dst_epg = ep->epg;
	t.owner = cb_ct_owner_in(ep->slot);
	r = cb_stateful(&f, &t);
	if (r)
		return cb_drop(skb, r);
	k.zone = zone;
	k.saddr = f.saddr;
	k.daddr = f.daddr;
	k.sport = f.sport;
	k.dport = f.dport;
	k.proto = f.proto;
	pf = bpf_map_lookup_elem(&cb_peer_flows, &k);
	if (pf && pf->vtep == vtep && pf->net == net_key && pf->expires >= cb_now()) {
		pf->expires = cb_peer_flow_step(pf, &f, 0);
	} else {
		v.state = CB_CTS_NEW;
		v.vtep = vtep;
		v.net = net_key;
		v.expires = cb_peer_flow_step(&v, &f, 0);
		if (bpf_map_update_elem(&cb_peer_flows, &k, &v, BPF_ANY) < 0)
			return cb_drop(skb, CB_DROP_CT_FULL);
	}
	return cb_deliver_local(skb, ep);
}

/* cb_nodeport_back takes a remote backend's reply to a node port flow this host sent it
 * (from the overlay, network net_key): back to the client, from this host's address and
 * node port, out of the egress device. */
static __noinline int cb_nodeport_back(struct __sk_buff *skb, __u32 net_key, __u32 zone)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_snat_dst d = {};
	struct cb_ep_key skey = {};
	struct cb_endpoint *src;
	struct cb_config *cfg = cb_get_config();
	int r;

	if (!cfg || !cfg->egress_ifindex)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	r = cb_parse_eth(skb, &p);
	if (!r)
		r = cb_parse_ipv4(skb, &p);
	if (!r)
		r = cb_parse_l4(skb, &p, &f);
	if (r)
		return cb_drop(skb, r);
	/* A SYN without ACK opens a flow of its own (to this host: none), never a node port
	 * flow's reply, as a local backend's is none (cb_lb_reply). */
	if (p.frag != CB_FRAG_NONE || p.inner.proto || cb_tcp_opens(&f))
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	skey.net = net_key;
	skey.ip = f.saddr;
	src = bpf_map_lookup_elem(&cb_endpoints, &skey);
	d.zone = zone;
	d.kind = CB_CT_KIND_NODEPORT;
	r = cb_snat_reply(skb, &p, &f, &d, 1);
	if (r < 0)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	if (r)
		return cb_drop(skb, r);
	t.zone = d.zone;
	t.kind = CB_FLOW_NODEPORT;
	t.src_epg = src ? src->epg : 0;
	t.svc_reply = 1;
	r = cb_stateful(&f, &t);
	if (!r)
		r = cb_nat(skb, &p, &f, 0, cfg->snat_ip, d.nodeport);
	if (!r)
		r = cb_route_rewrite(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	cb_count(skb, CB_FWD_NODEPORT_REPLY);
	return bpf_redirect_neigh(cfg->egress_ifindex, 0, 0, 0);
}

/* The stages of a packet from another host (reached from the entry programs' own frames:
 * a tail call from a called function would limit every frame above it to 256 bytes). */
SEC("tc")
int cb_stage_remote_judge(struct __sk_buff *skb)
{
	return cb_remote_judge(skb, cb_handoff_get());
}

SEC("tc")
int cb_stage_peer_host(struct __sk_buff *skb)
{
	struct cb_handoff *s = cb_handoff_get();

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	return cb_peer_host_rx(skb, s->net_key, s->zone, s->vtep);
}

SEC("tc")
int cb_stage_nodeport_back(struct __sk_buff *skb)
{
	struct cb_handoff *s = cb_handoff_get();

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	return cb_nodeport_back(skb, s->net_key, s->zone);
}

/* cb_remote_staged hands a packet cb_remote_rx took as far as code to its stage. */
CB_INLINE int cb_remote_staged(struct __sk_buff *skb, int code)
{
	switch (code) {
	case CB_JUDGE:
		return cb_stage(skb, CB_CALL_REMOTE_JUDGE);
	case CB_PEER_HOST:
		return cb_stage(skb, CB_CALL_PEER_HOST);
	case CB_NODEPORT_BACK:
		return cb_stage(skb, CB_CALL_NODEPORT_BACK);
	default:
		return code;
	}
}

/* cb_overlay_rx handles a decapsulated frame from peer VTEP remote (network order) in VNI
 * vni. */
CB_INLINE int cb_overlay_rx(struct __sk_buff *skb, __be32 remote, __u32 vni)
{
	struct cb_network *net;
	__u32 zone;

	cb_clock_start();
	if (!remote || !bpf_map_lookup_elem(&cb_peers, &remote))
		return cb_drop(skb, CB_DROP_UNKNOWN_PEER);
	if (vni == 0 || vni >= CB_NET_VLAN_BIT)
		return cb_drop(skb, CB_DROP_UNKNOWN_NETWORK);
	net = bpf_map_lookup_elem(&cb_networks, &vni);
	if (!net || net->encap != CB_ENCAP_VXLAN)
		return cb_drop(skb, CB_DROP_UNKNOWN_NETWORK);
	zone = net->vrf;
	return cb_remote_staged(skb, cb_remote_rx(skb, vni, zone, remote));
}

SEC("tc")
int cb_from_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key tk = {};

	if (bpf_skb_get_tunnel_key(skb, &tk, sizeof(tk), 0) < 0)
		return cb_drop(skb, CB_DROP_NO_TUNNEL_KEY);
	return cb_overlay_rx(skb, bpf_htonl(tk.remote_ipv4), tk.tunnel_id);
}

/* cb_native_rx routes an untagged packet from the uplink to a local endpoint of a natively
 * routed network (routing mode, VLAN encapsulation, BGP on): the endpoint is found by the
 * host route its address owns (one owner per address), the packet is routed (TTL, router
 * MAC) and then judged and delivered like a frame from that network's wire. Anything else
 * (the host's own traffic, BGP itself, ARP, VXLAN) goes on to later programs. */
static __noinline int cb_native_rx(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct cb_host_route *hr;
	struct cb_iface *ifc;
	struct cb_network *net;
	__u32 ifindex, nk;
	__be32 daddr;
	int r;

	/* Only frames addressed to this host: flooded or promiscuously seen ones are not
	 * routed (the stack discards them). */
	if (skb->pkt_type != 0 /* PACKET_HOST */)
		return CB_TCX_NEXT;
	cb_pull(skb, ETH_HLEN + sizeof(struct iphdr));
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return CB_TCX_NEXT;
	daddr = ip->daddr;
	hr = bpf_map_lookup_elem(&cb_host_routes, &daddr);
	if (!hr)
		return CB_TCX_NEXT;
	/* An endpoint address from here on: natively routed in, or never (the stack would
	 * forward it around policy when ip_forward is on). */
	ifindex = hr->ifindex;
	ifc = cb_iface_of(ifindex);
	if (!ifc)
		return cb_drop(skb, CB_DROP_UPLINK_TO_ENDPOINT);
	nk = ifc->net;
	net = bpf_map_lookup_elem(&cb_networks, &nk);
	if (!net || net->encap != CB_ENCAP_VLAN)
		return cb_drop(skb, CB_DROP_UPLINK_TO_ENDPOINT); /* an overlay network's endpoint */
	r = cb_route_rewrite(skb, cb_get_config());
	if (r)
		return cb_drop(skb, r);
	return cb_remote_rx(skb, nk, net->vrf, 0);
}

/* cb_from_wire takes tagged frames of known VLAN networks off the uplink (and, with BGP,
 * natively routed packets to local endpoints); everything else (underlay IP, VXLAN, other
 * VLANs) continues to later programs and the host stack. */
SEC("tc")
int cb_from_wire(struct __sk_buff *skb)
{
	struct cb_network *net;
	__u32 key;
	int vid;

	vid = cb_vlan_id(skb);
	if (vid < 0 && (cb_features & CB_FEAT_BGP)) {
		cb_clock_start();
		return cb_remote_staged(skb, cb_native_rx(skb));
	}
	if (vid <= 0)
		return CB_TCX_NEXT;
	key = CB_NET_VLAN_BIT | (__u32)vid;
	net = bpf_map_lookup_elem(&cb_networks, &key);
	if (!net || net->encap != CB_ENCAP_VLAN)
		return CB_TCX_NEXT;
	if (bpf_skb_vlan_pop(skb) < 0)
		return cb_drop(skb, CB_DROP_VLAN_ERR);
	cb_clock_start();
	return cb_remote_staged(skb, cb_remote_rx(skb, key, net->vrf, 0));
}

/* cb_uplink_deliver delivers a packet from outside, already translated to local endpoint
 * f->daddr of network net (an egress flow's reply, or an ICMP error about a node port
 * flow's reply: t->nodeport set), judged in zone t->zone by the endpoint's in-rules (an
 * ICMP error, t->inner set by the caller: as related to the flow it quotes, or as any
 * packet). */
static __noinline int cb_uplink_deliver(struct __sk_buff *skb, const struct cb_flow *f, struct cb_track *t, __u32 net)
{
	struct cb_ep_key dkey = {};
	struct cb_endpoint *ep;
	struct cb_config *cfg = cb_get_config();
	int r;

	if (!f || !t || !cfg)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	dkey.net = net;
	dkey.ip = f->daddr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
	if (!ep || !(ep->flags & CB_EP_LOCAL))
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	t->dst_epg = ep->epg;
	t->owner = cb_ct_owner_in(ep->slot);
	r = cb_stateful(f, t);
	if (!r)
		r = cb_route_rewrite(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	return cb_deliver_as(skb, ep, t->nodeport ? CB_FWD_NODEPORT : CB_FWD_EGRESS_REPLY);
}

/* cb_uplink_hand hands a packet from outside that cb_uplink_deliver takes (p, f, t; to
 * network net) over to its stage: CB_DELIVER, or a drop. */
#define CB_DELIVER (-9)

static __noinline int cb_uplink_hand(struct __sk_buff *skb, const struct cb_pkt *p, const struct cb_flow *f,
				     const struct cb_track *t, __u32 net)
{
	struct cb_ep_key dkey = {.net = net};

	if (!cb_hand(p, f, t, 0, &dkey))
		return cb_drop(skb, CB_DROP_NO_STAGE);
	return CB_DELIVER;
}

/* cb_uplink_delivered is the stage of what cb_uplink_hand handed over (s): ICMP errors
 * quote the scratch's copy of their packet. */
static __noinline int cb_uplink_delivered(struct __sk_buff *skb, struct cb_handoff *s)
{
	struct cb_track t;

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	cb_taken(s, &t, 0);
	return cb_uplink_deliver(skb, &s->f, &t, s->dkey.net);
}

/* cb_uplink_snat takes the replies of egress flows (and drops the wire's packets for
 * endpoint addresses); CB_TCX_NEXT for everything else. */
static __noinline int cb_uplink_snat(struct __sk_buff *skb)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_snat_dst d = {};
	struct cb_config *cfg;
	__be32 daddr;
	int r;

	cfg = cb_get_config();
	if (!cfg || cb_parse_eth(skb, &p) || p.eth->h_proto != bpf_htons(ETH_P_IP))
		return CB_TCX_NEXT;
	if (cb_parse_ipv4(skb, &p))
		return CB_TCX_NEXT;
	daddr = p.ip->daddr;
	if (daddr != cfg->snat_ip) {
		/* Endpoint addresses are reached through the overlay or NAT, never by the host
		 * forwarding what the wire sends it. */
		if (bpf_map_lookup_elem(&cb_host_routes, &daddr))
			return cb_drop(skb, CB_DROP_UPLINK_TO_ENDPOINT);
		return CB_TCX_NEXT;
	}
	if (p.frag != CB_FRAG_NONE || cb_parse_l4(skb, &p, &f))
		return CB_TCX_NEXT;
	r = cb_snat_reply(skb, &p, &f, &d, 0);
	if (r < 0)
		return CB_TCX_NEXT;
	if (r)
		return cb_drop(skb, r);
	t.zone = d.zone;
	return cb_uplink_hand(skb, &p, &f, &t, d.net);
}

/* cb_nodeport_frag_in delivers a later fragment of a datagram a client sent to a node port
 * to the local backend its first fragment went to (cb_np_frag_key); without a record it is
 * the host's (a datagram to the host itself). */
static __noinline int cb_nodeport_frag_in(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f)
{
	struct cb_frag_key k = {};
	struct cb_ep_key ek = {};
	struct cb_endpoint *ep;
	struct cb_natfrag *n;
	struct cb_config *cfg = cb_get_config();
	int r;

	if (!p || !f || !cfg)
		return CB_TCX_NEXT;
	cb_np_frag_key(&k, CB_NATFRAG_NODEPORT_IN, CB_CT_KIND_TENANT, f->saddr, f->daddr, p, f->proto);
	n = cb_np_frag_find(&k, CB_NATFRAG_DST);
	if (!n)
		return CB_TCX_NEXT;
	ek.net = n->net;
	ek.ip = n->addr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &ek);
	if (!ep || !(ep->flags & CB_EP_LOCAL))
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	r = cb_nat(skb, p, f, 1, ek.ip, 0);
	if (!r)
		r = cb_route_rewrite(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	return cb_deliver_as(skb, ep, CB_FWD_NODEPORT);
}

/* cb_uplink_nodeport balances a packet from outside to one of the host's node ports
 * (nodeport.h) to a backend on this host; CB_TCX_NEXT for anything else. */
static __noinline int cb_uplink_nodeport(struct __sk_buff *skb)
{
	struct cb_pkt p = {};
	struct cb_flow f = {};
	struct cb_track t = {};
	struct cb_lb_choice lc = {};
	struct cb_ep_key dkey = {};
	__be32 client;
	struct cb_endpoint *ep;
	struct cb_handoff *s;
	struct cb_config *cfg;
	struct cb_np *np;
	int r;

	cfg = cb_get_config();
	if (!cfg || cb_parse_eth(skb, &p) || p.eth->h_proto != bpf_htons(ETH_P_IP))
		return CB_TCX_NEXT;
	if (cb_parse_ipv4(skb, &p) || p.ip->daddr != cfg->snat_ip)
		return CB_TCX_NEXT;
	if (cb_parse_l4(skb, &p, &f))
		return CB_TCX_NEXT;
	if (p.frag == CB_FRAG_LATER)
		return cb_nodeport_frag_in(skb, &p, &f);
	if (p.inner.proto && p.frag == CB_FRAG_NONE) {
		/* An ICMP error about a node port flow's reply (a router's "fragmentation
		 * needed", the client's port unreachable): to its local backend. */
		r = cb_nodeport_icmp_in(skb, &p, &f, &t, &lc);
		if (r < 0)
			return CB_TCX_NEXT;
		if (r)
			return cb_drop(skb, r);
		t.nodeport = p.inner.sport;
		return cb_uplink_hand(skb, &p, &f, &t, lc.net);
	}
	np = cb_nodeport_lookup(&f);
	if (!np)
		return CB_TCX_NEXT;
	/* The tenant's addresses live behind its veths and tunnels, never on the wire: a
	 * client claiming one would match rules written for internal clients and have the
	 * backend's answer reflected to the real endpoint. */
	if (cb_tenant_src(np->zone, f.saddr))
		return cb_drop(skb, CB_DROP_NODEPORT_INTERNAL_SRC);
	client = f.saddr;
	t.zone = np->zone;
	t.kind = CB_FLOW_NODEPORT;
	t.nodeport = f.dport;
	t.frag = p.frag;
	t.ip_id = p.ip_id;
	/* To the service's VIP:port first, then balanced like any client's flow. */
	r = cb_nat(skb, &p, &f, 1, np->vip, np->svc_port);
	if (!r)
		r = cb_lb_forward(skb, &p, &f, &t, &lc);
	if (!r && !t.svc)
		r = CB_DROP_NO_BACKEND;
	if (r == CB_DROP_NO_BACKEND) {
		/* Refused as the client sent it: to the host's address and node port. */
		if (cb_nat(skb, &p, &f, 1, cfg->snat_ip, t.nodeport))
			return cb_drop(skb, CB_DROP_NO_BACKEND);
		return cb_reject_no_backend(skb, &p, &f, 1);
	}
	if (r)
		return cb_drop(skb, r);
	dkey.net = lc.net;
	dkey.ip = f.daddr;
	ep = bpf_map_lookup_elem(&cb_endpoints, &dkey);
	if (!ep)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	t.dst_epg = ep->epg;
	/* Opened to a local backend; to one on another host: the host's total alone. */
	t.owner = cb_ct_owner_in(ep->flags & CB_EP_LOCAL ? ep->slot : 0);
	s = cb_hand(&p, &f, &t, &lc, &dkey);
	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	s->ep = *ep;
	s->client = client;
	return CB_JUDGE;
}

/* cb_np_frag_in_note records where the later fragments of the node port datagram whose
 * first fragment s holds go: to the local backend it went to (cb_nodeport_frag_in). */
static __noinline void cb_np_frag_in_note(const struct cb_handoff *s, __be32 snat_ip)
{
	struct cb_frag_key fk = {};

	if (!s)
		return;
	cb_np_frag_key(&fk, CB_NATFRAG_NODEPORT_IN, CB_CT_KIND_TENANT, s->client, snat_ip, &s->p, s->f.proto);
	cb_natfrag_record(&fk, CB_NATFRAG_DST, s->f.daddr, s->dkey.net);
}

/* cb_nodeport_judge takes a node port flow's packet cb_uplink_nodeport balanced (its state
 * in s) on: policy and conntrack, the choice committed, to the local backend or through
 * the overlay to a remote one. */
static __noinline int cb_nodeport_judge(struct __sk_buff *skb, struct cb_handoff *s)
{
	struct cb_pkt *p;
	struct cb_flow *f;
	struct cb_track t;
	struct cb_lb_choice lc;
	struct cb_endpoint *ep;
	struct cb_network *net = 0;
	struct cb_config *cfg = cb_get_config();
	struct ethhdr *eth;
	int r;

	if (!s)
		return cb_drop(skb, CB_DROP_NO_STAGE);
	if (!cfg)
		return cb_drop(skb, CB_DROP_UNKNOWN_DST);
	p = &s->p; /* (read and rewritten in place: the frame is short) */
	f = &s->f;
	cb_taken(s, &t, &lc);
	t.inner = 0; /* (the node port stage judges no ICMP error as related) */
	ep = &s->ep; /* the backend as it was judged */
	if (!(ep->flags & CB_EP_LOCAL)) {
		/* A backend on another host: through the overlay, from this host's address. Not
		 * for a fragmented datagram (its later fragments would need both addresses and
		 * the NAT port): only local backends take those. */
		net = bpf_map_lookup_elem(&cb_networks, &s->dkey.net);
		if (!net || net->encap != CB_ENCAP_VXLAN || p->frag != CB_FRAG_NONE)
			return cb_drop(skb, CB_DROP_NODEPORT_NO_LOCAL);
	}
	if (s->svc_ct)
		lc.svc_ct = cb_svc_ct_again(f, &t);
	r = cb_np_blind_check(skb, p, f, &t); /* a blind FIN or RST closes nothing */
	if (!r)
		r = cb_stateful(f, &t);
	if (!r)
		r = cb_lb_commit(&lc, p, f, &t);
	if (!r && net)
		r = cb_snat_egress(skb, p, f, &t, s->dkey.net);
	if (!r)
		r = cb_route_rewrite(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	if (!net) {
		if (p->frag == CB_FRAG_FIRST)
			cb_np_frag_in_note(s, cfg->snat_ip);
		return cb_deliver_as(skb, ep, CB_FWD_NODEPORT);
	}
	cb_barrier_var(skb); /* (else the compiler reads the context through a moved pointer) */
	eth = (void *)(long)skb->data;
	if ((void *)(eth + 1) > (void *)(long)skb->data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ETH);
	cb_mac_copy(eth->h_dest, ep->mac);
	return cb_encap_vxlan(skb, net, ep);
}

/* cb_overlay_in says whether a frame on the egress device is a tunnel packet to this
 * host: IPv4 without options, UDP to the overlay's port, at the VTEP or the NAT address,
 * not a later fragment. It is the vxlan device's (cb_from_overlay judges it there): never
 * an egress flow's reply (the agent refuses egress ports that hold the overlay's) and
 * never a node port flow (it refuses an overlay port in the node port range). Headers not
 * in the linear part take the full way; so does everything else. */
CB_INLINE int cb_overlay_in(struct __sk_buff *skb, const struct cb_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	struct cb_l4_ports *udp = data + ETH_HLEN + sizeof(*ip);

	if ((void *)(udp + 1) > data_end || !cfg->vxlan_port)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl != 5 ||
	    ip->protocol != CB_PROTO_UDP || (ip->frag_off & bpf_htons(0x1fff)))
		return 0;
	if (ip->daddr != cfg->vtep && ip->daddr != cfg->snat_ip)
		return 0;
	return udp->dport == cfg->vxlan_port;
}

/* cb_clear_overlay says whether a frame from the underlay is UDP to the overlay's port,
 * whatever its destination address (the vxlan device's socket listens on every address of
 * the host, broadcast included), IP options, VLAN tag or IP version (a collect_md device
 * opens an IPv6 socket too): with encryption on (CB_FEAT_ENCRYPT) such packets reach the
 * host only out of the WireGuard device, never from the wire. A later fragment carries no
 * port: it is left alone (its first fragment, which always holds the whole UDP header, is
 * dropped, so the datagram never reassembles). Read with bpf_skb_load_bytes: headers
 * outside the linear part are found too. */
static __noinline int cb_clear_overlay(struct __sk_buff *skb, __be16 port)
{
	__u8 vh, nh;
	__u16 frag;
	__be16 dport;
	__u32 l4;

	if (!port)
		return 0;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &vh, 1) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 9, &nh, 1) < 0 ||
		    bpf_skb_load_bytes(skb, ETH_HLEN + 6, &frag, 2) < 0)
			return 0;
		if ((vh >> 4) != 4 || nh != CB_PROTO_UDP || (frag & bpf_htons(0x1fff)))
			return 0;
		l4 = ETH_HLEN + (__u32)(vh & 0xf) * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		/* Only UDP right after the fixed header: the kernel's vxlan socket takes an
		 * extension header chain too, so any other next header of an IPv6 packet to the
		 * overlay's port would pass; IPv6 underlays are not supported (VTEPs are IPv4). */
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 6, &nh, 1) < 0 || nh != CB_PROTO_UDP)
			return 0;
		l4 = ETH_HLEN + 40;
	} else {
		return 0;
	}
	if (bpf_skb_load_bytes(skb, l4 + 2, &dport, 2) < 0)
		return 0;
	return dport == port;
}

/* cb_uplink_denied says whether an IPv4 frame from the underlay comes from a denied source
 * (prefilter.h); read with bpf_skb_load_bytes: a header outside the linear part is found
 * too. */
static __noinline int cb_uplink_denied(struct __sk_buff *skb)
{
	__be32 saddr;

	if (!skb || bpf_skb_load_bytes(skb, ETH_HLEN + 12, &saddr, 4) < 0)
		return 0;
	return cb_denied(saddr);
}

/* cb_underlay_drop is what the wire may not bring in, wherever it arrives (the egress
 * device and the VTEP's): a packet from a denied source (prefilter.h), and with
 * encryption on a clear overlay packet (cb_clear_overlay). A drop reason, or 0. */
CB_INLINE int cb_underlay_drop(struct __sk_buff *skb, const struct cb_config *cfg)
{
	if ((cb_features & CB_FEAT_DENY) && skb->protocol == bpf_htons(ETH_P_IP) && !skb->vlan_present &&
	    cb_uplink_denied(skb))
		return CB_DROP_DENIED_SOURCE;
	if ((cb_features & CB_FEAT_ENCRYPT) && cb_clear_overlay(skb, cfg->vxlan_port))
		return CB_DROP_CLEAR_OVERLAY;
	return 0;
}

/* cb_from_underlay sits on the device holding the VTEP when that is not the egress device
 * (whose cb_from_uplink makes the same checks first): the wire's packets cb_underlay_drop
 * refuses are dropped; everything else continues, untouched. */
SEC("tc")
int cb_from_underlay(struct __sk_buff *skb)
{
	struct cb_config *cfg = cb_get_config();
	int r;

	if (!cfg)
		return CB_TCX_NEXT;
	r = cb_underlay_drop(skb, cfg);
	return r ? cb_drop(skb, r) : CB_TCX_NEXT;
}

/* cb_from_uplink takes the replies of egress flows and the packets to node ports off the
 * egress device (delivered to their endpoints), after cb_underlay_drop's checks;
 * everything else is the host's and continues. */
SEC("tc")
int cb_from_uplink(struct __sk_buff *skb)
{
	struct cb_config *cfg = cb_get_config();
	int r;

	if (!cfg)
		return CB_TCX_NEXT;
	r = cb_underlay_drop(skb, cfg);
	if (r)
		return cb_drop(skb, r);
	if (!cfg->snat_ip)
		return CB_TCX_NEXT;
	/* Tagged frames belong to VLAN networks (cb_from_wire), also on a shared uplink. */
	if (skb->vlan_present)
		return CB_TCX_NEXT;
	/* The overlay's packets (most of what arrives here) skip the egress and node port
	 * lookups. */
	if (cb_overlay_in(skb, cfg))
		return CB_TCX_NEXT;
	cb_clock_start();
	r = cb_uplink_snat(skb);
	if (r == CB_TCX_NEXT && (cb_features & CB_FEAT_NODEPORT))
		r = cb_uplink_nodeport(skb);
	if (r == CB_DELIVER)
		return cb_stage(skb, CB_CALL_UPLINK_DELIVER);
	if (r == CB_JUDGE)
		return cb_stage(skb, CB_CALL_NODEPORT_JUDGE);
	return r;
}

/* cb_xdp_uplink is the uplink's XDP prefilter (netplugin --xdp, on the device holding the
 * VTEP): before the kernel builds an skb it drops what the tc path would drop anyway,
 * counted under the same reasons (xdp.h). A source on the operator's deny list
 * (prefilter.h); with encryption on, every clear overlay packet
 * (cb_clear_overlay's test); otherwise an overlay packet from a host that is not a peer,
 * to an unknown VNI, or with an inner source that does not live behind its VTEP. It only
 * drops or passes: everything else, and everything it is unsure of, goes on to the stack
 * and cb_from_uplink / cb_from_overlay, which judge it as without it. */
SEC("xdp")
int cb_xdp_uplink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct cb_config *cfg = cb_get_config();
	int r;

	if (!cfg)
		return XDP_PASS;
	if (cb_xdp_denied(data, data_end))
		return cb_xdp_drop(ctx, CB_DROP_DENIED_SOURCE, 0, (__u32)(data_end - data));
	if (cb_features & CB_FEAT_ENCRYPT) {
		if (cb_xdp_clear_overlay(data, data_end, cfg->vxlan_port))
			return cb_xdp_drop(ctx, CB_DROP_CLEAR_OVERLAY, 0, (__u32)(data_end - data));
		return XDP_PASS;
	}
	r = cb_xdp_overlay(ctx, cfg);
	return r < 0 ? XDP_PASS : r;
}

/* The stages of a packet from outside (CB_CALL_UPLINK_DELIVER, CB_CALL_NODEPORT_JUDGE). */
SEC("tc")
int cb_stage_uplink_deliver(struct __sk_buff *skb)
{
	return cb_uplink_delivered(skb, cb_handoff_get());
}

SEC("tc")
int cb_stage_nodeport_judge(struct __sk_buff *skb)
{
	return cb_nodeport_judge(skb, cb_handoff_get());
}

/* cb_sock_connect4 (cgroup/connect4, attached at the cgroup root and acting only for
 * sockets of the host namespace): connections of the host's own processes to a service
 * VIP:port or to a node port of one of the host's addresses go to a backend on this host
 * (docs/host-routing.md). Without one the connect fails (EPERM), never silently elsewhere. */
SEC("cgroup/connect4")
int cb_sock_connect4(struct bpf_sock_addr *ctx)
{
	struct cb_config *cfg = cb_get_config();
	struct cb_host_svc_key hk = {};
	struct cb_svc_key sk = {};
	struct cb_backend_key bk = {};
	struct cb_ep_key ek = {};
	struct cb_np_key nk = {};
	struct cb_host_svc *hs;
	struct cb_backend *be;
	struct cb_endpoint *ep;
	struct cb_svc *svc;
	struct cb_np *np;
	__be32 dst = ctx->user_ip4;
	__u32 i, start, proto = ctx->protocol;

	if (!cfg || !cfg->netns_cookie || bpf_get_netns_cookie(ctx) != cfg->netns_cookie)
		return 1;
	if (proto != CB_PROTO_TCP && proto != CB_PROTO_UDP)
		return 1;
	if (bpf_map_lookup_elem(&cb_host_ips, &dst)) {
		nk.port = (__be16)ctx->user_port;
		nk.proto = proto;
		np = bpf_map_lookup_elem(&cb_nodeports, &nk);
		if (!np)
			return 1;
		sk.zone = np->zone;
		sk.vip = np->vip;
		sk.port = np->svc_port;
	} else {
		hk.vip = dst;
		hk.port = (__be16)ctx->user_port;
		hk.proto = proto;
		hs = bpf_map_lookup_elem(&cb_host_svcs, &hk);
		if (!hs)
			return 1;
		sk.zone = hs->zone;
		sk.vip = dst;
		sk.port = hk.port;
	}
	sk.proto = proto;
	svc = bpf_map_lookup_elem(&cb_services, &sk);
	if (!svc || !svc->count)
		return 0;
	/* The host is one client: with session affinity always the same (local) backend. */
	start = (svc->flags & CB_SVC_AFFINITY) ? 0 : bpf_get_prandom_u32();
	for (i = 0; i < CB_SOCK_LB_TRIES; i++) {
		if (i >= svc->count)
			break;
		bk.svc_id = svc->id;
		bk.index = (start + i) % svc->count;
		be = bpf_map_lookup_elem(&cb_backends, &bk);
		if (!be)
			continue;
		ek.net = be->net;
		ek.ip = be->ip;
		ep = bpf_map_lookup_elem(&cb_endpoints, &ek);
		if (!ep || !(ep->flags & CB_EP_LOCAL))
			continue;
		ctx->user_ip4 = be->ip;
		ctx->user_port = svc->target_port;
		return 1;
	}
	return 0;
}

/* cb_test_overlay is never attached: BPF_PROG_TEST_RUN runs it for `netctl trace` (trace.go)
 * and the tests, with the tunnel's remote VTEP in skb->cb[0] and its VNI in skb->cb[1]. */
SEC("tc")
int cb_test_overlay(struct __sk_buff *skb)
{
	return cb_overlay_rx(skb, skb->cb[0], skb->cb[1]);
}

/* cb_clock_probe is never attached: the agent runs it (clock.go) to calibrate cb_now. It
 * writes jiffies and CLOCK_MONOTONIC_COARSE, read in one run, over the first 16 bytes of
 * the packet (little-endian, as the host stores them). */
SEC("tc")
int cb_clock_probe(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u64 *out = data;

	if ((void *)(out + 2) > data_end)
		return TC_ACT_SHOT;
	out[0] = bpf_jiffies64();
	out[1] = bpf_ktime_get_coarse_ns();
	return TC_ACT_OK;
}
