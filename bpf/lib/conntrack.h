/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* conntrack.h: a minimal connection table (LRU) so that policy is evaluated once per flow
 * and replies of allowed flows pass, and so that service DNAT is applied consistently to
 * every packet of a connection and undone on its replies. Entries expire after a timeout
 * refreshed by traffic; there is no TCP state machine. */
#pragma once

#include "common.h"
#include "parse.h"

#define CB_CT_TIMEOUT_TCP (3600ULL * 1000000000ULL)
#define CB_CT_TIMEOUT_OTHER (60ULL * 1000000000ULL)

enum cb_ct_flags {
	CB_CT_ALLOWED = 1, /* policy allowed this flow (key = original direction) */
	CB_CT_SVC = 2,     /* key = client→VIP tuple; nat_* = the chosen backend */
	CB_CT_DNAT = 4,    /* key = client→backend tuple; nat_* = VIP:port to restore on replies */
};

struct cb_ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct cb_ct_entry {
	__u64 expires;   /* bpf_ktime_get_ns() deadline */
	__be32 nat_ip;
	__be16 nat_port;
	__u8 flags;      /* enum cb_ct_flags */
	__u8 pad;
	__u32 nat_net;   /* network key of nat_ip (backend's, or the client's for CB_CT_DNAT) */
	__u32 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4 * CB_DEFAULT_ENTRIES);
	__type(key, struct cb_ct_key);
	__type(value, struct cb_ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_ct SEC(".maps");

CB_INLINE void cb_ct_key_of(struct cb_ct_key *k, const struct cb_flow *f, int reverse)
{
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

CB_INLINE __u64 cb_ct_timeout(__u8 proto)
{
	return proto == CB_PROTO_TCP ? CB_CT_TIMEOUT_TCP : CB_CT_TIMEOUT_OTHER;
}

/* cb_ct_find returns a live entry for the tuple (or its reverse) carrying any of flags. */
CB_INLINE struct cb_ct_entry *cb_ct_find(const struct cb_flow *f, int reverse, __u8 flags)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;
	__u64 now;

	cb_ct_key_of(&k, f, reverse);
	e = bpf_map_lookup_elem(&cb_ct, &k);
	if (!e || !(e->flags & flags))
		return 0;
	now = bpf_ktime_get_ns();
	if (e->expires < now)
		return 0;
	e->expires = now + cb_ct_timeout(f->proto);
	return e;
}

/* cb_ct_add records flags for the tuple, merging with an existing entry (a DNATed flow's
 * client→backend entry is also the one policy marks allowed). */
CB_INLINE void cb_ct_add(const struct cb_flow *f, __u8 flags, __be32 nat_ip, __be16 nat_port, __u32 nat_net)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry e = {}, *cur;

	cb_ct_key_of(&k, f, 0);
	cur = bpf_map_lookup_elem(&cb_ct, &k);
	if (cur && cur->expires >= bpf_ktime_get_ns()) {
		if (flags & (CB_CT_SVC | CB_CT_DNAT)) {
			cur->nat_ip = nat_ip;
			cur->nat_port = nat_port;
			cur->nat_net = nat_net;
		}
		cur->flags |= flags;
		cur->expires = bpf_ktime_get_ns() + cb_ct_timeout(f->proto);
		return;
	}
	e.expires = bpf_ktime_get_ns() + cb_ct_timeout(f->proto);
	e.flags = flags;
	e.nat_ip = nat_ip;
	e.nat_port = nat_port;
	e.nat_net = nat_net;
	bpf_map_update_elem(&cb_ct, &k, &e, BPF_ANY);
}
