/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h: the state maps the agent programs (pinned by name under the host's pin root,
 * BTF-typed so `bpftool map dump pinned` shows field names). Every agent-written value
 * carries the generation it was written in, so a resync sweeps only stale entries.
 * The datapath never inserts into these maps: it only reads and bumps counters. */
#pragma once

#include "common.h"

#define CB_DEFAULT_ENTRIES 65536

/* Network key: the VNI for VXLAN networks, (1 << 24) | vlan for VLAN networks. */
#define CB_NET_VLAN_BIT (1u << 24)

enum cb_encap {
	CB_ENCAP_VXLAN = 1,
	CB_ENCAP_VLAN = 2,
};

enum cb_ep_flags {
	CB_EP_LOCAL = 1,
	CB_EP_REMOTE = 2,
	CB_EP_QOS_IN = 4, /* local: what it receives is policed (qos.h) */
};

struct cb_ep_key {
	__u32 net;   /* network key */
	__be32 ip;   /* IPv4, network byte order */
};

struct cb_endpoint {
	__u32 ifindex;    /* host-side veth (local endpoints) */
	__be32 vtep;      /* owning host's VTEP (remote endpoints), network order */
	__u8 mac[6];
	__u16 epg;
	__u32 flags;      /* enum cb_ep_flags */
	__u32 generation;
	__u32 slot;       /* local endpoints: index into cb_ep_counters (0 = none) */
};

struct cb_iface {
	__u32 net;        /* network key of the endpoint behind this veth */
	__be32 ip;        /* the endpoint's IPv4 (anti-spoofing) */
	__u8 mac[6];
	__u16 epg;
	__u32 generation;
	__u32 slot;       /* index into cb_ep_counters (0 = none) */
	__u32 vrf;        /* routing domain (tenant) of the network: the conntrack zone */
	__u32 qos;        /* enum cb_qos_flags and the DSCP (qos.h); 0: no QoS */
};

struct cb_network {
	__be32 subnet;
	__be32 mask;
	__be32 gateway;   /* 0 = none */
	__u32 tag;        /* VNI or VLAN id */
	__u16 mtu;
	__u8 encap;       /* enum cb_encap */
	__u8 flags;       /* enum cb_net_flags */
	__u32 generation;
	__u32 vrf;        /* routing domain (tenant) */
};

enum cb_net_flags {
	CB_NET_SNAT = 1,  /* endpoints reach the outside, source-NATed to the host (nat.h) */
};

/* Routing mode: which network of a tenant holds an address. */
struct cb_route_key {
	__u32 vrf;
	__be32 ip;
};

struct cb_route {
	__u32 net;
	__u32 generation;
};

struct cb_peer {
	__u32 generation;
	__u32 flags;
};

struct cb_config {
	__u32 vxlan_ifindex;  /* collect_md vxlan device, 0 = none */
	__u32 uplink_ifindex; /* VLAN uplink, 0 = none */
	__be32 vtep;          /* tunnel source address */
	__u8 gw_mac[6];       /* MAC answered for gateways */
	__u16 pad;
	__u32 generation;     /* current agent generation (agent-only bookkeeping) */
	__u32 features;       /* enum cb_features: stages with state to consult */
	__u32 policy_epoch;   /* mirrored in cb_policy_epoch (conntrack.h) */
	__be32 snat_ip;       /* egress NAT source address (0 = no egress) */
	__u32 egress_ifindex; /* device egress traffic leaves by and replies arrive on */
	__u16 snat_port_min;  /* egress NAT port (and ICMP id) range, host order */
	__u16 snat_port_max;
	__be32 dns_ip;        /* host address of the agent's DNS responder (0 = none) */
	__be16 vxlan_port;    /* the overlay's UDP port: never an egress destination port */
	__u8 egress_flags;    /* enum cb_egress_flags */
	__u8 pad3;
	__u64 netns_cookie;   /* the host namespace (socket LB acts only there; 0 = off) */
	__u32 ct_quota;       /* conntrack entries one local endpoint may hold (0 = no quota) */
	__u32 ct_in_limit;    /* conntrack entries of flows opened from outside, all together (0 = none) */
};

/* Egress to link-local addresses (169.254.0.0/16) is never forwarded (RFC 3927: they are
 * of one link, and a cloud's instance metadata service at 169.254.169.254 answers the
 * node's own identity and credentials to whoever asks from the node's address, which
 * egress NAT gives every endpoint). The metadata address alone may be allowed. */
enum cb_egress_flags {
	CB_EGRESS_METADATA = 1, /* allow egress to 169.254.169.254 (netplugin --egress-allow-metadata) */
};

enum cb_features {
	CB_FEAT_POLICY = 1,   /* some endpoint group has rules (or is failed closed) */
	CB_FEAT_LB = 2,       /* some service exists */
	CB_FEAT_ROUTING = 4,  /* Contiv routing mode: route between networks of a tenant */
	CB_FEAT_EVENTS = 8,   /* someone reads cb_events: emit drop events */
	CB_FEAT_ALLOW_EVENTS = 16, /* ... and wants new flows a rule allowed too */
	CB_FEAT_NODEPORT = 32, /* some service has a node port (nodeport.h) */
	CB_FEAT_BGP = 64,      /* the host speaks BGP: routing-mode VLAN networks are routed natively (native.h) */
	CB_FEAT_NETPOL = 128,  /* some pod has a NetworkPolicy entry (netpol.h; set with CB_FEAT_POLICY) */
	CB_FEAT_ENCRYPT = 256, /* overlay packets arrive only out of WireGuard: the underlay's are dropped (cb_from_uplink) */
	CB_FEAT_DENY = 512,    /* cb_deny_src holds a prefix: the underlay's packets from it are dropped (prefilter.h) */
};

/* The stages with state: while none is on, a packet from a container is forwarded by
 * its destination alone (cb_fast_stage). */
#define CB_FEAT_STATEFUL (CB_FEAT_POLICY | CB_FEAT_LB | CB_FEAT_ROUTING | CB_FEAT_NETPOL)

struct cb_ep_stats {
	__u64 rx_packets; /* delivered to the endpoint */
	__u64 rx_bytes;
	__u64 tx_packets; /* sent by the endpoint and forwarded */
	__u64 tx_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_ep_key);
	__type(value, struct cb_endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_endpoints SEC(".maps");

/* The interface table: a host-side veth's entry by its ifindex. Every packet from a
 * container starts with this lookup, so ifindexes below CB_IFACE_DIRECT (the host
 * namespace's first ~65,000 interfaces; a veth takes one there, its container end is
 * made in the container's namespace) live in cb_iface_direct, an array the verifier
 * inlines (a hash lookup was a fifth of the local forward path); an array entry is in use
 * when its ip is set (an endpoint's address is never 0.0.0.0). Larger ifindexes, and
 * entries an earlier build wrote, live in cb_ifaces; the agent moves those below the
 * limit into the array at start (pkg/dataplane/ebpf/ifaces.go), and gives a new host veth
 * an ifindex below it where one is free (vethindex.go): the fast stage reads only the
 * array. */
#define CB_IFACE_DIRECT 65536

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_IFACE_DIRECT);
	__type(key, __u32); /* ifindex of the host-side veth */
	__type(value, struct cb_iface);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_iface_direct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, __u32); /* ifindex of the host-side veth */
	__type(value, struct cb_iface);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ifaces SEC(".maps");

/* cb_iface_in_array returns ifindex's entry where it lies in cb_iface_direct, when in use
 * (0: none there). Read in place: the agent writes an array place only for the interface
 * that holds it (an entry updated meanwhile is a mix of its own old and new fields, never
 * another interface's; one being freed loses its address first, ifaces.go). */
CB_INLINE struct cb_iface *cb_iface_in_array(__u32 ifindex)
{
	struct cb_iface *ifc;

	if (ifindex >= CB_IFACE_DIRECT)
		return 0;
	ifc = bpf_map_lookup_elem(&cb_iface_direct, &ifindex);
	return ifc && ifc->ip ? ifc : 0;
}

/* cb_iface_of returns the interface table's entry of ifindex (0: none), in place: in the
 * array, else in the hash (an element a program may only copy, cb_iface_copy). */
CB_INLINE struct cb_iface *cb_iface_of(__u32 ifindex)
{
	struct cb_iface *ifc = cb_iface_in_array(ifindex);

	return ifc ? ifc : bpf_map_lookup_elem(&cb_ifaces, &ifindex);
}

/* The interface entry of the packet being handled, per CPU (a packet's programs run to
 * the end on one CPU): cb_iface_get copies it here so that the stages below see one kind
 * of pointer whichever map the entry came from (two would double the verifier's work on
 * everything below, and a copy on the stack does not fit under the stages' frames). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_iface);
} cb_iface_scratch SEC(".maps");

/* cb_iface_copy copies the entry at src (0: none) to cb_iface_scratch and returns the
 * copy (0: none, or free). The stages read only such a copy of a cb_ifaces element: that
 * hash is preallocated and reuses an element's memory at once, not after RCU (an update
 * of an existing key parks the old element as the updating CPU's spare, and the next
 * update of another key there writes that interface's entry into it), so fields read in
 * place across a stage can be two interfaces' (TestIfaceHashReuseNoMix). */
CB_INLINE struct cb_iface *cb_iface_copy(const struct cb_iface *src)
{
	struct cb_iface *out;
	__u32 zero = 0;

	if (!src)
		return 0;
	out = bpf_map_lookup_elem(&cb_iface_scratch, &zero);
	if (!out)
		return 0;
	__builtin_memcpy(out, src, sizeof(*out));
	/* An array entry being freed loses its IP first (ifaces.go): a copy taken meanwhile
	 * is the old entry or a free one. */
	return out->ip ? out : 0;
}

/* cb_iface_same says whether the copy at a holds what b holds now, word by word. */
CB_INLINE int cb_iface_same(const struct cb_iface *a, const struct cb_iface *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	__u32 diff = 0;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*a) / sizeof(__u32)); i++)
		diff |= x[i] ^ y[i];
	return !diff;
}

/* cb_iface_get returns a copy of the interface table's entry of ifindex (0: none). A copy
 * of a cb_ifaces element is checked after it was taken: the key must still lead to that
 * element and the element still hold what was copied. An element reused for another
 * interface while it was copied (the kernel writes the new value into it before linking
 * it under its key) fails one or the other, and the packet then finds no entry (dropped,
 * drop_unknown_iface) rather than go on with two interfaces' fields
 * (TestIfaceHashReuseNoMix). */
CB_INLINE struct cb_iface *cb_iface_get(__u32 ifindex)
{
	struct cb_iface *src = cb_iface_in_array(ifindex), *out;

	if (src)
		return cb_iface_copy(src);
	src = bpf_map_lookup_elem(&cb_ifaces, &ifindex);
	out = cb_iface_copy(src);
	if (!out || !src || bpf_map_lookup_elem(&cb_ifaces, &ifindex) != src || !cb_iface_same(out, src))
		return 0;
	return out;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* network key */
	__type(value, struct cb_network);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_networks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __be32); /* VTEP IPv4, network order */
	__type(value, struct cb_peer);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_cfg SEC(".maps");

/* Per-endpoint counters by slot (allocated by the agent, stored in cb_ifaces for the
 * sender and cb_endpoints for the receiver): an array lookup the verifier inlines. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, __u32);
	__type(value, struct cb_ep_stats);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ep_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_route_key);
	__type(value, struct cb_route);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_routes SEC(".maps");

/* cb_route_lookup finds ip among the endpoints of the tenant that network net_key belongs
 * to; *out_net receives the endpoint's network key. */
CB_INLINE struct cb_endpoint *cb_route_lookup(__u32 net_key, __be32 ip, __u32 *out_net);

/* cb_features mirrors cb_config.features in the program's own .bss: the agent sets it
 * (spec.Variables / Collection.Variables) whenever it writes the config, and the hot paths
 * read it with a plain load instead of a map lookup. */
volatile __u32 cb_features;

CB_INLINE struct cb_config *cb_get_config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cb_cfg, &zero);
}

CB_INLINE struct cb_ep_stats *cb_ep_slot(__u32 slot)
{
	return bpf_map_lookup_elem(&cb_ep_counters, &slot);
}

/* cb_ep_tx / cb_ep_rx count a packet sent by / delivered to a local endpoint, known by its
 * counter slot. */
CB_INLINE void cb_ep_tx(struct __sk_buff *skb, __u32 slot)
{
	struct cb_ep_stats *s = cb_ep_slot(slot);

	if (s) {
		s->tx_packets++;
		s->tx_bytes += skb->len;
	}
}

CB_INLINE void cb_ep_rx(struct __sk_buff *skb, __u32 slot)
{
	struct cb_ep_stats *s = cb_ep_slot(slot);

	if (s) {
		s->rx_packets++;
		s->rx_bytes += skb->len;
	}
}

CB_INLINE struct cb_endpoint *cb_route_lookup(__u32 net_key, __be32 ip, __u32 *out_net)
{
	struct cb_route_key rk = {};
	struct cb_ep_key ek = {};
	struct cb_network *n;
	struct cb_route *r;

	n = bpf_map_lookup_elem(&cb_networks, &net_key);
	if (!n)
		return 0;
	rk.vrf = n->vrf;
	rk.ip = ip;
	r = bpf_map_lookup_elem(&cb_routes, &rk);
	if (!r)
		return 0;
	ek.net = r->net;
	ek.ip = ip;
	*out_net = r->net;
	return bpf_map_lookup_elem(&cb_endpoints, &ek);
}
