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
