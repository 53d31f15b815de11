/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* encap.h: VXLAN through one collect_md device: set the tunnel key (VNI = network tag,
 * remote = the owning host's VTEP) and redirect to the device; on receive, read it back. */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"

#define CB_TUNNEL_TTL 64

/* cb_encap_vxlan sends the (already MAC-rewritten) frame to a remote VTEP. */
CB_INLINE int cb_encap_vxlan(struct __sk_buff *skb, const struct cb_network *net,
			     const struct cb_endpoint *ep)
{
	struct bpf_tunnel_key tk = {};
	struct cb_config *cfg = cb_get_config();

	if (!cfg || !cfg->vxlan_ifindex)
		return cb_drop(skb, CB_DROP_NO_VXLAN);
	if (!bpf_map_lookup_elem(&cb_peers, &ep->vtep))
		return cb_drop(skb, CB_DROP_UNKNOWN_PEER);
	tk.tunnel_id = net->tag;
	tk.remote_ipv4 = bpf_ntohl(ep->vtep);
	tk.local_ipv4 = bpf_ntohl(cfg->vtep);
	tk.tunnel_ttl = CB_TUNNEL_TTL;
	/* DF: containers get MTU underlay-50, so an encapsulated packet never needs fragmenting. */
	if (bpf_skb_set_tunnel_key(skb, &tk, sizeof(tk), BPF_F_DONT_FRAGMENT) < 0)
		return cb_drop(skb, CB_DROP_TUNNEL_ERR);
	cb_count(skb, CB_FWD_TUNNEL);
	return bpf_redirect(cfg->vxlan_ifindex, 0);
}
