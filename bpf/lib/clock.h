/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* clock.h: the datapath's clock (conntrack deadlines, fragment records, budgets), which
 * the agent calibrates (pkg/dataplane/ebpf/clock.go). */
#pragma once

#include "common.h"

#define CB_NS 1000000000ULL

/* The conntrack clock's calibration (pkg/dataplane/ebpf/clock.go), set by the agent:
 * cb_now() = jiffies × cb_tick_ns + cb_clock_base, which equals CLOCK_MONOTONIC_COARSE
 * within a tick (the kernel advances jiffies from the monotonic clock, by the tick's
 * length). bpf_jiffies64 is a load (the JIT inlines it); bpf_ktime_get_coarse_ns is a call,
 * and a call with its return costs as much as a hash lookup on machines with
 * speculative-return mitigations. */
volatile __u64 cb_clock_base;
volatile __u32 cb_tick_ns;

/* cb_now is the conntrack clock: CLOCK_MONOTONIC at tick resolution, plenty for timeouts of
 * seconds (the agent's collector reads CLOCK_MONOTONIC_COARSE). Until the agent calibrated
 * it (cb_tick_ns 0), the coarse clock itself. */
CB_INLINE __u64 cb_now(void)
{
	__u32 tick = cb_tick_ns;

	if (tick)
		return bpf_jiffies64() * tick + cb_clock_base;
	return bpf_ktime_get_coarse_ns();
}
