/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* prefilter.h owns the operator's deny list of source prefixes (netctl prefilter, the
 * agent's cb_deny_src): IPv4 packets from the underlay whose source lies in one are
 * dropped where they enter, as drop_denied_source, by the XDP prefilter (cb_xdp_uplink)
 * and, when that is off, by cb_from_uplink on the same devices. CB_FEAT_DENY says the
 * list holds a prefix: an empty list costs one branch. */
#ifndef CB_PREFILTER_H
#define CB_PREFILTER_H

#include "common.h"
#include "maps.h"

#define CB_DENY_MAX 1024

struct cb_deny_key {
	__u32 prefixlen; /* 0-32 */
	__be32 addr;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, CB_DENY_MAX);
	__type(key, struct cb_deny_key);
	__type(value, __u32); /* unused (1) */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_deny_src SEC(".maps");

/* cb_denied says whether source saddr lies in a denied prefix. */
CB_INLINE int cb_denied(__be32 saddr)
{
	struct cb_deny_key k = {.prefixlen = 32, .addr = saddr};

	return (cb_features & CB_FEAT_DENY) && bpf_map_lookup_elem(&cb_deny_src, &k);
}

#endif /* CB_PREFILTER_H */
