/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* arp.h: the ARP responder. Requests for a known endpoint IP of the same network or for
 * the network's gateway are turned into replies in place and sent back out the
 * interface they came in on; nothing else is answered and no ARP ever leaves the host. */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "lb.h"

#define CB_ARPHRD_ETHER 1
#define CB_ARPOP_REQUEST 1
#define CB_ARPOP_REPLY 2

struct cb_arp {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[6];
	__be32 sip;
	__u8 tha[6];
	__be32 tip;
} __attribute__((packed));

/* cb_arp_respond answers an ARP request received on a local endpoint's veth. */
static __noinline int cb_arp_respond(struct __sk_buff *skb, const struct cb_iface *ifc)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct cb_arp *arp;
	struct cb_network *net;
	struct cb_config *cfg;
	struct cb_endpoint *ep;
	struct cb_ep_key key = {};
	const __u8 *mac;
	__u8 vip_mac[6];
	__u32 routing, rnet = 0;
	__be32 sip, tip;

	if (!ifc)
		return cb_drop(skb, CB_DROP_UNKNOWN_IFACE);
	cb_pull(skb, ETH_HLEN + sizeof(struct cb_arp));
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	arp = data + ETH_HLEN;
	if ((void *)(arp + 1) > data_end)
		return cb_drop(skb, CB_DROP_MALFORMED_ARP);
	if (arp->htype != bpf_htons(CB_ARPHRD_ETHER) || arp->ptype != bpf_htons(ETH_P_IP) ||
	    arp->hlen != 6 || arp->plen != 4)
		return cb_drop(skb, CB_DROP_MALFORMED_ARP);
	if (arp->op != bpf_htons(CB_ARPOP_REQUEST))
		return cb_drop(skb, CB_DROP_ARP_NOT_REQUEST);

	sip = arp->sip;
	tip = arp->tip;
	/* Never answer a probe for the asker's own address (DAD, gratuitous ARP):
	 * a reply would look like an address conflict. */
	if (tip == ifc->ip || tip == sip)
		return cb_drop(skb, CB_DROP_ARP_SELF);
	/* Only the endpoint's own address and MAC may ask. */
	if (sip != ifc->ip || !cb_mac_eq(arp->sha, ifc->mac))
		return cb_drop(skb, CB_DROP_SPOOFED_SRC);

	net = bpf_map_lookup_elem(&cb_networks, &ifc->net);
	if (!net)
		return cb_drop(skb, CB_DROP_UNKNOWN_NETWORK);
	cfg = cb_get_config();
	if (!cfg)
		return cb_drop(skb, CB_DROP_ARP_UNKNOWN_TARGET);
	routing = cfg->features & CB_FEAT_ROUTING;
	key.net = ifc->net;
	key.ip = tip;
	if (net->gateway && tip == net->gateway) {
		mac = cfg->gw_mac;
	} else if ((ep = bpf_map_lookup_elem(&cb_endpoints, &key))) {
		/* Routing mode answers every known address with the router MAC. */
		mac = routing ? cfg->gw_mac : ep->mac;
	} else if (routing && cb_route_lookup(ifc->net, tip, &rnet)) {
		mac = cfg->gw_mac;
	} else if (cb_is_vip(net->vrf, tip)) {
		/* Service VIPs of the asker's tenant answer with Contiv's 02:02:<vip> */
		vip_mac[0] = 0x02;
		vip_mac[1] = 0x02;
		__builtin_memcpy(&vip_mac[2], &tip, 4);
		mac = vip_mac;
	} else {
		return cb_drop(skb, CB_DROP_ARP_UNKNOWN_TARGET);
	}

	/* Request → reply, in place. */
	cb_mac_copy(eth->h_dest, arp->sha);
	cb_mac_copy(eth->h_source, mac);
	arp->op = bpf_htons(CB_ARPOP_REPLY);
	cb_mac_copy(arp->tha, arp->sha);
	arp->tip = sip;
	cb_mac_copy(arp->sha, mac);
	arp->sip = tip;

	cb_count(skb, CB_ARP_REPLY);
	return bpf_redirect(skb->ifindex, 0);
}
