/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* conntrack.h: the connection table (docs/conntrack.md is the contract; internal/testkit/refmodel
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
#include "clock.h"
#include "policy.h"
#include "frag.h"
#include "stamps.h"
#include "tcpwin.h"

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
	CB_CT_TCP_REF_OLD = 64, /* only in entries of the build before tcpwin.h, with NODEPORT: svc_id
				 * holds the backend's last acknowledgment (now tcp_ack[1]). Read
				 * (cb_np_ref), never set; free once no such entry can be left. */
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

struct cb_ct_key {
	__u32 zone;  /* tenant routing domain */
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 kind;   /* enum cb_ct_kind */
	__u8 pad[2];
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
	__u32 svc_id;    /* CB_CT_SVC: the service (backend re-validation) */
	union {
		__be16 nodeport; /* CB_CT_NODEPORT: the host port the client used (replies leave from it) */
		/* Otherwise: the fast path's note of the host veth (ifindex below CB_IFACE_DIRECT)
		 * of the local endpoint a packet in the entry's own direction last went to (a
		 * client→VIP entry: its backend), trusted only while cb_iface_direct still holds
		 * that endpoint there (cb_dst_noted; 0: none). */
		__u16 dst_ifindex;
	};
	__u16 owner;     /* counter slot of the local endpoint the entry counts against (0: none) */
	/* TCP (the window, below): the acknowledgment number last noted from a segment of the
	 * entry's own direction [0] and of the reply direction [1], host order, 0: none. A
	 * client→VIP entry (CB_CT_SVC) keeps in [0] its flow entry's as its memo found it. */
	__u32 tcp_ack[2];
};

/* Blind FINs and RSTs (docs/conntrack.md "The window"): the rule is tcpwin.h's, over
 * tcp_ack. A FIN or RST outside the window of what the other direction last acknowledged
 * is a plain segment for conntrack: nothing moves, and it goes on to its endpoint, whose
 * stack judges it (RFC 5961). A SYN on an established flow whose other side has
 * acknowledged something is a plain segment too (a spoofed SYN would otherwise replace the
 * entry, its window with it); the endpoint's stack answers it with a challenge ACK, whose
 * acknowledgment a real peer's RST then carries. Node port flows (CB_CT_NODEPORT) keep
 * their backend's acknowledgments here too; the node port stage drops the client's blind
 * FIN or RST before conntrack (nodeport.h, cb_np_blind_check). */

/* cb_ct_windowed says whether e's TCP segments are judged by the window here (a
 * client→VIP entry is no flow's: its tcp_ack[0] is a memo's copy). */
CB_INLINE int cb_ct_windowed(const struct cb_ct_entry *e)
{
	return !(e->flags & CB_CT_SVC);
}

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

/* cb_ct_key_of sets k to f's tuple (reverse: the other way) in zone's space kind. */
CB_INLINE void cb_ct_key_of(struct cb_ct_key *k, __u32 zone, __u8 kind, const struct cb_flow *f, int reverse)
{
	k->zone = zone;
	k->kind = kind;
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

/* cb_ct_key_reverse sets r to the reverse of key k (same zone, space and protocol). */
CB_INLINE void cb_ct_key_reverse(struct cb_ct_key *r, const struct cb_ct_key *k)
{
	r->zone = k->zone;
	r->kind = k->kind;
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

/* ---- The state machine (docs/conntrack.md "Algorithm"): a packet's flow entry found,
 * judged (policy.h) when it opens or when a change it depends on came after its
 * verdict, and moved through its states. ---- */

/* cb_ct_dnat_flow says whether e is a service flow's entry that policy allowed
 * (client→backend): the packets of its reverse tuple are that flow's replies (cb_lb_reply;
 * the fast path's cb_fast_pass). */
CB_INLINE int cb_ct_dnat_flow(const struct cb_ct_entry *e)
{
	return (e->flags & (CB_CT_ALLOWED | CB_CT_DNAT)) == (CB_CT_ALLOWED | CB_CT_DNAT);
}

/* cb_ct_trusted says whether entry e (0: none) is live, carries exactly flags and is not
 * older than need (cb_stamp_ok): what the fast path asks of an entry it passes a packet
 * on without judging it (cb_fast_pass, cb_svc_fast). */
CB_INLINE int cb_ct_trusted(const struct cb_ct_entry *e, __u64 now, __u8 flags, __u32 need)
{
	return e && e->expires >= now && e->flags == flags && cb_stamp_ok(e->epoch, need);
}

/* cb_ct_flow returns the live flow entry (policy-allowed) under k. */
CB_INLINE struct cb_ct_entry *cb_ct_flow(const struct cb_ct_key *k, __u64 now)
{
	struct cb_ct_entry *e = cb_ct_live(k, now);

	if (e && !(e->flags & CB_CT_ALLOWED))
		return 0;
	cb_barrier_var(e); /* (else the test may become a mask on the pointer) */
	return e;
}

/* cb_ct_shadow marks, once an entry was just written under k (or became a service flow's),
 * whichever of it and the entry under the reverse tuple may carry the other's replies: the
 * entry under k when the reverse one is a service flow's (DNAT), the reverse one when the
 * entry under k is. Such a flow's packets may be the other flow's replies, which the full
 * stage asks about first (cb_lb_reply) and the fast path (cb_svc_fast; cb_fast_pass for an
 * entry under the packet's own tuple) does not. Either entry looks when it is written, so
 * whichever of the two is written second sees the other, also on two CPUs at once. The
 * mark stays: it only sends packets to the full stage. Only with services on. */
static __noinline void cb_ct_shadow(const struct cb_ct_key *k)
{
	struct cb_ct_key r = {};
	struct cb_ct_entry *rev, *e;

	if (!k || !(cb_features & CB_FEAT_LB))
		return;
	cb_ct_key_reverse(&r, k);
	rev = bpf_map_lookup_elem(&cb_ct, &r);
	if (!rev)
		return;
	e = bpf_map_lookup_elem(&cb_ct, k);
	if (!e)
		return;
	if ((rev->flags & CB_CT_DNAT) && !(e->flags & CB_CT_SHADOW)) {
		e->flags |= CB_CT_SHADOW;
		cb_ct_changed(e->flags);
	}
	if ((e->flags & CB_CT_DNAT) && !(rev->flags & CB_CT_SHADOW)) {
		rev->flags |= CB_CT_SHADOW;
		cb_ct_changed(rev->flags);
	}
}

/* cb_ct_restores says whether service flow entry e (DNAT) restores vip:vport on its
 * replies to a client of network net: the full stage's test whether a marked entry moves
 * (cb_ct_mark_dnat), and the fast path's that the entry is this flow's (cb_svc_fast). */
CB_INLINE int cb_ct_restores(const struct cb_ct_entry *e, __be32 vip, __be16 vport, __u32 net)
{
	return e->nat_ip == vip && e->nat_port == vport && e->nat_net == net;
}

/* cb_ct_mark_dnat records in a flow's forward entry (under k) that it is a service flow
 * (the VIP to restore on replies): also when a direct flow on the same tuple made the
 * entry first. */
CB_INLINE void cb_ct_mark_dnat(struct cb_ct_entry *e, const struct cb_ct_key *k, const struct cb_track *t)
{
	__u8 flags;

	if (!t->svc)
		return;
	if (!(e->flags & CB_CT_DNAT)) {
		e->flags |= CB_CT_DNAT;
		cb_ct_shadow(k);
	}
	flags = e->flags;
	if (t->hairpin)
		flags |= CB_CT_HAIRPIN;
	if (t->nodeport)
		flags |= CB_CT_NODEPORT;
	/* Written only when something moves (a memo of the entry then is no longer current). */
	if (flags == e->flags && cb_ct_restores(e, t->vip, t->vport, t->client_net) &&
	    (!t->nodeport || e->nodeport == t->nodeport))
		return;
	e->flags = flags;
	if (t->nodeport)
		e->nodeport = t->nodeport;
	e->nat_ip = t->vip;
	e->nat_port = t->vport;
	e->nat_net = t->client_net;
	cb_ct_changed(flags);
}

/* cb_ct_reuse: a client's kernel sees VIP:port and backend:port as different peers, so a
 * direct TCP connection to a backend may reuse the source port of a service connection
 * to it that just closed. That flow's entry (client→backend, DNAT, CLOSING) would make the
 * new connection's replies look like the service's and get the VIP restored on them: the
 * SYN of a connection that is not a service flow removes it. (Tracked flows replace it
 * in cb_ct_check.) One lookup per untracked SYN, only with services configured. */
static __noinline void cb_ct_reuse(const struct cb_flow *f, __u32 zone, __u8 kind)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;

	if (!f || !(cb_features & CB_FEAT_LB) || f->proto != CB_PROTO_TCP ||
	    (f->tcp_flags & (CB_TCP_SYN | CB_TCP_ACK)) != CB_TCP_SYN)
		return;
	cb_ct_key_of(&k, zone, kind, f, 0);
	e = bpf_map_lookup_elem(&cb_ct, &k);
	if (e && (e->flags & CB_CT_DNAT) && e->state == CB_CTS_CLOSING) {
		bpf_map_delete_elem(&cb_ct, &k);
		cb_ct_changed(CB_CT_DNAT);
	}
}

/* cb_ct_quota is the per-endpoint conntrack quota of cb_config (0: none). */
CB_INLINE __u32 cb_ct_quota(void)
{
	struct cb_config *cfg = cb_get_config();

	return cfg ? cfg->ct_quota : 0;
}

/* cb_ct_open writes a fresh NEW entry for the packet's own direction; it counts against
 * t->owner's quota (cb_ct_insert). Returns 0, CB_DROP_CT_FULL or CB_DROP_CT_QUOTA. */
static __noinline int cb_ct_open(const struct cb_ct_key *k, const struct cb_flow *f, struct cb_track *t, __u64 now)
{
	struct cb_ct_entry e = {};
	int r;

	e.state = CB_CTS_NEW;
	e.flags = CB_CT_ALLOWED;
	e.epoch = cb_clock_at_start();
	e.expires = now + cb_ct_timeout(f->proto, CB_CTS_NEW);
	if (t->svc) {
		e.flags |= CB_CT_DNAT;
		if (t->hairpin)
			e.flags |= CB_CT_HAIRPIN;
		if (t->nodeport) {
			e.flags |= CB_CT_NODEPORT;
			e.nodeport = t->nodeport;
		}
		e.nat_ip = t->vip;
		e.nat_port = t->vport;
		e.nat_net = t->client_net;
	}
	e.owner = t->owner;
	r = cb_ct_insert(k, &e, cb_ct_quota());
	if (r)
		return r;
	t->entry = bpf_map_lookup_elem(&cb_ct, k);
	return 0;
}

/* cb_ct_open_svc is cb_ct_open, then the new entry and the one under its reverse tuple
 * shadow each other as they may (cb_ct_shadow): the two calls side by side, not one under
 * the other (the stack is short). */
CB_INLINE int cb_ct_open_svc(const struct cb_ct_key *k, const struct cb_flow *f, struct cb_track *t, __u64 now)
{
	int r = cb_ct_open(k, f, t, now);

	if (!r)
		cb_ct_shadow(k);
	return r;
}

/* cb_ct_related says whether ICMP error f (quoting t->inner) belongs to a live flow: an
 * error from the quoted packet's destination back to its sender passes (and is un-NATed:
 * t->rev_nat) as part of that flow, without touching its state. A third party quoting
 * someone else's flow is judged like any other packet. */
static __noinline int cb_ct_related(const struct cb_flow *f, struct cb_track *t)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;
	__u64 now = cb_now();

	if (!f || !t || !t->inner || f->saddr != t->inner->daddr || f->daddr != t->inner->saddr)
		return 0;
	cb_ct_key_of(&k, t->zone, cb_ct_kind_of(t), t->inner, 0);
	e = cb_ct_flow(&k, now);
	if (e) {
		/* (An error the service stage translated already is not un-NATed again.) */
		if ((e->flags & CB_CT_DNAT) && !t->svc_icmp)
			t->rev_nat = e;
		return 1;
	}
	cb_ct_key_of(&k, t->zone, cb_ct_kind_of(t), t->inner, 1);
	return cb_ct_flow(&k, now) != 0;
}

/* cb_ct_note notes acknowledgment ack (host order, 0: none) of a TCP segment of e's flow
 * (reply: in e's reply direction) as due (cb_tcp_note): the one note of the full stage
 * (cb_ct_window) and the fast path (cb_ct_pass). A note in a service flow's own direction
 * makes its memos stale (cb_ct_changed): the fast path keeps a copy of it there
 * (cb_svc_fast), unless memo says the caller writes the note into that copy itself
 * (cb_svc_fast: the flow's one memo then holds it, and moving the generation would only
 * cost every other service flow of the host its memo). */
CB_INLINE void cb_ct_note(struct cb_ct_entry *e, int reply, __u32 ack, int memo)
{
	if (!cb_tcp_note(&e->tcp_ack[!!reply], ack))
		return;
	/* (No client→VIP entry holds a copy of a node port flow's: no memo to stale. An
	 * entry of the build before moves to this one's form with its backend's first note.) */
	if (!reply && !(e->flags & CB_CT_NODEPORT)) {
		if (!memo)
			cb_ct_changed(e->flags);
	} else if (reply && (e->flags & CB_CT_TCP_REF_OLD)) {
		/* (The note above stays written before the old reference is cleared: a node
		 * port stage reading the entry meanwhile finds one or the other, cb_np_ref.) */
		asm volatile("" ::: "memory");
		e->flags &= ~CB_CT_TCP_REF_OLD;
		e->svc_id = 0;
	}
}

/* cb_ct_pass is the one state move of a packet that passes on its flow's live entry e
 * without opening or closing the flow (reply: in e's reply direction), in the full stage
 * (cb_ct_check) and the fast path (cb_fast_pass, cb_svc_fast) alike: its acknowledgment
 * ack noted (cb_ct_note, memo as there; 0: none, or noted already), a first reply makes
 * the flow ESTABLISHED, and the deadline follows the state. */
CB_INLINE void cb_ct_pass(struct cb_ct_entry *e, __u8 proto, int reply, __u32 ack, __u64 now, int memo)
{
	cb_ct_note(e, reply, ack, memo);
	if (reply && e->state == CB_CTS_NEW) {
		e->state = CB_CTS_ESTABLISHED;
		cb_ct_changed(e->flags);
	}
	cb_ct_refresh(e, now + cb_ct_timeout(proto, e->state));
}

/* cb_ct_window applies the window to TCP segment f on its flow's entry e (reply: in e's
 * reply direction), with the sequence numbers cb_parse_l4 read (cb_tcp_scratch; a packet
 * whose numbers are not there is believed and notes nothing): 1 when f is a blind FIN or
 * RST (nothing of e is to move: cb_tcp_in_window); otherwise it notes f's acknowledgment
 * (cb_ct_note) and returns 0. A local endpoint's segment (local: it came from its veth, its
 * source checked) is never blind: it can close only its own flows, and judging it against
 * a peer that stopped acknowledging would keep a closed flow's entry for the established
 * timeout. */
static __noinline int cb_ct_window(struct cb_ct_entry *e, const struct cb_flow *f, int reply, int local)
{
	struct cb_tcp_seqs *s;
	__u32 zero = 0;

	if (!e || !f || f->proto != CB_PROTO_TCP || !cb_ct_windowed(e))
		return 0;
	s = bpf_map_lookup_elem(&cb_tcp_scratch, &zero);
	if (!s || !s->valid || s->saddr != f->saddr || s->sport != f->sport)
		return 0;
	if ((f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST)) && !local &&
	    !cb_tcp_in_window(s->seq, e->tcp_ack[!reply], f->tcp_flags))
		return 1;
	if (f->tcp_flags & CB_TCP_ACK)
		cb_ct_note(e, reply, s->ack, 0);
	return 0;
}

/* cb_ct_rev_service says whether a live service flow (DNAT), not closing, holds the
 * reverse of k: a SYN on k is then no reply of it (cb_lb_reply) and writes no entry. Only
 * with services on; one lookup per SYN that opens an entry. */
static __noinline int cb_ct_rev_service(const struct cb_ct_key *k, __u64 now)
{
	struct cb_ct_key r = {};
	struct cb_ct_entry *e;

	if (!k || !(cb_features & CB_FEAT_LB))
		return 0;
	cb_ct_key_reverse(&r, k);
	e = cb_ct_flow(&r, now);
	return e && (e->flags & CB_CT_DNAT) && e->state != CB_CTS_CLOSING;
}

/* cb_ct_check is the stateful stage for a tracked packet whose first fragment (or only
 * fragment) is in f: the algorithm of docs/conntrack.md. Returns 0 to pass or a reason. */
static __noinline int cb_ct_check(const struct cb_flow *f, struct cb_track *t)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;
	__u64 now;
	__u32 epoch;
	__u8 was;
	int syn, closing, opener, reply = 0, r;

	if (!f || !t)
		return CB_DROP_POLICY;
	now = cb_now();
	epoch = cb_clock_at_start(); /* the clock as the packet arrived: recorded in what it judges */
	if (t->inner && cb_ct_related(f, t))
		return 0;
	syn = f->proto == CB_PROTO_TCP && (f->tcp_flags & CB_TCP_SYN) && !(f->tcp_flags & CB_TCP_ACK);
	closing = f->proto == CB_PROTO_TCP && (f->tcp_flags & (CB_TCP_FIN | CB_TCP_RST));
	cb_ct_key_of(&k, t->zone, cb_ct_kind_of(t), f, 0);
	e = cb_ct_flow(&k, now);
	/* A SYN on an established flow with a window is a plain segment (the window, above). */
	if (syn && e && e->state == CB_CTS_ESTABLISHED && e->tcp_ack[1] && cb_ct_windowed(e))
		syn = 0;
	if (syn) {
		/* A retransmitted SYN keeps its entry; a SYN that is not a service flow does not
		 * inherit a service flow's entry on the same tuple (cb_ct_reuse). */
		if (e && e->state == CB_CTS_NEW && (t->svc || !(e->flags & CB_CT_DNAT)) &&
		    cb_stamp_ok(e->epoch, cb_ct_need(t->src_epg, t->dst_epg, t->zone))) {
			cb_ct_refresh(e, now + cb_ct_timeout(f->proto, CB_CTS_NEW));
			cb_ct_mark_dnat(e, &k, t);
			t->entry = e;
			return 0;
		}
		r = cb_judge(f, t, 0);
		if (r) {
			was = e ? e->flags : 0;
			bpf_map_delete_elem(&cb_ct, &k);
			cb_ct_changed(was);
			return r;
		}
		/* A direct SYN on the tuple of a live service flow (cb_ct_reuse), or on its
		 * reverse (a backend's), passes but does not take the flow's entry over, nor
		 * hide its replies under an entry of its own: the clash stays the sender's. */
		if (!t->svc && e && (e->flags & CB_CT_DNAT) && e->state != CB_CTS_CLOSING)
			return 0;
		if (!t->svc && cb_ct_rev_service(&k, now))
			return 0;
		was = e ? e->flags : 0;
		r = cb_ct_open_svc(&k, f, t, now);
		cb_ct_changed(was); /* (replaced) */
		return r;
	}
	if (!e) {
		cb_ct_key_of(&k, t->zone, cb_ct_kind_of(t), f, 1);
		e = cb_ct_flow(&k, now);
		reply = 1;
	}
	if (e) {
		/* Judged again when a change its verdict depends on came after it (stamps.h). */
		if (!cb_stamp_ok(e->epoch, cb_ct_need(t->src_epg, t->dst_epg, t->zone))) {
			r = cb_judge(f, t, reply);
			if (r) {
				was = e->flags;
				bpf_map_delete_elem(&cb_ct, &k);
				cb_ct_changed(was);
				return r;
			}
			e->epoch = epoch;
		}
		/* A blind FIN or RST moves nothing (the window, above). */
		if (cb_ct_window(e, f, reply, t->local)) {
		} else if (closing && e->state != CB_CTS_CLOSING) {
			e->state = CB_CTS_CLOSING;
			cb_ct_changed(e->flags);
			cb_ct_refresh(e, now + cb_ct_timeout(f->proto, e->state));
		} else {
			/* (Noted by cb_ct_window. A closing packet here finds its flow CLOSING.) */
			cb_ct_pass(e, f->proto, reply, 0, now, 0);
		}
		t->entry = e;
		if (!reply)
			cb_ct_mark_dnat(e, &k, t);
		else if (e->flags & CB_CT_DNAT)
			t->rev_nat = e;
		return 0;
	}
	/* No entry: judged as an opening. Only packets that may open a flow create one. */
	r = cb_judge(f, t, 0);
	if (r)
		return r;
	if (f->proto == CB_PROTO_TCP)
		opener = !closing;
	else
		opener = f->proto != CB_PROTO_ICMP || f->icmp_type == CB_ICMP_ECHO;
	if (!opener)
		return 0;
	cb_ct_key_of(&k, t->zone, cb_ct_kind_of(t), f, 0);
	r = cb_ct_open_svc(&k, f, t, now);
	if (!r)
		cb_ct_window(t->entry, f, 0, t->local); /* (a segment opening mid-flow: its ACK noted) */
	return r;
}

/* cb_track_flags fills t's group states and NetworkPolicy bits. Inlined: a call costs
 * more than its two array lookups (every return goes through the return thunk on
 * machines with speculative-return mitigations), and the NetworkPolicy lookups' keys fit
 * under the callers' frames. */
CB_INLINE void cb_track_flags(const struct cb_flow *f, struct cb_track *t)
{
	if (!f || !t)
		return;
	t->src_flags = cb_epg_flags_of(t->src_epg);
	t->dst_flags = cb_epg_flags_of(t->dst_epg);
	/* A client talking to itself through its service is not policy's business; nor, for
	 * NetworkPolicy, is a pod talking with its own node (Kubernetes always allows it). */
	if ((cb_features & CB_FEAT_NETPOL) && !t->hairpin && t->kind != CB_FLOW_HOST) {
		if (cb_kpod_of(t->zone, f->saddr))
			t->src_flags |= CB_EPG_NETPOL;
		if (cb_kpod_of(t->zone, f->daddr))
			t->dst_flags |= CB_EPG_NETPOL;
	}
}

/* cb_stateful runs policy and conntrack for a packet whose L4 identity is in f (t filled
 * by the caller). Flows between groups without rules that are not service flows never
 * touch conntrack or the fragment table. Returns 0 to continue or a drop reason. */
CB_INLINE int cb_stateful(const struct cb_flow *f, struct cb_track *t)
{
	int r;

	cb_track_flags(f, t);
	if (!(t->src_flags | t->dst_flags) && !t->svc && !t->svc_reply && !t->svc_icmp) {
		/* (cb_ct_reuse's own test, here too: most packets need no call.) */
		if ((cb_features & CB_FEAT_LB) && f->proto == CB_PROTO_TCP &&
		    (f->tcp_flags & (CB_TCP_SYN | CB_TCP_ACK)) == CB_TCP_SYN)
			cb_ct_reuse(f, t->zone, cb_ct_kind_of(t));
		return 0;
	}
	/* Non-first fragments carry no L4 header: their first fragment's verdict decides. */
	if (t->frag == CB_FRAG_LATER)
		return cb_frag_verdict(f, t);
	/* A first fragment records (here, and a service flow's in cb_nat_frags): within its
	 * zone's budget only. */
	if (t->frag == CB_FRAG_FIRST && !cb_frag_admit(t->zone, cb_ct_kind_of(t), f->saddr))
		return CB_DROP_FRAG_LIMIT;
	r = cb_ct_check(f, t);
	if (t->frag == CB_FRAG_FIRST)
		cb_frag_record(f, t, r == 0);
	return r;
}
