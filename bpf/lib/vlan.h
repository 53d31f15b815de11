/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* vlan.h: VLAN networks over one uplink: push the network's tag and redirect to the
 * uplink; on uplink ingress, read the tag (offloaded metadata or in-packet header). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"

#define CB_ETH_P_8021Q 0x8100
#define CB_ETH_P_8021AD 0x88a8

struct cb_vlan_hdr {
	__be16 tci;
	__be16 proto;
};

/* cb_encap_vlan sends the (already MAC-rewritten) frame out of the uplink, tagged. */
CB_INLINE int cb_encap_vlan(struct __sk_buff *skb, const struct cb_network *net)
{
	struct cb_config *cfg = cb_get_config();

	if (!cfg || !cfg->uplink_ifindex)
		return cb_drop(skb, CB_DROP_NO_UPLINK);
	if (bpf_skb_vlan_push(skb, bpf_htons(CB_ETH_P_8021Q), net->tag & 0x0fff) < 0)
		return cb_drop(skb, CB_DROP_VLAN_ERR);
	cb_count(skb, CB_FWD_UPLINK);
	return bpf_redirect(cfg->uplink_ifindex, 0);
}

/* cb_vlan_id returns the VLAN id of a tagged frame (offloaded metadata or in-packet
 * 802.1Q header), or -1 when the frame is untagged. */
CB_INLINE int cb_vlan_id(struct __sk_buff *skb)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct cb_vlan_hdr *vh;

	if (skb->vlan_present)
		return skb->vlan_tci & 0x0fff;
	cb_pull(skb, ETH_HLEN + sizeof(*vh));
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	vh = data + ETH_HLEN;
	if ((void *)(vh + 1) > data_end || eth->h_proto != bpf_htons(CB_ETH_P_8021Q))
		return -1;
	return bpf_ntohs(vh->tci) & 0x0fff;
}
