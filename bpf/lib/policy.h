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
 * (netpol.h). Non-first fragments carry no ports: they inherit the verdict of their
 * datagram's first fragment, recorded in cb_frags by (saddr, daddr, IP id, proto). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
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
 * field). Its conntrack state is keyed as before (a node port flow's in the node port twin
 * of its tenant's zone, zone ^ CB_ZONE_NODEPORT); everything else about the flow (whose
 * NetworkPolicy applies, whether a pod's own node is talking) comes from the kind. */
enum cb_flow_kind {
	CB_FLOW_ENDPOINT = 0, /* an endpoint's flow: to an endpoint, the outside or an egress reply */
	CB_FLOW_HOST = 1,     /* a local endpoint's packet to this host's stack (fwd_host, fwd_dns) */
	CB_FLOW_NODEPORT = 2, /* a node port flow: a client from the wire balanced here, or one a
			       * peer host balanced to a local endpoint (the peer's address as
			       * its source); t->zone is the tenant's node port twin */
};

/* cb_track describes the packet being checked to the stateful stage. */
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
	const struct cb_flow *inner; /* ICMP error: the quoted packet (0: none) */
	struct cb_ct_entry *entry;   /* out: the flow's entry after the check (0: none) */
	struct cb_ct_entry *rev_nat; /* out: a DNAT entry this packet is the reply of */
};

/* cb_netpol_zone is the zone t's pods are looked up in for NetworkPolicy: the tenant's,
 * also for a node port flow (whose state lives in the tenant's node port twin). */
CB_INLINE __u32 cb_netpol_zone(const struct cb_track *t)
{
	return t->kind == CB_FLOW_NODEPORT ? t->zone ^ CB_ZONE_NODEPORT : t->zone;
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
	if (((t->src_flags | t->dst_flags) & CB_EPG_NETPOL) && !cb_netpol_judge(f, cb_netpol_zone(t), reverse))
		return CB_DROP_NETPOL;
	return 0;
}

/* Fragment verdicts: the first fragment of a datagram records whether it passed; later
 * fragments (no L4 header) look it up. Like the kernel's reassembly timeout, a record is
 * good for CB_FRAG_TIMEOUT; the LRU evicts what is never completed. */
#define CB_FRAG_TIMEOUT (30ULL * 1000000000ULL)

struct cb_frag_key {
	__u32 zone;
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct cb_frag_entry {
	__u64 expires;  /* cb_now() deadline */
	__u32 allowed;  /* 1 allowed, 0 denied */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct cb_frag_key);
	__type(value, struct cb_frag_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_frags SEC(".maps");

/* Fragment records per tenant and per source: cb_frags and cb_nat_frags are LRUs shared by
 * every zone, so a zone that opened fragmented datagrams without end would evict every
 * other zone's records (their later fragments: drop_frag_no_first). A first fragment that
 * records takes a token of its source's budget (cb_frag_src_rate a second up to
 * CB_FRAG_SRC_BURST: one endpoint cannot spend its tenant's) and then one of its zone's
 * (cb_frag_rate a second up to CB_FRAG_BURST); without both it is dropped
 * (drop_frag_limit) before any state is written. At the zone's rate, evicting all 8,192
 * records of either table takes a zone 0.4 s; another zone's datagram needs its record for
 * the milliseconds between its fragments. */
#define CB_FRAG_BURST 4096
#define CB_FRAG_SRC_BURST 1024

/* The budgets' rates, tokens a second (tests set 0: no refill). */
volatile __u32 cb_frag_rate = 20000;
volatile __u32 cb_frag_src_rate = 5000;

struct cb_frag_budget {
	__u64 stamp;  /* cb_now() of the last refill */
	__u32 tokens;
	__u32 pad;
};

/* LRUs: zones and sources come and go, and a budget that was evicted (the least recently
 * fragmenting of 4,096 zones, 16,384 sources) starts again with a full burst, which it
 * would have had anyway after a second of quiet. Zones are the agent's, never a packet's
 * choice; a source is the packet's, within its zone's budget. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* zone */
	__type(value, struct cb_frag_budget);
} cb_frag_budgets SEC(".maps");

struct cb_frag_src_key {
	__u32 zone;
	__be32 saddr;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cb_frag_src_key);
	__type(value, struct cb_frag_budget);
} cb_frag_src_budgets SEC(".maps");

/* cb_budget_take takes a token of budget b (refilled at rate a second up to burst): 1 if
 * it had one. Concurrent packets may both refill or both take the last token: a budget is
 * approximate by a few tokens, never by a rate. */
CB_INLINE int cb_budget_take(struct cb_frag_budget *b, __u64 now, __u32 rate, __u32 burst)
{
	__u64 add;

	if (now > b->stamp && rate) {
		/* (A second refills any burst at any rate worth having; no overflow.) */
		add = now - b->stamp < CB_NS ? now - b->stamp : CB_NS;
		add = add * rate / CB_NS;
		if (add) {
			b->tokens = add >= burst - b->tokens ? burst : b->tokens + (__u32)add;
			b->stamp = now;
		}
	}
	if (!b->tokens)
		return 0;
	b->tokens--;
	return 1;
}

/* cb_frag_admit takes a token of the fragment budget of source saddr in zone, then one of
 * zone's: 1 if both had one (a budget seen for the first time starts full). A call of its
 * own: its locals stay off the full stages' frames. */
static __noinline int cb_frag_admit(__u32 zone, __be32 saddr)
{
	struct cb_frag_src_key sk = { .zone = zone, .saddr = saddr };
	struct cb_frag_budget *b, nb = {};
	__u64 now = cb_now();
	long r;

	nb.stamp = now;
	b = bpf_map_lookup_elem(&cb_frag_src_budgets, &sk);
	if (!b) {
		nb.tokens = CB_FRAG_SRC_BURST - 1;
		r = bpf_map_update_elem(&cb_frag_src_budgets, &sk, &nb, BPF_NOEXIST);
		if (r && r != -17) /* -EEXIST: another CPU made it first */
			return 0;
	} else if (!cb_budget_take(b, now, cb_frag_src_rate, CB_FRAG_SRC_BURST)) {
		return 0;
	}
	b = bpf_map_lookup_elem(&cb_frag_budgets, &zone);
	if (!b) {
		nb.tokens = CB_FRAG_BURST - 1;
		r = bpf_map_update_elem(&cb_frag_budgets, &zone, &nb, BPF_NOEXIST);
		return r == 0 || r == -17;
	}
	return cb_budget_take(b, now, cb_frag_rate, CB_FRAG_BURST);
}

/* cb_frag_key_of is a datagram's key under the addresses its fragments arrive with (before
 * service DNAT: the VIP; a balanced hairpin packet, f already from the VIP, came from the
 * client; a hairpin reply is still as it arrived, client → VIP). */
CB_INLINE void cb_frag_key_of(struct cb_frag_key *k, const struct cb_flow *f, const struct cb_track *t)
{
	k->zone = t->zone;
	k->saddr = t->hairpin && t->svc ? f->daddr : f->saddr;
	k->daddr = t->svc ? t->vip : f->daddr;
	k->id = t->ip_id;
	k->proto = f->proto;
}

/* cb_frag_record keeps the verdict of a first fragment for its later fragments. */
CB_INLINE void cb_frag_record(const struct cb_flow *f, const struct cb_track *t, __u32 allowed)
{
	struct cb_frag_key k = {};
	struct cb_frag_entry v = {.expires = cb_now() + CB_FRAG_TIMEOUT, .allowed = allowed};

	cb_frag_key_of(&k, f, t);
	bpf_map_update_elem(&cb_frags, &k, &v, BPF_ANY);
}

/* cb_frag_verdict returns 0 if the first fragment of f's datagram passed, else
 * CB_DROP_POLICY (it was dropped) or CB_DROP_FRAG_NO_FIRST (never seen, or too long ago). */
CB_INLINE int cb_frag_verdict(const struct cb_flow *f, const struct cb_track *t)
{
	struct cb_frag_key k = {};
	struct cb_frag_entry *v;

	cb_frag_key_of(&k, f, t);
	v = bpf_map_lookup_elem(&cb_frags, &k);

	if (!v || v->expires < cb_now())
		return CB_DROP_FRAG_NO_FIRST;
	return v->allowed ? 0 : CB_DROP_POLICY;
}

/* cb_ct_flow returns the live flow entry (policy-allowed) under k. */
CB_INLINE struct cb_ct_entry *cb_ct_flow(const struct cb_ct_key *k, __u64 now)
{
	struct cb_ct_entry *e = cb_ct_live(k, now);

	if (e && !(e->flags & CB_CT_ALLOWED))
		return 0;
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
	if (flags == e->flags && e->nat_ip == t->vip && e->nat_port == t->vport && e->nat_net == t->client_net &&
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
static __noinline void cb_ct_reuse(const struct cb_flow *f, __u32 zone)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;

	if (!f || !(cb_features & CB_FEAT_LB) || f->proto != CB_PROTO_TCP ||
	    (f->tcp_flags & (CB_TCP_SYN | CB_TCP_ACK)) != CB_TCP_SYN)
		return;
	cb_ct_key_of(&k, zone, f, 0);
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
	cb_ct_key_of(&k, t->zone, t->inner, 0);
	e = cb_ct_flow(&k, now);
	if (e) {
		/* (An error the service stage translated already is not un-NATed again.) */
		if ((e->flags & CB_CT_DNAT) && !t->svc_icmp)
			t->rev_nat = e;
		return 1;
	}
	cb_ct_key_of(&k, t->zone, t->inner, 1);
	return cb_ct_flow(&k, now) != 0;
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
	cb_ct_key_of(&k, t->zone, f, 0);
	e = cb_ct_flow(&k, now);
	if (syn) {
		/* A retransmitted SYN keeps its entry; a SYN that is not a service flow does not
		 * inherit a service flow's entry on the same tuple (cb_ct_reuse). */
		if (e && e->state == CB_CTS_NEW && (t->svc || !(e->flags & CB_CT_DNAT)) &&
		    cb_stamp_ok(e->epoch, cb_ct_need(t->src_epg, t->dst_epg, cb_netpol_zone(t)))) {
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
		/* A direct SYN on the tuple of a live service flow (cb_ct_reuse) passes but does
		 * not take the flow's entry over: the clash stays the client's own. */
		if (!t->svc && e && (e->flags & CB_CT_DNAT) && e->state != CB_CTS_CLOSING)
			return 0;
		was = e ? e->flags : 0;
		r = cb_ct_open_svc(&k, f, t, now);
		cb_ct_changed(was); /* (replaced) */
		return r;
	}
	if (!e) {
		cb_ct_key_of(&k, t->zone, f, 1);
		e = cb_ct_flow(&k, now);
		reply = 1;
	}
	if (e) {
		/* Judged again when a change its verdict depends on came after it (stamps.h). */
		if (!cb_stamp_ok(e->epoch, cb_ct_need(t->src_epg, t->dst_epg, cb_netpol_zone(t)))) {
			r = cb_judge(f, t, reply);
			if (r) {
				was = e->flags;
				bpf_map_delete_elem(&cb_ct, &k);
				cb_ct_changed(was);
				return r;
			}
			e->epoch = epoch;
		}
		if (closing && e->state != CB_CTS_CLOSING) {
			e->state = CB_CTS_CLOSING;
			cb_ct_changed(e->flags);
		} else if (!closing && reply && e->state == CB_CTS_NEW) {
			e->state = CB_CTS_ESTABLISHED;
			cb_ct_changed(e->flags);
		}
		cb_ct_refresh(e, now + cb_ct_timeout(f->proto, e->state));
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
	cb_ct_key_of(&k, t->zone, f, 0);
	return cb_ct_open_svc(&k, f, t, now);
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
		if (cb_kpod_of(cb_netpol_zone(t), f->saddr))
			t->src_flags |= CB_EPG_NETPOL;
		if (cb_kpod_of(cb_netpol_zone(t), f->daddr))
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
			cb_ct_reuse(f, t->zone);
		return 0;
	}
	/* Non-first fragments carry no L4 header: their first fragment's verdict decides. */
	if (t->frag == CB_FRAG_LATER)
		return cb_frag_verdict(f, t);
	/* A first fragment records (here, and a service flow's in cb_nat_frags): within its
	 * zone's budget only. */
	if (t->frag == CB_FRAG_FIRST && !cb_frag_admit(t->zone, f->saddr))
		return CB_DROP_FRAG_LIMIT;
	r = cb_ct_check(f, t);
	if (t->frag == CB_FRAG_FIRST)
		cb_frag_record(f, t, r == 0);
	return r;
}
