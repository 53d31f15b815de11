/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* nodeport.h: a service port reachable on the host's own address (docs/host-routing.md
 * "Node ports"). A TCP/UDP packet arriving on the egress device for snat_ip:nodeport is
 * steered to the service's VIP:port and balanced like a local client's flow, among the
 * backends on this host (the client's address is kept, as Kubernetes'
 * externalTrafficPolicy=Local); its conntrack entry carries CB_CT_NODEPORT and the node
 * port, so a backend's replies leave from snat_ip:nodeport out of the egress device. */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"
#include "lb.h"

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
	__uint(max_entries, 4096);
	__type(key, struct cb_np_key);
	__type(value, struct cb_np);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_nodeports SEC(".maps");

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
