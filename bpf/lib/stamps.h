/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* stamps.h: policy epochs per group and per zone (docs/conntrack.md "Policy epochs").
 *
 * The agent keeps one change counter, the policy clock (cb_policy_epoch, mirrored in
 * cb_config.policy_epoch, pinned: it never goes back). Every change that can alter a
 * verdict takes the next value and stamps what it touches with it: a group's rule set
 * (installed, replaced, failed closed, deleted) and an endpoint entering or leaving a group
 * stamp the group (cb_epgs[g].changed); a NetworkPolicy change (a pod's entry, a rule set)
 * and an endpoint entering or leaving "no group" (0) stamp the zone (cb_zone_stamps). A
 * conntrack entry records in its epoch the clock as it was when the packet that judged it
 * arrived (cb_clock_start); it is judged again when a stamp its verdict depends on is
 * newer: its source group's, its destination group's, and its zone's when a side has no
 * group or NetworkPolicy is on (cb_ct_need). A change in one tenant's groups costs the
 * flows of other groups nothing.
 *
 * Ordering (the agent, driver stamps.go, writes one map element per syscall; this side
 * reads): a change first writes its stamps, then the state it announces (rules, group
 * flags, an endpoint's group, a pod's entry), then publishes the clock. A packet reads the
 * clock first (cb_clock_start, as it arrives), then that state, and records the clock. So:
 *   - an entry recorded at clock c >= s (s: the stamp of some change) was judged by a packet
 *     that read the clock after s was published, i.e. after all that change's writes: it
 *     saw them (loads are not reordered with loads on x86, as for the service memo);
 *   - a packet that reads any of a change's new state reads its stamp after that (the
 *     fast paths read an entry's groups before their stamps): from then on no stale entry
 *     of the flows it touches passes the fast path or the full stage unjudged;
 *   - between the stamp and the clock an entry judged again records the older clock and is
 *     judged once more after: never a verdict trusted under rules it did not see.
 * Stamps and the clock are compared as serial numbers (RFC 1982): an entry is current when
 * its epoch is not before the stamp; 2^31 changes would have to pass between an entry's
 * verdict and its next packet for a comparison to turn. */
#pragma once

#include "common.h"
#include "maps.h"

/* Per-group state: whether a group has rules (its flows are tracked), whether its rule
 * set could not be installed (fail closed: every new flow from or to it is denied), and
 * the stamp of its last change. Group 0 ("no group") has no entry in use: its changes
 * stamp the zone. */
enum cb_epg_flags {
	CB_EPG_RULES = 1,
	CB_EPG_DENY_ALL = 2,
	CB_EPG_NETPOL = 4, /* cb_track only: the address has a NetworkPolicy entry (netpol.h) */
};

struct cb_epg_state {
	__u32 flags;      /* enum cb_epg_flags */
	__u32 generation;
	__u32 changed;    /* policy clock of the last change that can alter a verdict involving
			   * the group (its rules, DENY_ALL, an endpoint entering or leaving it) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32); /* endpoint group id */
	__type(value, struct cb_epg_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_epgs SEC(".maps");

/* Zones' stamps: NetworkPolicy changes of the zone and endpoints of the zone entering or
 * leaving "no group". Zones are 32-bit hashes: zones CB_ZONE_STAMP_SLOTS apart share a slot,
 * so a change in one has the other's flows that read the slot judged again (never skipped). */
#define CB_ZONE_STAMP_SLOTS 65536 /* a power of two; the agent's zoneStampSlots */

struct cb_zone_stamp {
	__u32 changed;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_ZONE_STAMP_SLOTS);
	__type(key, __u32); /* zone mod CB_ZONE_STAMP_SLOTS */
	__type(value, struct cb_zone_stamp);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_zone_stamps SEC(".maps");

/* cb_policy_epoch is the policy clock, mirrored from cb_config.policy_epoch (the agent sets
 * it with the config, after a change's other writes). In a section (map) of its own: every
 * change writes it, and in .bss it shared a cache line with globals every packet reads
 * (cb_features), so each change cost the next packet on every CPU a cache miss (the fast
 * paths never read it; the full stage does, in cb_clock_start). */
volatile __u32 cb_policy_epoch SEC(".data.policy_clock") = 0;

/* cb_stamp_ok says whether an entry recorded at clock epoch is current against stamp need. */
CB_INLINE int cb_stamp_ok(__u32 epoch, __u32 need)
{
	return (__s32)(epoch - need) >= 0;
}

/* cb_stamp_later is the later of two stamps. */
CB_INLINE __u32 cb_stamp_later(__u32 a, __u32 b)
{
	return (__s32)(a - b) >= 0 ? a : b;
}

/* cb_zone_changed is zone's stamp. */
CB_INLINE __u32 cb_zone_changed(__u32 zone)
{
	__u32 k = zone & (CB_ZONE_STAMP_SLOTS - 1);
	struct cb_zone_stamp *s = bpf_map_lookup_elem(&cb_zone_stamps, &k);

	return s ? s->changed : 0;
}

/* cb_epg_track returns the tracking bits (enum cb_epg_flags) of a flow between groups src
 * and dst of zone and sets *need to the stamp its entry must have reached: both groups'
 * stamps, and the zone's when a side has no group or NetworkPolicy is on. The groups must
 * have been read before (the stamps are read after them). */
CB_INLINE __u32 cb_epg_track(__u16 src, __u16 dst, __u32 zone, __u32 *need)
{
	struct cb_epg_state *s;
	__u32 k, flags = 0, n = 0, z = 0;

	if (src) {
		k = src;
		s = bpf_map_lookup_elem(&cb_epgs, &k);
		if (s) {
			flags = s->flags;
			n = s->changed;
		}
	} else {
		z = 1;
	}
	if (dst) {
		k = dst;
		s = bpf_map_lookup_elem(&cb_epgs, &k);
		if (s) {
			flags |= s->flags;
			n = cb_stamp_later(n, s->changed);
		}
	} else {
		z = 1;
	}
	if (z || (cb_features & CB_FEAT_NETPOL))
		n = cb_stamp_later(n, cb_zone_changed(zone));
	*need = n;
	return flags;
}

/* cb_ct_need is the stamp an entry of a flow between groups src and dst of zone (the
 * NetworkPolicy zone: a node port flow's tenant's) must have reached to be trusted without
 * judging it again. A global function: verified once, and its frame is not on the full
 * stage's (scalars only: a pointer into the caller's frame would cost its spilled
 * pointers). */
__noinline __u32 cb_ct_need(__u32 src, __u32 dst, __u32 zone)
{
	__u32 need = 0;

	cb_epg_track((__u16)src, (__u16)dst, zone, &need);
	return need;
}
