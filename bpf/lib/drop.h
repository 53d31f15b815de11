/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* drop.h: the ONE verdict/drop reason enum (a stable ABI shared with Go, metrics and
 * netctl through bpf2go -type cb_reason) and the per-CPU per-reason counters.
 * Never renumber: append new reasons before CB_REASON_MAX. */
#pragma once

#include "common.h"
#include "maps.h"

enum cb_reason {
	CB_REASON_UNSPEC = 0,
	/* verdicts 1..31: the packet went somewhere */
	CB_FWD_LOCAL = 1,          /* redirected to a local endpoint (redirect_peer) */
	CB_FWD_TUNNEL = 2,         /* VXLAN-encapsulated towards a peer VTEP */
	CB_FWD_UPLINK = 3,         /* VLAN-tagged out of the uplink */
	CB_ARP_REPLY = 4,          /* ARP request answered in place */
	CB_POLICY_ALLOW = 5,       /* event only (never counted): a new flow allowed by a rule */
	CB_FWD_HOST = 6,           /* to an address of this host: handed to its stack */
	CB_FWD_EGRESS = 7,         /* source-NATed to the host address and sent out of the egress device */
	CB_FWD_EGRESS_REPLY = 8,   /* reply to an egress flow: un-NATed and delivered to its endpoint */
	CB_ICMP_GW_REPLY = 9,      /* ICMP echo to the gateway answered in place */
	CB_FWD_DNS = 10,           /* DNS query to the gateway: to the agent's responder on this host */
	CB_FWD_NODEPORT = 11,      /* from outside to a node port: balanced to a local backend */
	CB_FWD_NODEPORT_REPLY = 12, /* a backend's reply to a node port client: out of the egress device */
	CB_FWD_NATIVE = 13,        /* routed out of the uplink to a BGP-learned next hop (native.h) */
	CB_ICMP_VIP_REPLY = 14,    /* ICMP echo to a service VIP of the sender's tenant answered in place */
	/* drops 32..: the packet was discarded */
	CB_DROP_MIN = 32,
	CB_DROP_MALFORMED_ETH = 32, /* frame shorter than an Ethernet header */
	CB_DROP_UNKNOWN_IFACE = 33, /* ingress interface not in the iface map */
	CB_DROP_NOT_IPV4 = 34,      /* ethertype other than IPv4/ARP (IPv6, LLDP, ...) */
	CB_DROP_MALFORMED_ARP = 35, /* truncated ARP or not Ethernet/IPv4 ARP */
	CB_DROP_ARP_NOT_REQUEST = 36, /* ARP reply/other opcode from a container */
	CB_DROP_ARP_UNKNOWN_TARGET = 37, /* ARP request for an IP nobody owns */
	CB_DROP_ARP_SELF = 38,      /* gratuitous ARP / duplicate address probe */
	CB_DROP_MALFORMED_IP = 39,  /* truncated IPv4, version != 4, bad IHL or length, impossible fragment offset */
	CB_DROP_SPOOFED_SRC = 40,   /* IPv4 source, Ethernet source or ARP sender is not the endpoint's */
	CB_DROP_UNKNOWN_DST = 41,   /* destination not a known endpoint of the network */
	CB_DROP_UNKNOWN_NETWORK = 42, /* network / VNI not in the network map */
	CB_DROP_UNKNOWN_PEER = 43,  /* VTEP not a known peer (either direction) */
	CB_DROP_NO_TUNNEL_KEY = 44, /* from-overlay without tunnel metadata */
	CB_DROP_TUNNEL_ERR = 45,    /* bpf_skb_set_tunnel_key failed */
	CB_DROP_NO_VXLAN = 46,      /* remote destination but no vxlan device configured */
	CB_DROP_NO_UPLINK = 47,     /* remote VLAN destination but no uplink configured */
	CB_DROP_TO_GATEWAY = 48,    /* IPv4 to the gateway, or outside the subnet and not routable */
	CB_DROP_POLICY = 49,        /* denied by policy */
	CB_DROP_NO_BACKEND = 50,    /* service VIP:port without backends */
	CB_DROP_ARP_FROM_OVERLAY = 51, /* ARP must never cross the overlay or uplink */
	CB_DROP_REMOTE_SRC = 52,    /* overlay/uplink packet from an IP that is local here */
	CB_DROP_VLAN_ERR = 53,      /* bpf_skb_vlan_push/pop failed */
	CB_DROP_MALFORMED_L4 = 54,  /* TCP/UDP/ICMP header truncated where policy or LB needs it */
	CB_DROP_NAT_ERR = 55,       /* rewriting addresses/ports/checksums failed */
	CB_DROP_FRAG_TO_SERVICE = 56, /* non-first fragment to a VIP whose first fragment was not balanced */
	CB_DROP_TTL_EXCEEDED = 57,  /* routing mode: TTL would reach 0 */
	CB_DROP_FRAG_NO_FIRST = 58, /* policy: non-first fragment whose first fragment was not seen */
	CB_DROP_CT_FULL = 59,       /* conntrack table full: a new flow was refused */
	CB_DROP_OVERLAY_SPOOF = 60, /* overlay packet whose inner source is not an endpoint behind its VTEP */
	CB_DROP_VLAN_TAGGED = 61,   /* 802.1Q/802.1ad-tagged frame from a container */
	CB_DROP_EGRESS_NO_PORT = 62, /* egress NAT: no free port towards that destination, or its table is full */
	CB_DROP_EGRESS_UNSUPPORTED = 63, /* egress NAT: IP fragment, or not TCP/UDP/ICMP echo */
	CB_DROP_EGRESS_NO_FLOW = 64, /* egress NAT: TCP packet that cannot open a flow and has none */
	CB_DROP_EGRESS_INVALID_DST = 65, /* outside the network: broadcast, multicast, loopback or unspecified */
	CB_DROP_UPLINK_TO_ENDPOINT = 66, /* from the egress device straight to an endpoint address (not a NAT reply) */
	CB_DROP_HOST_NO_ROUTE = 67, /* to the host from an endpoint its routes do not lead back to (overlapping address) */
	CB_DROP_NODEPORT_NO_LOCAL = 68, /* node port: the backend chosen is on another host of a VLAN network */
	CB_DROP_EGRESS_OVERLAY = 69, /* egress to the overlay's UDP port: would be a tunnel packet from this host's address */
	CB_DROP_NO_ROUTE = 70,      /* native routing: no BGP-learned route to the destination */
	CB_DROP_NETPOL = 71,        /* denied by a Kubernetes NetworkPolicy (netpol.h) */
	CB_DROP_CT_QUOTA = 72,      /* the endpoint holds its quota of conntrack entries: a new flow was refused */
	CB_REJECT_NO_BACKEND = 73,  /* service VIP:port without backends: refused with ICMP port unreachable (icmp.h) */
	CB_DROP_FRAG_LIMIT = 74,    /* first fragment of a zone past its fragment-record budget (policy.h) */
	CB_DROP_NODEPORT_INTERNAL_SRC = 75, /* node port client from the wire claiming an address of the service's tenant */
	CB_DROP_EGRESS_LINK_LOCAL = 76, /* egress to a link-local address (169.254/16; cloud metadata unless allowed) */
	CB_REJECT_TTL_EXCEEDED = 77, /* routing mode: TTL ran out, answered with ICMP time exceeded (icmp.h) */
	CB_DROP_NO_STAGE = 78,      /* the stage an entry program hands the packet to is missing (cb_calls) */
	CB_DROP_EGRESS_UNANSWERED = 79, /* egress NAT: a TCP segment from outside that does not answer the endpoint's SYN */
	CB_DROP_NODEPORT_BLIND = 80, /* node port: a client's FIN or RST outside the window the backend's last ACK sets */
	CB_DROP_RATE_EGRESS = 81,   /* the sending endpoint's egress rate and burst are spent (qos.h) */
	CB_DROP_RATE_INGRESS = 82,  /* the receiving endpoint's ingress rate and burst are spent (qos.h) */
	CB_DROP_CLEAR_OVERLAY = 83, /* encryption on: UDP to the overlay's port from the underlay, not out of WireGuard */
	CB_DROP_DENIED_SOURCE = 84, /* from the underlay, from a source an operator denied (netctl prefilter) */
	CB_REASON_MAX = 96,
};

struct cb_counter {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CB_REASON_MAX);
	__type(key, __u32);
	__type(value, struct cb_counter);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_reasons SEC(".maps");

CB_INLINE void cb_count(struct __sk_buff *skb, enum cb_reason r)
{
	__u32 key = r;
	struct cb_counter *c = bpf_map_lookup_elem(&cb_reasons, &key);

	if (c) {
		c->packets++;
		c->bytes += skb->len;
	}
}

/* A drop event, emitted only while the agent listens (CB_FEAT_EVENTS). */
struct cb_event {
	__u64 ts;          /* bpf_ktime_get_ns() */
	__u32 reason;      /* enum cb_reason */
	__u32 ifindex;     /* device the packet was received on */
	__u32 len;
	__be32 saddr;      /* IPv4 packets only */
	__be32 daddr;
	__u16 ethertype;   /* host order */
	__u8 proto;
	__u8 rule_dir;     /* CB_DROP_POLICY by a rule: enum cb_pol_dir of that rule */
	__u16 rule_epg;    /* ... the group whose rules held it (0: no rule recorded) */
	__u16 pad;
	__u32 rule_index;  /* ... its position in that group's rules of that direction */
	__be16 sport;      /* TCP/UDP of a first (or only) fragment; 0 otherwise */
	__be16 dport;
	__u32 pad2;
};

/* The rule that denied the packet being processed: written by the policy stage while
 * events are on, consumed by cb_emit_drop. Per CPU: a program runs to completion on one
 * CPU, so the record read at the drop is the one of the same packet's judgement. */
struct cb_verdict {
	__u16 epg;
	__u8 dir;
	__u8 valid;
	__u32 index;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_verdict);
} cb_verdicts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_events SEC(".maps");

static __noinline void cb_emit_drop(struct __sk_buff *skb, __u32 r)
{
	struct cb_event *e;
	struct iphdr ip;

	e = bpf_ringbuf_reserve(&cb_events, sizeof(*e), 0);
	if (!e)
		return;
	e->ts = bpf_ktime_get_ns();
	e->reason = r;
	e->ifindex = skb->ifindex;
	e->len = skb->len;
	e->ethertype = bpf_ntohs(skb->protocol);
	e->saddr = 0;
	e->daddr = 0;
	e->proto = 0;
	e->rule_dir = 0;
	e->rule_epg = 0;
	e->pad = 0;
	e->rule_index = 0;
	e->sport = 0;
	e->dport = 0;
	e->pad2 = 0;
	if (r == CB_DROP_POLICY) {
		__u32 z = 0;
		struct cb_verdict *v = bpf_map_lookup_elem(&cb_verdicts, &z);

		if (v && v->valid) {
			e->rule_epg = v->epg;
			e->rule_dir = v->dir;
			e->rule_index = v->index;
			v->valid = 0;
		}
	}
	if (skb->protocol == bpf_htons(ETH_P_IP) &&
	    bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) == 0) {
		e->saddr = ip.saddr;
		e->daddr = ip.daddr;
		e->proto = ip.protocol;
		if ((ip.protocol == 6 || ip.protocol == 17) &&
		    !(ip.frag_off & bpf_htons(0x1fff)))
			bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &e->sport, 4);
	}
	bpf_ringbuf_submit(e, 0);
}

CB_INLINE int cb_drop(struct __sk_buff *skb, enum cb_reason r)
{
	cb_count(skb, r);
	if (cb_features & CB_FEAT_EVENTS)
		cb_emit_drop(skb, r);
	return TC_ACT_SHOT;
}
