/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* common.h: includes, return codes and small helpers shared by every stage. */
#pragma once

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#define CB_INLINE static __always_inline

/* tcx: TC_ACT_OK ends the chain; CB_TCX_NEXT lets later programs run. */
#define CB_TCX_NEXT (-1)

#define CB_ETH_ALEN 6

/* cb_barrier_var stops the compiler from combining a pointer test with another one
 * (e.g. `!a && !b` into `(a | b) == 0`, which the verifier rejects). */
#define cb_barrier_var(x) asm volatile("" : "+r"(x))

CB_INLINE void cb_mac_copy(__u8 *dst, const __u8 *src)
{
	__builtin_memcpy(dst, src, CB_ETH_ALEN);
}

/* cb_mac_eq compares two MAC addresses (one 4-byte and one 2-byte load each: the
 * verifier allows unaligned packet and map-value loads on this architecture). */
CB_INLINE int cb_mac_eq(const __u8 *a, const __u8 *b)
{
	return (*(const __u32 *)a ^ *(const __u32 *)b) == 0 &&
	       (*(const __u16 *)(a + 4) ^ *(const __u16 *)(b + 4)) == 0;
}

/* cb_csum_fold folds a 32-bit one's complement sum to 16 bits and complements it (the
 * kernel's csum_fold). */
CB_INLINE __u16 cb_csum_fold(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* cb_csum_add adds b to the 32-bit one's complement sum a (the kernel's csum_add). */
CB_INLINE __u32 cb_csum_add(__u32 a, __u32 b)
{
	a += b;
	return a + (a < b);
}

/* The space a flow's state lives in, beside its tenant's zone (the kind of conntrack, NAT
 * and fragment keys): flows from outside through a node port live apart from the tenant's
 * own flows, so a client's spoofed source can never meet an entry of the tenant's
 * endpoints. Entries of builds before the field (which flipped the zone's top bit
 * instead) are converted when the maps migrate. */
enum cb_ct_kind {
	CB_CT_KIND_TENANT = 0,   /* an endpoint's own flow */
	CB_CT_KIND_NODEPORT = 1, /* a node port flow (from the wire, or balanced here by a peer host) */
};
