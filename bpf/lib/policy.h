/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* policy.h: endpoint-group policy. Each (EPG, direction) holds up to CB_MAX_RULES rules
 * sorted by effective priority (2*priority, +1 for deny so deny wins ties), highest first:
 * the first matching rule is the answer. The agent keeps that list in cb_policies (listings,
 * verification, the source of the compiled form at start) and compiles it into lookups
 * (cb_pol_heads, cb_pol_rules, cb_pol_cidrs) whose cost does not grow with the number of
 * rules: docs/policy.md "Lookup". A flow is checked against the egress rules of its source
 * EPG and the ingress rules of its destination EPG; the highest-priority match of both
 * decides; no match allows (Contiv's default). Evaluated once per flow: conntrack passes
 * later packets and replies. Kubernetes NetworkPolicy is a second layer ANDed with it
 * (netpol.h). Here: the rules, their compiled lookups and the verdict of a flow opening
 * (cb_judge); fragments inherit theirs (frag.h); conntrack's state machine asks for it
 * (conntrack.h, cb_ct_check). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "netpol.h"
#include "stamps.h"

#define CB_MAX_RULES 1024

enum cb_pol_dir {
	CB_DIR_EGRESS = 0,
	CB_DIR_INGRESS = 1,
};

enum cb_rule_action {
	CB_ACT_NONE = 0,
	CB_ACT_ALLOW = 1,
	CB_ACT_DENY = 2,
};

#define CB_RULE_SYN_ONLY 1

struct cb_pol_key {
	__u16 epg;
	__u8 dir;  /* enum cb_pol_dir */
	__u8 pad;
};

struct cb_rule {
	__be32 remote_ip;   /* masked prefix; 0/0 = any address */
	__be32 remote_mask;
	__u16 remote_epg;   /* 0 = any group */
	__be16 port;        /* destination port, network order; 0 = any */
	__u8 proto;         /* 0 = any */
	__u8 flags;         /* CB_RULE_SYN_ONLY */
	__u8 action;        /* enum cb_rule_action */
	__u8 pad;
	__u16 prio;         /* effective priority, 2*priority (+1 deny) */
	__u16 pad2;
};

/* The rule list of one (EPG, direction) as the agent sorted it: not read by the programs
 * (they use the compiled form below), kept for listings, verification and to compile from
 * at start (also after an upgrade from a build that scanned it). */
struct cb_policy {
	__u32 count;
	__u32 generation;
	struct cb_rule rules[CB_MAX_RULES];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_pol_key);
	__type(value, struct cb_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_policies SEC(".maps");

/* Compiled policy. A rule's wildcard class says which of (remote group, protocol, port) it
 * names (a 0 field is a wildcard); the rules of one (EPG, direction) with the same named
 * values share one key of cb_pol_rules: {version, remote group or 0, protocol or 0, port
 * or 0}. Its value holds the best (first in the sorted list) of those rules for any
 * address (the 0/0 ones), once for a SYN and once for any other packet (CB_RULE_SYN_ONLY
 * rules count only for a SYN), and, when some of them name a prefix, the slot of their
 * prefixes in the LPM trie cb_pol_cidrs, where each prefix holds the best of the key's
 * rules whose prefix contains it (0/0 included): the longest prefix holding an address is
 * contained in every matching rule's prefix, so its value is the answer for the address.
 * A packet looks up, for each class the head's bitmap has, one key (and its prefix when the
 * key has prefixes) and keeps the best of the answers: at most 8 + 8 lookups whatever the
 * number of rules, 1-3 in the common case. Priorities and deny-wins-ties are the order of
 * the list, resolved by the agent. */
enum cb_pol_class {
	CB_POL_CLS_EPG = 1,   /* the rule names a remote group */
	CB_POL_CLS_PROTO = 2, /* ... a protocol */
	CB_POL_CLS_PORT = 4,  /* ... a destination port */
};

/* Per (EPG, direction): which version of the compiled keys the packets use. The agent
 * writes a new rule set's keys under a new version, then replaces this head (one atomic
 * element swap: BPF_F_NO_PREALLOC, so a reader keeps the element it found until its RCU
 * section ends), then deletes the old version's keys (cb_rules_match reads the head again
 * after its lookups to notice that: docs/policy.md "Lookup"). */
struct cb_pol_head {
	__u32 ver;        /* version of the keys in use; unique per agent run and above */
	__u32 generation; /* the agent's sync generation */
	__u32 count;      /* rules in the list (for bpftool) */
	__u8 classes;     /* bit c set: some rule has wildcard class c (enum cb_pol_class) */
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_pol_key);
	__type(value, struct cb_pol_head);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_pol_heads SEC(".maps");

struct cb_pol_rule_key {
	__u32 ver;
	__u16 remote_epg; /* 0: rules for any group */
	__be16 port;      /* 0: rules for any port */
	__u8 proto;       /* 0: rules for any protocol */
	__u8 pad[3];
};

/* The best rule for a packet: its effective priority, position in the sorted list and
 * action (CB_ACT_NONE: no rule). */
struct cb_pol_best {
	__u16 prio;
	__u16 index;
	__u8 action;
	__u8 pad[3];
};

/* The answers of a key or prefix: for a SYN (syn, !ack) and for any other packet. */
struct cb_pol_cidr {
	struct cb_pol_best syn;
	struct cb_pol_best other;
};

struct cb_pol_rule {
	struct cb_pol_cidr any; /* the key's 0/0 rules: for an address no prefix holds */
	__u32 cidrs;            /* 0, or the slot of the key's prefixes in cb_pol_cidrs */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_pol_rule_key);
	__type(value, struct cb_pol_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_pol_rules SEC(".maps");

struct cb_pol_cidr_key {
	__u32 prefixlen; /* 64 + the prefix's length */
	__u32 ver;
	__u32 slot;
	__be32 ip;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct cb_pol_cidr_key);
	__type(value, struct cb_pol_cidr);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_pol_cidrs SEC(".maps");

/* cb_pol_scratch holds cb_rules_match's keys and the packet's values for the named fields
 * (per CPU, not on the stack: the deepest call chain has no room for them). */
struct cb_pol_scratch {
	struct cb_pol_key hk;    /* the (EPG, direction) head */
	struct cb_pol_rule_key k;
	struct cb_pol_cidr_key ck;
	__u32 epg;   /* the remote group, for keys naming a group */
	__u32 proto; /* for keys naming a protocol */
	__u32 port;  /* for keys naming a port (network order) */
	__u32 mask;  /* the classes that can hold a rule for the packet; bit 8: a SYN */
	__u32 classes; /* of the head being looked at, within mask */
	__u32 clock; /* the policy clock as the packet arrived (cb_clock_start, stamps.h) */
	__u64 best;  /* prio bits 0-15, index 16-32 (bit 32: none yet), action 48-55 */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cb_pol_scratch);
} cb_pol_scratch SEC(".maps");

/* The key of cb_pol_scratch's one entry, in read-only data (not on the stack). */
static volatile const __u32 cb_pol_zero = 0;

/* cb_clock_start notes the policy clock for the packet that just arrived (stamps.h), in
 * cb_pol_scratch (per CPU: not on the stack, the deepest chain is full): before the packet
 * reads any endpoint, group, rule or NetworkPolicy state its verdicts depend on. */
CB_INLINE void cb_clock_start(void)
{
	struct cb_pol_scratch *s = bpf_map_lookup_elem(&cb_pol_scratch, (const void *)&cb_pol_zero);

	if (s)
		s->clock = cb_policy_epoch;
}

/* cb_clock_at_start is the clock cb_clock_start noted, which the entries the packet judges
 * record (0, older than any stamp but the first, if none). */
CB_INLINE __u32 cb_clock_at_start(void)
{
	struct cb_pol_scratch *s = bpf_map_lookup_elem(&cb_pol_scratch, (const void *)&cb_pol_zero);

	return s ? s->clock : 0;
}

/* Attempts of cb_rules_match before it gives up on a rule set that keeps changing. */
#define CB_POL_TRIES 4

/* No rule yet (cb_pol_scratch.best). */
#define CB_POL_NO_BEST (0x10000ULL << 16)

/* cb_rules_match returns the action of the first (= highest priority) matching rule of
 * the rules of epg_dir (EPG in the low 16 bits, enum cb_pol_dir above) and, in
 * *prio_index, its priority (low 16 bits) and position in the sorted list (high 16), or
 * CB_ACT_NONE. remote_* describe the other end of the flow. For each wildcard class the
 * head lists (and the packet can match) it looks up one key and, when the key has
 * prefixes, the longest of them holding remote_ip, and keeps the earliest rule: at most
 * 2 + 16 lookups whatever the number of rules. A global function: the verifier checks it
 * once, not at every call site (and takes at most five arguments); its state lives in
 * cb_pol_scratch (the stack of the deepest chain is full).
 *
 * Consistency: the agent writes a new version's keys, swaps the head, and only then
 * deletes the old version's keys (poltables.go). A packet that found the head at version
 * v and looked its keys up while they were being deleted (a miss that is not the rule
 * set's answer) finds another head when it reads it again after its lookups, because the
 * swap came before the deletion; it then looks again at the new version. An answer is
 * returned only when the head was the same before and after, i.e. from one complete
 * version. A head that is gone means the direction has no rules now: no match. */
__noinline int cb_rules_match(__u32 epg_dir, const struct cb_flow *f, __u32 remote_epg, __u32 remote_ip, __u32 *prio_index)
{
	const struct cb_pol_best *b;
	struct cb_pol_scratch *s;
	struct cb_pol_head *h;
	struct cb_pol_rule *e;
	struct cb_pol_cidr *c;
	__u32 try, i;

	if (!f || !prio_index)
		return CB_ACT_NONE;
	s = bpf_map_lookup_elem(&cb_pol_scratch, (const void *)&cb_pol_zero);
	if (!s)
		return CB_ACT_NONE;
	s->hk.epg = (__u16)epg_dir;
	s->hk.dir = (__u8)(epg_dir >> 16);
	s->hk.pad = 0;
	s->k.pad[0] = s->k.pad[1] = s->k.pad[2] = 0;
	s->epg = (__u16)remote_epg;
	s->proto = f->proto;
	s->port = f->dport;
	s->ck.prefixlen = 96;
	s->ck.ip = remote_ip;
	/* A class naming a field the packet has as 0 (or a port it does not have) holds no
	 * rule for it: a named field is never 0 (0 is the wildcard). */
	s->mask = 0xff;
	if (!s->epg)
		s->mask &= 0x55; /* without CB_POL_CLS_EPG */
	if (!f->proto)
		s->mask &= 0x33; /* without CB_POL_CLS_PROTO */
	if (!f->has_ports || !f->dport)
		s->mask &= 0x0f; /* without CB_POL_CLS_PORT */
	if (f->proto == CB_PROTO_TCP && (f->tcp_flags & CB_TCP_SYN) && !(f->tcp_flags & CB_TCP_ACK))
		s->mask |= 0x100;
	for (try = 0; try < CB_POL_TRIES; try++) {
		h = bpf_map_lookup_elem(&cb_pol_heads, &s->hk);
		if (!h)
			return CB_ACT_NONE;
		s->k.ver = h->ver;
		s->ck.ver = h->ver;
		s->classes = h->classes & s->mask;
		s->best = CB_POL_NO_BEST;
		for (i = 0; i < 8; i++) {
			if (!(s->classes & (1u << i)))
				continue;
			s->k.remote_epg = (i & CB_POL_CLS_EPG) ? (__u16)s->epg : 0;
			s->k.proto = (i & CB_POL_CLS_PROTO) ? (__u8)s->proto : 0;
			s->k.port = (i & CB_POL_CLS_PORT) ? (__be16)s->port : 0;
			e = bpf_map_lookup_elem(&cb_pol_rules, &s->k);
			if (!e)
				continue;
			b = (s->mask & 0x100) ? &e->any.syn : &e->any.other;
			if (e->cidrs) {
				s->ck.slot = e->cidrs;
				c = bpf_map_lookup_elem(&cb_pol_cidrs, &s->ck);
				if (c)
					b = (s->mask & 0x100) ? &c->syn : &c->other;
			}
			if (b->action != CB_ACT_NONE && b->index < (__u32)(s->best >> 16))
				s->best = (__u64)b->prio | ((__u64)b->index << 16) | ((__u64)b->action << 48);
		}
		h = bpf_map_lookup_elem(&cb_pol_heads, &s->hk);
		if (!h)
			return CB_ACT_NONE;
		if (h->ver == s->k.ver) {
			if (!(s->best >> 48))
				return CB_ACT_NONE;
			*prio_index = (__u32)s->best;
			return (int)(s->best >> 48);
		}
	}
	/* Replaced under every attempt: deny (never allow what no version was seen to). */
	*prio_index = 0xffffffff;
	return CB_ACT_DENY;
}

/* cb_note_deny records, while events are on, which rule denied the packet (cb_verdicts). */
CB_INLINE void cb_note_deny(__u16 epg, __u8 dir, __u32 prio_index)
{
	__u32 z = 0;
	struct cb_verdict *v;

	if (!(cb_features & CB_FEAT_EVENTS))
		return;
	v = bpf_map_lookup_elem(&cb_verdicts, &z);
	if (v) {
		v->epg = epg;
		v->dir = dir;
		v->index = prio_index >> 16;
		v->valid = 1;
	}
}

/* cb_emit_allow reports, while events are on, a new flow a rule allowed (the monitor's
 * allowed verdicts). No packet context: interface and length are 0. */
static __noinline void cb_emit_allow(const struct cb_flow *f, __u16 epg, __u8 dir, __u32 prio_index)
{
	struct cb_event *e;

	if (!f)
		return;
	e = bpf_ringbuf_reserve(&cb_events, sizeof(*e), 0);
	if (!e)
		return;
	e->ts = bpf_ktime_get_ns();
	e->reason = CB_POLICY_ALLOW;
	e->ifindex = 0;
	e->len = 0;
	e->saddr = f->saddr;
	e->daddr = f->daddr;
	e->ethertype = 0x0800;
	e->proto = f->proto;
	e->rule_dir = dir;
	e->rule_epg = epg;
	e->pad = 0;
	e->rule_index = prio_index >> 16;
	e->sport = f->has_ports ? f->sport : 0;
	e->dport = f->has_ports ? f->dport : 0;
	e->pad2 = 0;
	bpf_ringbuf_submit(e, 0);
}

/* cb_policy_allows decides a new flow from src_epg to dst_epg (eg, in: whether the
 * source group's egress and the destination group's ingress rules are to be asked). */
CB_INLINE int cb_policy_allows(int eg, int in, const struct cb_flow *f, __u16 src_epg, __u16 dst_epg)
{
	__u32 pe = 0, pi = 0;
	int ae = CB_ACT_NONE, ai = CB_ACT_NONE;

	if (eg)
		ae = cb_rules_match((__u32)src_epg | ((__u32)CB_DIR_EGRESS << 16), f, dst_epg, f->daddr, &pe);
	if (in)
		ai = cb_rules_match((__u32)dst_epg | ((__u32)CB_DIR_INGRESS << 16), f, src_epg, f->saddr, &pi);
	if (ae != CB_ACT_NONE && (ai == CB_ACT_NONE || (__u16)pe >= (__u16)pi)) {
		if (ae == CB_ACT_DENY)
			cb_note_deny(src_epg, CB_DIR_EGRESS, pe);
		else if (cb_features & CB_FEAT_ALLOW_EVENTS)
			cb_emit_allow(f, src_epg, CB_DIR_EGRESS, pe);
		return ae != CB_ACT_DENY;
	}
	if (ai != CB_ACT_NONE) {
		if (ai == CB_ACT_DENY)
			cb_note_deny(dst_epg, CB_DIR_INGRESS, pi);
		else if (cb_features & CB_FEAT_ALLOW_EVENTS)
			cb_emit_allow(f, dst_epg, CB_DIR_INGRESS, pi);
		return ai != CB_ACT_DENY;
	}
	return 1;
}

CB_INLINE __u32 cb_epg_flags_of(__u16 epg)
{
	__u32 k = epg;
	struct cb_epg_state *s;

	if (!epg)
		return 0;
	s = bpf_map_lookup_elem(&cb_epgs, &k);
	return s ? s->flags : 0;
}

/* What a flow is, named where its packet enters (design §6: never read off another
 * field): its conntrack space (cb_ct_kind_of), whose NetworkPolicy applies, whether a
 * pod's own node is talking. */
enum cb_flow_kind {
	CB_FLOW_ENDPOINT = 0, /* an endpoint's flow: to an endpoint, the outside or an egress reply */
	CB_FLOW_HOST = 1,     /* a local endpoint's packet to this host's stack (fwd_host, fwd_dns) */
	CB_FLOW_NODEPORT = 2, /* a node port flow: a client from the wire balanced here, or one a
			       * peer host balanced to a local endpoint (the peer's address as
			       * its source); its state lives in CB_CT_KIND_NODEPORT */
};

/* cb_track describes the packet being checked to the stateful stage. */
struct cb_ct_entry; /* conntrack.h */

struct cb_track {
	__u32 zone;       /* tenant routing domain */
	__u16 src_epg;
	__u16 dst_epg;
	__u8 src_flags;   /* enum cb_epg_flags of src_epg / dst_epg */
	__u8 dst_flags;
	__u16 owner;      /* cb_ct_owner of the local endpoint the flow counts against (0: none) */
	__u8 frag;        /* enum cb_frag */
	__u8 svc;         /* forward packet of a service flow (already DNATed) */
	__u8 svc_reply;   /* reply of a service flow (to be un-NATed) */
	__u8 hairpin;     /* svc: the client is its own backend (source NATed to the VIP) */
	__be32 vip;       /* svc: VIP:port and the client's network, kept for replies */
	__be16 vport;
	__be16 ip_id;
	__u32 client_net;
	__be16 nodeport;  /* svc from outside through this host's node port (0: none) */
	__u8 kind;        /* enum cb_flow_kind */
	__u8 svc_icmp;    /* a client's ICMP error about a service's reply, already translated to
			   * its backend (cb_lb_icmp_client, which found the flow): tracked */
	__u8 local;       /* sent by a local endpoint (from its veth, its source checked): its
			   * FINs and RSTs are never blind (cb_ct_window) */
	const struct cb_flow *inner; /* ICMP error: the quoted packet (0: none) */
	struct cb_ct_entry *entry;   /* out: the flow's entry after the check (0: none) */
	struct cb_ct_entry *rev_nat; /* out: a DNAT entry this packet is the reply of */
};

/* cb_ct_kind_of is the conntrack space of t's flow (enum cb_ct_kind): CB_CT_KIND_NODEPORT
 * for CB_FLOW_NODEPORT, else CB_CT_KIND_TENANT. Branchless: a branch here splits the
 * verifier's paths at every key built from it (it took the node port judge from 86,000 to
 * 149,000 instructions). */
_Static_assert(CB_FLOW_NODEPORT == 2 && CB_FLOW_HOST == 1 && CB_FLOW_ENDPOINT == 0 && CB_CT_KIND_NODEPORT == 1,
	       "cb_ct_kind_of maps flow kinds to conntrack kinds by bit 1");
CB_INLINE __u8 cb_ct_kind_of(const struct cb_track *t)
{
	return (t->kind & CB_FLOW_NODEPORT) >> 1;
}

/* cb_judge_groups decides the flow of packet f by the endpoint groups' rules as a
 * connection opening (docs/conntrack.md "Verdicts": a TCP packet is judged as the SYN of
 * its connection), in the packet's own orientation or (reverse=1) in the other one, with
 * the groups and group states of t. 1 allows. */
static __noinline int cb_judge_groups(const struct cb_flow *f, const struct cb_track *t, int reverse)
{
	int eg = 0, in = 0;
	struct cb_flow g = *f;
	__u32 sflags = t->src_flags, dflags = t->dst_flags;
	__u16 src_epg = t->src_epg, dst_epg = t->dst_epg;

	if (reverse) {
		g.saddr = f->daddr;
		g.daddr = f->saddr;
		g.sport = f->dport;
		g.dport = f->sport;
		sflags = t->dst_flags;
		dflags = t->src_flags;
		src_epg = t->dst_epg;
		dst_epg = t->src_epg;
	}
	if ((sflags | dflags) & CB_EPG_DENY_ALL)
		return 0;
	if (g.proto == CB_PROTO_TCP)
		g.tcp_flags = CB_TCP_SYN;
	eg = (sflags & CB_EPG_RULES) && src_epg;
	in = (dflags & CB_EPG_RULES) && dst_epg;
	return cb_policy_allows(eg, in, &g, src_epg, dst_epg);
}

/* cb_judge decides a flow opening (see cb_judge_groups): 0 allowed, CB_DROP_POLICY (the
 * groups' rules) or CB_DROP_NETPOL (the NetworkPolicy layer, netpol.h; only when an
 * address of the flow has an entry). */
CB_INLINE int cb_judge(const struct cb_flow *f, const struct cb_track *t, int reverse)
{
	if (!cb_judge_groups(f, t, reverse))
		return CB_DROP_POLICY;
	if (((t->src_flags | t->dst_flags) & CB_EPG_NETPOL) && !cb_netpol_judge(f, t->zone, reverse))
		return CB_DROP_NETPOL;
	return 0;
}
