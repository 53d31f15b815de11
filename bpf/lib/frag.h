/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* frag.h: fragments and policy. Non-first fragments carry no ports: they inherit the
 * verdict of their datagram's first fragment, recorded in cb_frags by (zone, addresses,
 * IP id, proto), within per-zone and per-source budgets of records. (Service flows'
 * fragments follow their first fragment's backend: cb_nat_frags, lb.h.) */
#pragma once

#include "common.h"
#include "maps.h"
#include "parse.h"
#include "clock.h"
#include "policy.h"

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
	__u8 kind; /* enum cb_ct_kind (cb_nat_frags: CB_NATFRAG_NODEPORT_IN's zone has none) */
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
struct cb_frag_zone_key {
	__u32 zone;
	__u8 kind; /* enum cb_ct_kind: a tenant's node port clients spend a budget of their own */
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct cb_frag_zone_key);
	__type(value, struct cb_frag_budget);
} cb_frag_budgets SEC(".maps");

struct cb_frag_src_key {
	__u32 zone;
	__be32 saddr;
	__u8 kind;
	__u8 pad[3];
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

/* cb_frag_admit takes a token of the fragment budget of source saddr in zone's space kind,
 * then one of that space's: 1 if both had one (a budget seen for the first time starts
 * full). A call of its own: its locals stay off the full stages' frames. */
static __noinline int cb_frag_admit(__u32 zone, __u8 kind, __be32 saddr)
{
	struct cb_frag_src_key sk = { .zone = zone, .saddr = saddr, .kind = kind };
	struct cb_frag_zone_key zk = { .zone = zone, .kind = kind };
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
	b = bpf_map_lookup_elem(&cb_frag_budgets, &zk);
	if (!b) {
		nb.tokens = CB_FRAG_BURST - 1;
		r = bpf_map_update_elem(&cb_frag_budgets, &zk, &nb, BPF_NOEXIST);
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
	k->kind = cb_ct_kind_of(t);
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
