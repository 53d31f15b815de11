/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The hand-over between the programs of one packet (entry programs and the stages they
 * reach by tail call): the per-CPU scratch that carries a packet's parsed state from one
 * program to the next, and the two halves that write and read it. */
#pragma once

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "policy.h"
#include "lb.h"

/* Every full path runs in two programs (a tail call between them: each is verified on its
 * own budget, and the flow's judgement is verified from one state instead of once per way
 * the stages before it left it). The first identifies the source, balances services and
 * finds the destination; the second judges (policy, conntrack, the service's choice),
 * routes and delivers:
 *   a container's packet        cb_stage_container → cb_stage_ipv4_judge
 *   one bound outside           cb_stage_outside → cb_stage_egress (egress NAT)
 *   from another host           cb_from_overlay / cb_from_wire → cb_stage_remote_judge,
 *                               cb_stage_peer_host or cb_stage_nodeport_back
 *   from outside                cb_from_uplink → cb_stage_uplink_deliver or
 *                               cb_stage_nodeport_judge
 * What the first found goes to the second in cb_handoff_scratch (per CPU: nothing else
 * runs on the CPU between a program and its tail call) without its pointers: the packet's
 * headers are read again where needed, the quoted packet of an ICMP error is the
 * scratch's own copy, the destination endpoint is the copy the first program judged, and
 * the client→VIP entry the service stage found is looked up again. Never pinned: each
 * load has its own, as the layout is its own (netctl trace's load too). */
struct cb_handoff {
	struct cb_pkt p;        /* p.eth, p.ip: not read past parsing; zeroed */
	struct cb_flow f;
	struct cb_track t;      /* t.inner, t.entry, t.rev_nat: set again by the second */
	struct cb_lb_choice lc; /* lc.svc_ct: looked up again when svc_ct is set */
	struct cb_ep_key dkey;  /* the destination's key (its network: dkey.net) */
	struct cb_endpoint ep;  /* the destination the first program judged, as it found it:
				 * the second delivers to this one, never to what a lookup
				 * finds after an update (judged as one, sent to another) */
	__u32 features;         /* cb_features as the first program read it */
	__u32 svc_ct;           /* the service stage found a live client→VIP entry */
	__u32 net_key;          /* from another host: the network it arrived in */
	__u32 zone;             /* and its tenant's routing domain */
	__be32 vtep;            /* and the VTEP it came from (0: the VLAN uplink) */
	__be32 client;          /* a node port flow's client, as it arrived */
};

/* (Its value is raw bytes to the map: the Go bindings have no type for pointer fields.) */
struct cb_handoff_raw {
	__u64 b[(sizeof(struct cb_handoff) + 7) / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_handoff_raw);
} cb_handoff_scratch SEC(".maps");

/* cb_handoff_get is this CPU's hand-over state. */
CB_INLINE struct cb_handoff *cb_handoff_get(void)
{
	__u32 zero = 0;

	return (struct cb_handoff *)bpf_map_lookup_elem(&cb_handoff_scratch, &zero);
}

/* cb_hand notes a packet's state for the next program: p, f, t and, when given, lc and the
 * destination's key, without their pointers. It returns the scratch (where the caller
 * adds what is its own), or 0. */
static __noinline struct cb_handoff *cb_hand(const struct cb_pkt *p, const struct cb_flow *f,
					     const struct cb_track *t, const struct cb_lb_choice *lc,
					     const struct cb_ep_key *dkey)
{
	struct cb_handoff *s = cb_handoff_get();

	if (!s || !p || !f || !t)
		return 0;
	s->p = *p;
	s->p.eth = 0;
	s->p.ip = 0;
	s->f = *f;
	s->t = *t;
	s->t.inner = 0;
	s->t.entry = 0;
	s->t.rev_nat = 0;
	__builtin_memset(&s->lc, 0, sizeof(s->lc));
	s->svc_ct = 0;
	if (lc) {
		s->lc = *lc;
		s->lc.svc_ct = 0;
		s->svc_ct = lc->svc_ct != 0;
	}
	__builtin_memset(&s->dkey, 0, sizeof(s->dkey));
	if (dkey)
		s->dkey = *dkey;
	s->features = cb_features;
	return s;
}

/* cb_taken gives the program after the hand-over its t (and lc) back from s: the quoted
 * packet of an ICMP error is the scratch's copy; what conntrack and the service stage
 * point to is found again. */
CB_INLINE void cb_taken(struct cb_handoff *s, struct cb_track *t, struct cb_lb_choice *lc)
{
	*t = s->t;
	t->inner = s->p.inner.proto ? &s->p.inner : 0;
	t->entry = 0;
	t->rev_nat = 0;
	if (lc) {
		*lc = s->lc;
		lc->svc_ct = 0;
	}
}

