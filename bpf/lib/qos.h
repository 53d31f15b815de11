/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* qos.h: an endpoint's rate limits and DSCP mark (dataplane.QoS: its group's netprofile or
 * its pod's bandwidth annotations), docs/ebpf.md "Rate limits and DSCP".
 *
 * Each limited endpoint has one entry in cb_qos, at its counter slot, with a bucket per
 * direction: out (what the endpoint sends, policed by cb_from_container before anything
 * else looks at the packet) and in (what it receives, policed in cb_deliver_to, the one
 * place every local delivery passes). The interface entry (cb_iface.qos) and the endpoint
 * entry (cb_endpoint.flags CB_EP_QOS_IN) say which checks apply, so an endpoint without
 * QoS costs no lookup: the paths test a word they already read. A limited endpoint's
 * interface entry lives in the cb_ifaces hash, never in cb_iface_direct (ifaces.go):
 * the fast stage (cb_fast_stage), which reads only the array (and declines an entry with
 * a QoS word all the same), leaves its packets to the container stage, which polices
 * them, and the destination note (cb_dst_noted) never meets one.
 *
 * The bucket is GCRA (the virtual scheduling form of a token bucket): tat is the time the
 * bucket would be empty again at the configured rate; a packet conforms while tat runs
 * ahead of now by no more than tau, the burst's worth of time, and then moves tat on by its
 * cost (its length at the rate). Long-run throughput is the rate exactly; at once at most
 * burst bytes plus one packet pass beyond it (a GSO packet larger than the burst still
 * passes from a bucket that is not behind). A packet that does not conform is dropped
 * (policing) and counted as drop_rate_egress / drop_rate_ingress, and in its bucket
 * (dropped, dropped_bytes: per endpoint and direction). The clock is
 * bpf_ktime_get_ns, not the tick clock of cb_now: at 1 Gbit/s a 4 ms tick is 500 KB, more
 * than a small burst. Only limited endpoints pay it. */
#pragma once

#include "common.h"
#include "drop.h"

/* cb_iface.qos: which of the endpoint's QoS the datapath applies; its DSCP in bits 8-13. */
enum cb_qos_flags {
	CB_QOS_EGRESS = 1,  /* what it sends is policed (cb_qos[slot].out) */
	CB_QOS_INGRESS = 2, /* what it receives is policed (cb_qos[slot].in) */
	CB_QOS_DSCP = 4,    /* its IPv4 packets leave with the DSCP of bits 8-13 */
};

#define CB_QOS_DSCP_SHIFT 8

/* cb_qos_bucket.nsb's fixed point: nanoseconds per byte << CB_QOS_NSB_SHIFT. */
#define CB_QOS_NSB_SHIFT 16

struct cb_qos_bucket {
	__u64 tat; /* ns (bpf_ktime_get_ns): when the bucket is empty again */
	__u64 nsb; /* cost of a byte: ns << CB_QOS_NSB_SHIFT (0: unlimited) */
	__u64 tau; /* ns: how far tat may run ahead of now (the burst at the rate) */
	/* What the bucket dropped, counted under the lock it is judged under: the endpoint's
	 * own share of drop_rate_* (netctl bpf qos). Zeroed with the slot. */
	__u64 dropped;
	__u64 dropped_bytes;
};

struct cb_qos_entry {
	struct bpf_spin_lock lock;
	__u32 generation;
	struct cb_qos_bucket out;
	struct cb_qos_bucket in;
};

/* Indexed by counter slot (slots.go), sized with cb_ep_counters. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, __u32);
	__type(value, struct cb_qos_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_qos SEC(".maps");

/* cb_qos_police charges skb to the bucket of slot's endpoint in direction in (1: what it
 * receives, 0: what it sends). Returns 0 when the packet conforms, else its drop reason;
 * an endpoint marked limited without an entry is refused too (fail closed). Global: the
 * verifier checks it once, not at every delivery it is inlined into. */
__attribute__((noinline)) int cb_qos_police(struct __sk_buff *skb, __u32 slot, __u32 in)
{
	int reason = in ? CB_DROP_RATE_INGRESS : CB_DROP_RATE_EGRESS;
	struct cb_qos_bucket *b;
	struct cb_qos_entry *q;
	__u64 now, tat, cost;

	if (!skb)
		return reason;
	q = bpf_map_lookup_elem(&cb_qos, &slot);
	if (!q)
		return reason;
	now = bpf_ktime_get_ns();
	cost = ((__u64)skb->len * (in ? q->in.nsb : q->out.nsb)) >> CB_QOS_NSB_SHIFT;
	bpf_spin_lock(&q->lock);
	b = in ? &q->in : &q->out;
	if (!b->nsb) {
		bpf_spin_unlock(&q->lock);
		return 0;
	}
	tat = b->tat;
	if (tat < now)
		tat = now;
	if (tat - now > b->tau) {
		b->dropped++;
		b->dropped_bytes += skb->len;
		bpf_spin_unlock(&q->lock);
		return reason;
	}
	b->tat = tat + cost;
	bpf_spin_unlock(&q->lock);
	return 0;
}

/* cb_qos_out applies what ifc's QoS word qos asks of a packet its endpoint (counter slot
 * slot) sends: the egress bucket, then the DSCP of its IPv4 header (ECN bits kept, header
 * checksum fixed). Returns 0 or a drop reason. A header too short to mark is left alone
 * for the stages to judge. Packet pointers are invalid afterwards. */
__attribute__((noinline)) int cb_qos_out(struct __sk_buff *skb, __u32 slot, __u32 qos)
{
	__u8 vt[2], tos;
	int r;

	if (!skb)
		return CB_DROP_RATE_EGRESS;
	if (qos & CB_QOS_EGRESS) {
		r = cb_qos_police(skb, slot, 0);
		if (r)
			return r;
	}
	if (!(qos & CB_QOS_DSCP) || skb->len < ETH_HLEN + sizeof(struct iphdr) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN, vt, 2) < 0 || (vt[0] >> 4) != 4 || (vt[0] & 0xf) < 5)
		return 0;
	tos = (__u8)(((qos >> CB_QOS_DSCP_SHIFT) & 0x3f) << 2) | (vt[1] & 3);
	if (tos == vt[1])
		return 0;
	/* The checksum covers the 16-bit word {version/IHL, TOS}. */
	if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check),
				bpf_htons((__u16)vt[0] << 8 | vt[1]), bpf_htons((__u16)vt[0] << 8 | tos), 2) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos, 1, 0) < 0)
		return CB_DROP_NAT_ERR;
	return 0;
}
