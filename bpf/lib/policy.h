/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* policy.h: endpoint-group policy. Each (EPG, direction) holds up to CB_MAX_RULES rules
 * sorted by effective priority (2*priority, +1 for deny so deny wins ties), highest first.
 * A flow is checked against the egress rules of its source EPG and the ingress rules of
 * its destination EPG; the highest-priority match of both decides; no match allows
 * (Contiv's default). Evaluated once per flow: conntrack passes later packets and replies.
 * Non-first fragments carry no ports: they inherit the verdict of their datagram's first
 * fragment, recorded in cb_frags by (saddr, daddr, IP id, proto). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"

#define CB_MAX_RULES 64

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

CB_INLINE struct cb_policy *cb_policy_of(__u16 epg, __u8 dir)
{
	struct cb_pol_key k = {.epg = epg, .dir = dir};

	if (!epg)
		return 0;
	return bpf_map_lookup_elem(&cb_policies, &k);
}

/* cb_rules_match returns the action of the first (= highest priority) matching rule of a
 * non-NULL pol and its priority, or CB_ACT_NONE. remote_* describe the other end of the
 * flow. A global function: the verifier checks its loop once, not at every call site. */
__noinline int cb_rules_match(const struct cb_policy *pol, const struct cb_flow *f,
			      __u32 remote_epg, __u32 remote_ip, __u16 *prio)
{
	__u32 i, n;

	if (!pol || !f || !prio)
		return CB_ACT_NONE;
	n = pol->count;
	for (i = 0; i < CB_MAX_RULES; i++) {
		const struct cb_rule *r;

		if (i >= n)
			break;
		r = &pol->rules[i];
		if (r->remote_epg && r->remote_epg != remote_epg)
			continue;
		if ((remote_ip & r->remote_mask) != r->remote_ip)
			continue;
		if (r->proto && r->proto != f->proto)
			continue;
		if (r->port && (!f->has_ports || r->port != f->dport))
			continue;
		if ((r->flags & CB_RULE_SYN_ONLY) &&
		    !(f->proto == CB_PROTO_TCP && (f->tcp_flags & CB_TCP_SYN) && !(f->tcp_flags & CB_TCP_ACK)))
			continue;
		*prio = r->prio;
		return r->action;
	}
	return CB_ACT_NONE;
}

/* cb_policy_allows decides a new flow from src_epg to dst_epg. */
CB_INLINE int cb_policy_allows(const struct cb_policy *eg, const struct cb_policy *in,
			       const struct cb_flow *f, __u16 src_epg, __u16 dst_epg)
{
	__u16 pe = 0, pi = 0;
	int ae = CB_ACT_NONE, ai = CB_ACT_NONE;

	if (eg)
		ae = cb_rules_match(eg, f, dst_epg, f->daddr, &pe);
	if (in)
		ai = cb_rules_match(in, f, src_epg, f->saddr, &pi);
	if (ae != CB_ACT_NONE && (ai == CB_ACT_NONE || pe >= pi))
		return ae != CB_ACT_DENY;
	if (ai != CB_ACT_NONE)
		return ai != CB_ACT_DENY;
	return 1;
}

/* Fragment verdicts: the first fragment of a datagram records whether policy allowed it;
 * later fragments (no L4 header) look it up. Like the kernel's reassembly timeout, a record
 * is good for CB_FRAG_TIMEOUT; the LRU evicts what is never completed. */
#define CB_FRAG_TIMEOUT (30ULL * 1000000000ULL)

struct cb_frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct cb_frag_entry {
	__u64 expires;  /* bpf_ktime_get_ns() deadline */
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

CB_INLINE void cb_frag_record(const struct cb_flow *f, __be16 id, __u32 allowed)
{
	struct cb_frag_key k = {.saddr = f->saddr, .daddr = f->daddr, .id = id, .proto = f->proto};
	struct cb_frag_entry v = {.expires = bpf_ktime_get_ns() + CB_FRAG_TIMEOUT, .allowed = allowed};

	bpf_map_update_elem(&cb_frags, &k, &v, BPF_ANY);
}

/* cb_frag_verdict returns 0 if the first fragment of f's datagram was allowed, else
 * CB_DROP_POLICY (denied) or CB_DROP_FRAG_NO_FIRST (never seen, or too long ago). */
CB_INLINE int cb_frag_verdict(const struct cb_flow *f, __be16 id)
{
	struct cb_frag_key k = {.saddr = f->saddr, .daddr = f->daddr, .id = id, .proto = f->proto};
	struct cb_frag_entry *v = bpf_map_lookup_elem(&cb_frags, &k);

	if (!v || v->expires < bpf_ktime_get_ns())
		return CB_DROP_FRAG_NO_FIRST;
	return v->allowed ? 0 : CB_DROP_POLICY;
}

/* cb_policy_check runs policy for a flow whose L4 identity is in f; frag and ip_id come
 * from the IPv4 header (struct cb_pkt). Returns 0 to continue or a drop reason. Flows
 * between groups without rules never touch conntrack or the fragment table. */
CB_INLINE int cb_policy_check(const struct cb_flow *f, __u8 frag, __be16 ip_id, __u16 src_epg, __u16 dst_epg)
{
	struct cb_policy *eg = cb_policy_of(src_epg, CB_DIR_EGRESS);
	struct cb_policy *in = cb_policy_of(dst_epg, CB_DIR_INGRESS);

	cb_barrier_var(eg);
	if (!eg) {
		cb_barrier_var(in);
		if (!in)
			return 0;
	}
	/* Non-first fragments carry no L4 header: their first fragment's verdict decides. */
	if (frag == CB_FRAG_LATER)
		return cb_frag_verdict(f, ip_id);
	if (cb_ct_find(f, 0, CB_CT_ALLOWED) || cb_ct_find(f, 1, CB_CT_ALLOWED)) {
		if (frag == CB_FRAG_FIRST)
			cb_frag_record(f, ip_id, 1);
		return 0;
	}
	if (!cb_policy_allows(eg, in, f, src_epg, dst_epg)) {
		if (frag == CB_FRAG_FIRST)
			cb_frag_record(f, ip_id, 0);
		return CB_DROP_POLICY;
	}
	cb_ct_add(f, CB_CT_ALLOWED, 0, 0, 0);
	if (frag == CB_FRAG_FIRST)
		cb_frag_record(f, ip_id, 1);
	return 0;
}
