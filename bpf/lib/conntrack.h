/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* conntrack.h: the connection table (docs/conntrack.md is the contract; pkg/policy/model.go
 * is its Go reference model). Keys carry the zone (the tenant's routing domain), so two
 * tenants with overlapping subnets never share an entry. Entries are created only after
 * policy allowed the packet that opens the flow; TCP has NEW / ESTABLISHED / CLOSING states
 * with their own timeouts; a policy epoch in every entry makes a policy change apply to
 * the established flows it can affect on their next packet (stamps.h). The table is a plain hash: when it is full, new
 * flows are refused (drop_ct_full) and established ones keep their entries; the agent's GC
 * deletes expired entries. A local endpoint holding its quota of entries has its new flows
 * refused (drop_ct_quota). */
#pragma once

#include "common.h"
#include "parse.h"
#include "maps.h"

#define CB_NS 1000000000ULL
#define CB_CT_TIMEOUT_TCP_NEW (60ULL * CB_NS)
#define CB_CT_TIMEOUT_TCP_EST (21600ULL * CB_NS)
#define CB_CT_TIMEOUT_TCP_CLOSE (10ULL * CB_NS)
#define CB_CT_TIMEOUT_OTHER (60ULL * CB_NS)

enum cb_ct_flags {
	CB_CT_ALLOWED = 1, /* policy allowed this flow (key = original direction) */
	CB_CT_SVC = 2,     /* key = client→VIP tuple; nat_* = the chosen backend */
	CB_CT_DNAT = 4,    /* key = client→backend tuple; nat_* = VIP:port to restore on replies */
	CB_CT_HAIRPIN = 8, /* with DNAT: the client is its own backend; key = VIP:cport→client */
	CB_CT_NODEPORT = 16, /* with DNAT: the client came to the host's node port (nodeport) from outside */
	CB_CT_SHADOW = 32, /* a service flow's entry (DNAT) was made under the reverse tuple, so a packet
			    * of this flow may be that one's reply: the full stage decides (cb_ct_shadow) */
	CB_CT_TCP_REF = 64, /* with NODEPORT (TCP): svc_id holds the backend's last acknowledgment
			     * number, where the client's FIN or RST must lie (nodeport.h) */
};

enum cb_ct_state {
	CB_CTS_NEW = 1,         /* opened, no reply yet */
	CB_CTS_ESTABLISHED = 2, /* a packet in the reply direction passed */
	CB_CTS_CLOSING = 3,     /* TCP FIN or RST seen */
};

/* In a client→VIP entry's state: its epoch is the stamp of a memo of the flow's own entry
 * (client→backend), whose state is in the low bits (cb_svc_fast). */
#define CB_CT_MEMO 0x80
#define CB_CT_MEMO_STATE 0x03

/* Flows from outside through a node port live in their own zone (the service's zone with
 * this bit flipped): a client's spoofed source can never meet an entry of the tenant's own
 * endpoints. The driver refuses tenants whose zones differ by this bit only. */
#define CB_ZONE_NODEPORT 0x80000000u

struct cb_ct_key {
	__u32 zone;  /* tenant routing domain */
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct cb_ct_entry {
	__u64 expires;   /* cb_now() deadline (CLOCK_MONOTONIC, tick resolution) */
	__be32 nat_ip;
	__be16 nat_port;
	__u8 flags;      /* enum cb_ct_flags */
	__u8 state;      /* enum cb_ct_state; CB_CT_SVC: CB_CTS_NEW, or CB_CT_MEMO | the state of
			  * the memo in epoch (cb_svc_fast) */
	__u32 nat_net;   /* network key of nat_ip (backend's, or the client's for CB_CT_DNAT) */
	__u32 epoch;     /* the policy clock as the packet of the last verdict arrived (stamps.h);
			  * CB_CT_SVC: the service's
			  * revision when its backend was last found a member (cb_lb_forward), or
			  * with CB_CT_MEMO a memo's stamp (cb_svc_memo_stamp) */
	__u32 svc_id;    /* CB_CT_SVC: the service (backend re-validation); CB_CT_TCP_REF: the
			  * backend's last acknowledgment number (host order) */
	union {
		__be16 nodeport; /* CB_CT_NODEPORT: the host port the client used (replies leave from it) */
		/* Otherwise: the fast path's note of the host veth (ifindex below CB_IFACE_DIRECT)
		 * of the local endpoint a packet in the entry's own direction last went to (a
		 * client→VIP entry: its backend), trusted only while cb_iface_direct still holds
		 * that endpoint there (cb_dst_noted; 0: none). */
		__u16 dst_ifindex;
	};
	__u16 owner;     /* counter slot of the local endpoint the entry counts against (0: none) */
};

#ifndef CB_CT_ENTRIES
#define CB_CT_ENTRIES (4 * CB_DEFAULT_ENTRIES)
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_CT_ENTRIES);
	__type(key, struct cb_ct_key);
	__type(value, struct cb_ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ct SEC(".maps");

/* Per-endpoint quota (docs/conntrack.md "Per-endpoint quota"): entries counted by owner
 * slot, the flows a local endpoint opened (cb_ct_owned) apart from the flows others opened
 * to it (cb_ct_owned_in: from other hosts, the wire, node ports), so a peer that may open
 * flows to an endpoint cannot spend the endpoint's own quota (its DNS included). The
 * datapath adds one for each entry it creates; the agent's collector writes the live
 * entries' counts at every sweep (entries that expire or are deleted meanwhile still count
 * until then). */
struct cb_ct_count {
	__u32 count;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_DEFAULT_ENTRIES); /* = cb_ep_counters */
	__type(key, __u32); /* counter slot */
	__type(value, struct cb_ct_count);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ct_owned SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_DEFAULT_ENTRIES); /* = cb_ep_counters */
	__type(key, __u32); /* counter slot */
	__type(value, struct cb_ct_count);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ct_owned_in SEC(".maps");

/* An entry's owner: the counter slot of the local endpoint it counts against, with
 * CB_OWNER_IN set when the flow was opened to it by someone else (cb_ct_owned_in). Entries
 * hold 16 bits, so an endpoint with a slot past 15 (more than 32767 local endpoints) is
 * not counted. */
#define CB_OWNER_IN 0x8000

/* cb_ct_owner is the owner of the flows the endpoint with counter slot s opens. */
CB_INLINE __u16 cb_ct_owner(__u32 s)
{
	return s < CB_OWNER_IN ? (__u16)s : 0;
}

/* cb_ct_owner_in is the owner of the flows others open to the endpoint with slot s; an
 * endpoint without a counted slot, or none (a node port flow to a backend on another
 * host), gives CB_OWNER_IN alone: the flow counts in the host's total of flows opened from
 * outside (cb_ct_owned_in[0], limited by cb_config.ct_in_limit) and nowhere else. */
CB_INLINE __u16 cb_ct_owner_in(__u32 s)
{
	return s && s < CB_OWNER_IN ? (__u16)(s | CB_OWNER_IN) : CB_OWNER_IN;
}

/* The conntrack clock's calibration (pkg/dataplane/ebpf/clock.go), set by the agent:
 * cb_now() = jiffies × cb_tick_ns + cb_clock_base, which equals CLOCK_MONOTONIC_COARSE
 * within a tick (the kernel advances jiffies from the monotonic clock, by the tick's
 * length). bpf_jiffies64 is a load (the JIT inlines it); bpf_ktime_get_coarse_ns is a call,
 * and a call with its return costs as much as a hash lookup on machines with
 * speculative-return mitigations. */
volatile __u64 cb_clock_base;
volatile __u32 cb_tick_ns;

/* cb_now is the conntrack clock: CLOCK_MONOTONIC at tick resolution, plenty for timeouts of
 * seconds (the agent's collector reads CLOCK_MONOTONIC_COARSE). Until the agent calibrated
 * it (cb_tick_ns 0), the coarse clock itself. */
CB_INLINE __u64 cb_now(void)
{
	__u32 tick = cb_tick_ns;

	if (tick)
		return bpf_jiffies64() * tick + cb_clock_base;
	return bpf_ktime_get_coarse_ns();
}

/* Service flows' memo generation (docs/conntrack.md "The service fast path's memo"): one
 * counter, bumped after every change the datapath makes to a service flow's entry
 * (CB_CT_DNAT) other than its deadline: its state, flags or NAT fields, its deletion, its
 * replacement. Pinned, so it never goes back across restarts. */
struct cb_ct_gen {
	__u32 gen;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_ct_gen);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ct_gens SEC(".maps");

/* cb_ct_gen_now is the memo generation. */
CB_INLINE __u32 cb_ct_gen_now(void)
{
	__u32 zero = 0;
	struct cb_ct_gen *g = bpf_map_lookup_elem(&cb_ct_gens, &zero);

	return g ? g->gen : 0;
}

/* cb_ct_changed records that an entry with these flags (before a deletion or replacement,
 * after any other change) was changed: when it is a service flow's (CB_CT_DNAT), no memo
 * taken before is current. */
CB_INLINE void cb_ct_changed(__u8 flags)
{
	__u32 zero = 0;
	struct cb_ct_gen *g;

	if (!(flags & CB_CT_DNAT))
		return;
	g = bpf_map_lookup_elem(&cb_ct_gens, &zero);
	if (g)
		__sync_fetch_and_add(&g->gen, 1);
}

/* cb_ct_refresh sets an entry's deadline (now + the timeout of its state). */
CB_INLINE void cb_ct_refresh(struct cb_ct_entry *e, __u64 deadline)
{
	if (e->expires != deadline)
		e->expires = deadline;
}

CB_INLINE void cb_ct_key_of(struct cb_ct_key *k, __u32 zone, const struct cb_flow *f, int reverse)
{
	k->zone = zone;
	k->proto = f->proto;
	if (reverse) {
		k->saddr = f->daddr;
		k->daddr = f->saddr;
		k->sport = f->dport;
		k->dport = f->sport;
	} else {
		k->saddr = f->saddr;
		k->daddr = f->daddr;
		k->sport = f->sport;
		k->dport = f->dport;
	}
}

/* cb_ct_key_reverse sets r to the reverse of key k (same zone and protocol). */
CB_INLINE void cb_ct_key_reverse(struct cb_ct_key *r, const struct cb_ct_key *k)
{
	r->zone = k->zone;
	r->saddr = k->daddr;
	r->daddr = k->saddr;
	r->sport = k->dport;
	r->dport = k->sport;
	r->proto = k->proto;
}

CB_INLINE __u64 cb_ct_timeout(__u8 proto, __u8 state)
{
	if (proto != CB_PROTO_TCP)
		return CB_CT_TIMEOUT_OTHER;
	if (state == CB_CTS_ESTABLISHED)
		return CB_CT_TIMEOUT_TCP_EST;
	if (state == CB_CTS_CLOSING)
		return CB_CT_TIMEOUT_TCP_CLOSE;
	return CB_CT_TIMEOUT_TCP_NEW;
}

/* cb_ct_live returns the entry under k if it has not expired. */
CB_INLINE struct cb_ct_entry *cb_ct_live(const struct cb_ct_key *k, __u64 now)
{
	struct cb_ct_entry *e = bpf_map_lookup_elem(&cb_ct, k);

	if (e && e->expires < now)
		return 0;
	return e;
}

/* cb_ct_in_limit is cb_config.ct_in_limit, or no limit (0 there, or no config). */
CB_INLINE __u32 cb_ct_in_limit(void)
{
	struct cb_config *cfg = cb_get_config();

	return cfg && cfg->ct_in_limit ? cfg->ct_in_limit : 0xffffffff;
}

/* cb_ct_charge checks (add 0) or takes (add 1) one entry of owner's counts: its slot's
 * (cb_ct_owned, or cb_ct_owned_in for CB_OWNER_IN) and, for a flow opened from outside,
 * the host's total of those (cb_ct_owned_in[0]). Checking returns CB_DROP_CT_QUOTA when a
 * quota (0: none) or the total's limit is reached. A global function: verified once, and
 * its frame sits at the end of the chains, off the callers' (which have none to spare). */
__noinline int cb_ct_charge(__u32 owner, __u32 quota, __u32 add)
{
	struct cb_ct_count *o = 0, *in = 0;
	__u32 slot = owner;

	if (owner & CB_OWNER_IN) {
		slot = 0;
		in = bpf_map_lookup_elem(&cb_ct_owned_in, &slot);
		slot = owner & ~CB_OWNER_IN;
		if (slot)
			o = bpf_map_lookup_elem(&cb_ct_owned_in, &slot);
	} else if (owner) {
		o = bpf_map_lookup_elem(&cb_ct_owned, &slot);
	}
	if (add) {
		if (o)
			__sync_fetch_and_add(&o->count, 1);
		if (in)
			__sync_fetch_and_add(&in->count, 1);
		return 0;
	}
	if (o && quota && o->count >= quota)
		return CB_DROP_CT_QUOTA;
	if (in && quota && in->count >= cb_ct_in_limit())
		return CB_DROP_CT_QUOTA;
	return 0;
}

/* cb_ct_insert writes e under k; returns 0, CB_DROP_CT_FULL or (quota set) CB_DROP_CT_QUOTA.
 * Overwriting an existing key never fails (hash maps keep spare elements for in-place
 * replacement). An entry that takes a key not already held by an entry of the same owner
 * adds one to its owner's count; with quota (0: none) that count must be below it first.
 * Overwriting an entry of the same owner neither checks nor counts: a repeated opening
 * of one flow takes its quota once. A flow opened from outside (CB_OWNER_IN) also counts
 * in the host's total of those (cb_ct_owned_in[0]), refused (with a quota) once that is at
 * cb_config.ct_in_limit: peers and wire clients together never fill the table the local
 * endpoints' own flows need, however many endpoints they reach. */
CB_INLINE int cb_ct_insert(const struct cb_ct_key *k, const struct cb_ct_entry *e, __u32 quota)
{
	struct cb_ct_entry *old;
	__u32 owner = e->owner;
	int charge = 0, r;

	if (owner) {
		old = bpf_map_lookup_elem(&cb_ct, k);
		charge = !old || old->owner != owner;
	}
	if (charge) {
		r = cb_ct_charge(owner, quota, 0);
		if (r)
			return r;
	}
	if (bpf_map_update_elem(&cb_ct, k, e, BPF_ANY) < 0)
		return CB_DROP_CT_FULL;
	if (charge)
		cb_ct_charge(owner, 0, 1);
	return 0;
}
