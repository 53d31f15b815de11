/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* xdp.h owns the uplink's XDP prefilter (cb_xdp_uplink): what it drops before the kernel
 * builds an skb, always a packet the tc path would drop too, counted under the same
 * reason in cb_reasons and reported by the same drop event. It only drops or passes:
 * anything it is not sure of goes on to the stack and the tc programs, which judge it
 * as they would without it. */
#ifndef CB_XDP_H
#define CB_XDP_H

#include <linux/udp.h>
#include "common.h"
#include "drop.h"
#include "maps.h"
#include "prefilter.h"

/* cb_vxlanhdr is the VXLAN header (RFC 7348): flags (0x08: VNI valid), 3 reserved bytes,
 * the VNI, 1 reserved byte. */
struct cb_vxlanhdr {
	__u8 flags;
	__u8 rsvd1[3];
	__u8 vni[3];
	__u8 rsvd2;
};

/* The offset of a plain IPv4 VXLAN packet's inner Ethernet header. */
#define CB_XDP_INNER (ETH_HLEN + sizeof(struct iphdr) + 8 + sizeof(struct cb_vxlanhdr))

/* cb_xdp_emit_drop records drop r of frame ctx as cb_emit_drop records a tc drop: the
 * length (len), addresses and ports are those of the frame at off (the inner one of an
 * overlay packet: what the tc path would have reported after decap). */
static __noinline void cb_xdp_emit_drop(struct xdp_md *ctx, __u32 r, __u32 off, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct cb_event *e;
	__u16 *ports;

	e = bpf_ringbuf_reserve(&cb_events, sizeof(*e), 0);
	if (!e)
		return;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts = bpf_ktime_get_ns();
	e->reason = r;
	e->ifindex = ctx->ingress_ifindex;
	e->len = len;
	if (off > CB_XDP_INNER)
		off = 0;
	eth = data + off;
	if ((void *)(eth + 1) <= data_end) {
		e->ethertype = bpf_ntohs(eth->h_proto);
		ip = (void *)(eth + 1);
		if (eth->h_proto == bpf_htons(ETH_P_IP) && (void *)(ip + 1) <= data_end) {
			e->saddr = ip->saddr;
			e->daddr = ip->daddr;
			e->proto = ip->protocol;
			ports = (void *)ip + ip->ihl * 4; /* as cb_emit_drop: options skipped */
			if ((ip->protocol == 6 || ip->protocol == 17) &&
			    !(ip->frag_off & bpf_htons(0x1fff)) && (void *)(ports + 2) <= data_end) {
				e->sport = ports[0];
				e->dport = ports[1];
			}
		}
	}
	bpf_ringbuf_submit(e, 0);
}

/* cb_xdp_drop counts drop r of frame ctx (cb_reasons, as cb_count) and records it while
 * the agent listens: the frame the tc path would have counted, len bytes at off (an
 * overlay packet's inner frame as the vxlan device hands it on: the UDP payload past the
 * VXLAN header, without what the frame carries past its UDP datagram). */
CB_INLINE int cb_xdp_drop(struct xdp_md *ctx, enum cb_reason r, __u32 off, __u32 len)
{
	__u32 key = r;
	struct cb_counter *c = bpf_map_lookup_elem(&cb_reasons, &key);

	if (c) {
		c->packets++;
		c->bytes += len;
	}
	if (cb_features & CB_FEAT_EVENTS)
		cb_xdp_emit_drop(ctx, r, off, len);
	return XDP_DROP;
}

/* cb_xdp_denied is cb_uplink_denied on a frame before its skb: an untagged IPv4 frame from
 * a denied source. */
CB_INLINE int cb_xdp_denied(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;

	if (!(cb_features & CB_FEAT_DENY) || (void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	return cb_denied(ip->saddr);
}

/* cb_xdp_clear_overlay is cb_clear_overlay on a frame before its skb: UDP to the overlay's
 * port (not a later fragment), IPv4 with any header length or UDP right after a fixed
 * IPv6 header, untagged. A header the frame does not hold whole is not found (XDP sees
 * the whole frame in one buffer, so only a truncated frame lacks it, and the stack drops
 * that). */
CB_INLINE int cb_xdp_clear_overlay(void *data, void *data_end, __be16 port)
{
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	struct cb_l4_ports *l4;
	__u8 *ip6 = data + ETH_HLEN;
	__u32 hlen;

	if (!port || (void *)(eth + 1) > data_end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->protocol != CB_PROTO_UDP ||
		    (ip->frag_off & bpf_htons(0x1fff)))
			return 0;
		hlen = ip->ihl * 4;
		l4 = data + ETH_HLEN + hlen;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		if ((void *)(ip6 + 40) > data_end || ip6[6] != CB_PROTO_UDP)
			return 0;
		l4 = data + ETH_HLEN + 40;
	} else {
		return 0;
	}
	if ((void *)(l4 + 1) > data_end)
		return 0;
	return l4->dport == port;
}

/* cb_xdp_overlay judges a plain VXLAN packet to this host's VTEP (IPv4 without options,
 * not a fragment, UDP to the overlay's port, a VXLAN header with exactly the VNI flag)
 * as cb_from_overlay and cb_remote_rx would after the vxlan device's decap, as far as
 * they drop without state: a sender not a peer (drop_unknown_peer), a VNI no overlay
 * network has (drop_unknown_network), an inner IPv4 source that is an endpoint of this
 * host (drop_remote_src) or no endpoint behind the sending VTEP (drop_overlay_spoof;
 * the sending host's own address goes on, to the peer-host stage). Only an inner IPv4
 * header without options, not a fragment, whose length the frame holds, is judged
 * (cb_parse_ipv4 drops nothing of those); in routing mode an unknown inner source is
 * left to the tc path (it looks routes up). Anything else: -1, go on. */
CB_INLINE int cb_xdp_overlay(struct xdp_md *ctx, const struct cb_config *cfg)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	struct udphdr *udp = (void *)(ip + 1);
	struct cb_vxlanhdr *vx = (void *)(udp + 1);
	struct ethhdr *ieth = (void *)(vx + 1);
	struct iphdr *iip = (void *)(ieth + 1);
	struct cb_network *net;
	struct cb_endpoint *src;
	struct cb_ep_key skey = {};
	__u32 vni, tot, ulen, ilen;
	__be32 remote;

	if ((void *)(vx + 1) > data_end || !cfg->vxlan_port || !cfg->vtep)
		return -1;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || *(__u8 *)ip != 0x45 || ip->protocol != CB_PROTO_UDP ||
	    (ip->frag_off & bpf_htons(0x3fff)) || ip->daddr != cfg->vtep || udp->dest != cfg->vxlan_port)
		return -1;
	/* A datagram the frame and its IP header hold whole (else the stack drops it). No
	 * subtraction from tot: a total length below the header would wrap around. */
	tot = bpf_ntohs(ip->tot_len);
	ulen = bpf_ntohs(udp->len);
	if (ulen < 8 + sizeof(*vx) + ETH_HLEN || ulen + sizeof(struct iphdr) > tot ||
	    tot > (__u32)(data_end - data) - ETH_HLEN)
		return -1;
	if (vx->flags != 0x08 || vx->rsvd1[0] || vx->rsvd1[1] || vx->rsvd1[2] || vx->rsvd2)
		return -1;
	ilen = ulen - 8 - sizeof(*vx); /* the inner frame, as the tc path counts it */
	remote = ip->saddr;
	if (!remote || !bpf_map_lookup_elem(&cb_peers, &remote))
		return cb_xdp_drop(ctx, CB_DROP_UNKNOWN_PEER, CB_XDP_INNER, ilen);
	vni = ((__u32)vx->vni[0] << 16) | ((__u32)vx->vni[1] << 8) | vx->vni[2];
	if (vni == 0 || vni >= CB_NET_VLAN_BIT)
		return cb_xdp_drop(ctx, CB_DROP_UNKNOWN_NETWORK, CB_XDP_INNER, ilen);
	net = bpf_map_lookup_elem(&cb_networks, &vni);
	if (!net || net->encap != CB_ENCAP_VXLAN)
		return cb_xdp_drop(ctx, CB_DROP_UNKNOWN_NETWORK, CB_XDP_INNER, ilen);
	/* The inner frame, as the vxlan device would hand it on: the UDP payload past the
	 * VXLAN header. */
	if ((void *)(iip + 1) > data_end || ieth->h_proto != bpf_htons(ETH_P_IP) || *(__u8 *)iip != 0x45 ||
	    (iip->frag_off & bpf_htons(0x1fff)))
		return -1;
	ulen -= 8 + sizeof(*vx) + ETH_HLEN;
	if (bpf_ntohs(iip->tot_len) < sizeof(struct iphdr) || bpf_ntohs(iip->tot_len) > ulen)
		return -1;
	skey.net = vni;
	skey.ip = iip->saddr;
	src = bpf_map_lookup_elem(&cb_endpoints, &skey);
	if (src && (src->flags & CB_EP_LOCAL))
		return cb_xdp_drop(ctx, CB_DROP_REMOTE_SRC, CB_XDP_INNER, ilen);
	if (!src && ((cb_features & CB_FEAT_ROUTING) || iip->saddr == remote))
		return -1;
	if (!src || src->vtep != remote)
		return cb_xdp_drop(ctx, CB_DROP_OVERLAY_SPOOF, CB_XDP_INNER, ilen);
	return -1;
}

#endif /* CB_XDP_H */
