// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* ref_forward.c: the reference forwarder of `make bench` (tools/bench, prog stage).
 *
 * It does exactly what a minimal local forwarder must do and nothing else: one hash-map
 * lookup by destination IPv4 address, the destination MAC rewrite and bpf_redirect_peer.
 * No ethertype or header checks beyond the bounds check the verifier needs, no ARP, no
 * counters, no policy. prog.<path>_ratio figures divide a datapath path's time by this
 * program's time on the same packet. Never attached anywhere.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>

struct rf_dest {
	__u32 ifindex;
	__u8 mac[ETH_ALEN];
	__u8 pad[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32); /* destination IPv4 address, network byte order */
	__type(value, struct rf_dest);
} rf_dests SEC(".maps");

SEC("tc")
int rf_forward(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct rf_dest *d;
	__u32 dst;

	if ((void *)(ip + 1) > data_end)
		return TC_ACT_SHOT;
	dst = ip->daddr;
	d = bpf_map_lookup_elem(&rf_dests, &dst);
	if (!d)
		return TC_ACT_SHOT;
	__builtin_memcpy(eth->h_dest, d->mac, ETH_ALEN);
	return bpf_redirect_peer(d->ifindex, 0);
}

char __license[] SEC("license") = "Dual BSD/GPL";
