/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb.h: service load balancing on the client's host. The first packet of a flow to
 * VIP:port/proto picks a backend by flow hash and records two conntrack entries: the
 * client→VIP tuple (which backend) and the client→backend tuple (which VIP to restore on
 * replies). Later packets follow the first entry; replies are rewritten back to VIP:port
 * wherever they reach the client's host (local backend or overlay). */
#pragma once

#include "common.h"
#include "drop.h"
#include "maps.h"
#include "parse.h"
#include "conntrack.h"
#include "policy.h"
#include "rewrite.h"

struct cb_svc_key {
	__u32 zone;    /* the service's tenant routing domain */
	__be32 vip;
	__be16 port;   /* network order */
	__u8 proto;
	__u8 pad;
};

enum cb_svc_flags {
	CB_SVC_AFFINITY = 1, /* sessionAffinity ClientIP: the client address picks the backend */
};

struct cb_svc {
	__u32 id;          /* index space of cb_backends */
	__u32 count;       /* number of backends taking new flows, 0 = drop */
	__be16 target_port;
	__u16 flags;       /* enum cb_svc_flags */
	__u32 generation;
};

struct cb_backend_key {
	__u32 svc_id;
	__u32 index;
};

struct cb_backend {
	__be32 ip;
	__u32 net;         /* network key of the backend endpoint */
	__u32 generation;
};

/* Backend membership (re-validates the backend a conntrack entry chose). */
struct cb_member_key {
	__u32 svc_id;
	__be32 ip;
};

struct cb_member {
	__u32 net;
	__u32 generation;
};

struct cb_vip_key {
	__u32 zone;
	__be32 vip;
};

struct cb_vip {
	__u32 generation;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_svc_key);
	__type(value, struct cb_svc);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_backend_key);
	__type(value, struct cb_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_member_key);
	__type(value, struct cb_member);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CB_DEFAULT_ENTRIES);
	__type(key, struct cb_vip_key);
	__type(value, struct cb_vip);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_vips SEC(".maps");

/* Backend revisions: cb_svc_revs[svc_id mod CB_SVC_REV_SLOTS] changes whenever a backend
 * leaves service svc_id (the agent bumps it after deleting the membership, and whenever it
 * writes the service). A client→VIP entry records in its epoch the revision read before its
 * backend was last found a member (cb_lb_forward): while the two are equal the backend
 * still is one, and cb_svc_fast needs no membership lookup. Ids only grow (the agent never
 * reuses one), so ids a multiple of CB_SVC_REV_SLOTS apart share a slot: a bump for either
 * makes the other's entries look again, never skip a look. 0 (an entry whose backend was
 * just chosen, a slot never bumped): the full stage checks. */
#define CB_SVC_REV_SLOTS 65536 /* a power of two; the agent's svcRevSlots */

struct cb_svc_rev {
	__u32 rev;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CB_SVC_REV_SLOTS);
	__type(key, __u32); /* service id mod CB_SVC_REV_SLOTS */
	__type(value, struct cb_svc_rev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_svc_revs SEC(".maps");

CB_INLINE __u32 cb_svc_rev_of(__u32 id)
{
	__u32 slot = id & (CB_SVC_REV_SLOTS - 1);
	struct cb_svc_rev *r = bpf_map_lookup_elem(&cb_svc_revs, &slot);

	return r ? r->rev : 0;
}

/* cb_svc_memo_off, set by the agent, turns off both shortcuts that trust an earlier read
 * instead of a membership lookup: the service fast path's memo (cb_svc_fast) and the
 * revision rule of cb_lb_member. Their soundness rests on loads not passing loads (x86);
 * on other machines the agent sets it and every service packet looks its backend's
 * membership up. */
volatile __u32 cb_svc_memo_off;

/* cb_lb_member says whether backend ip, which the client→VIP entry svc names, is still a
 * member of svc's service, whose revision (read before this: a removal bumps it after)
 * is rev: without a lookup while rev is the one the entry recorded when it last found it
 * a member (cb_lb_forward; its epoch, no memo's stamp in its place) and the shortcuts
 * are on (cb_svc_memo_off); otherwise by its membership (cb_members). The one
 * membership rule of the full stage (cb_lb_forward) and the fast path (cb_svc_fast). */
CB_INLINE int cb_lb_member(const struct cb_ct_entry *svc, __be32 ip, __u32 rev)
{
	struct cb_member_key mk = {};

	if (rev && !cb_svc_memo_off && svc->epoch == rev && !(svc->state & CB_CT_MEMO))
		return 1;
	mk.svc_id = svc->svc_id;
	mk.ip = ip;
	return bpf_map_lookup_elem(&cb_members, &mk) != 0;
}

/* cb_svc_memo_stamp is the stamp of a memo (CB_CT_MEMO) taken now, for a client→VIP entry
 * whose backend is a member at revision rev, of its flow's own entry, which must have
 * reached policy stamp need (cb_epg_track of the client's and the backend's groups): the
 * revision, need and the memo generation (cb_ct_gens) summed. Each only grows (a group
 * change stamps the new group with the newest clock, so need grows with it too), so any
 * change moves the sum (it would take 2^32 changes within one tick to come back). 0 (no
 * memo) when rev is. */
CB_INLINE __u32 cb_svc_memo_stamp(__u32 rev, __u32 need)
{
	return rev ? rev + need + cb_ct_gen_now() : 0;
}

CB_INLINE int cb_is_vip(__u32 zone, __be32 ip)
{
	struct cb_vip_key k = {.zone = zone, .vip = ip};

	return bpf_map_lookup_elem(&cb_vips, &k) != 0;
}

/* cb_lb_choice is a service flow's backend, decided by cb_lb_forward and committed to
 * conntrack by cb_lb_commit once policy allowed the flow. */
struct cb_lb_choice {
	struct cb_ct_entry *svc_ct; /* the client→VIP entry, if it exists */
	__be32 ip;
	__be16 port;
	__u8 commit;                /* 1: write (or rewrite) the client→VIP entry */
	__u8 frag_snat;             /* a later fragment of a reply: source back to ip */
	__u32 net;
	__u32 svc_id;
};

/* Fragments of service flows. A later fragment carries no ports: the first fragment of a
 * balanced datagram records where its later fragments go (their destination becomes the
 * backend), and the first fragment of a reply records the VIP its later fragments come
 * from; both by (zone, addresses as they arrive, IP id, proto), for CB_FRAG_TIMEOUT. A
 * hairpin datagram, either way, arrives from the client to the VIP and leaves from the VIP
 * to the client: its first fragment records that both addresses of its later ones swap. */
enum cb_natfrag_dir {
	CB_NATFRAG_DST = 1,
	CB_NATFRAG_SRC = 2,
	CB_NATFRAG_HAIRPIN = 3,
};

struct cb_natfrag {
	__u64 expires;
	__be32 addr;  /* backend (DST), VIP (SRC), or the client (HAIRPIN) */
	__u32 net;    /* network key of the packet's destination after the rewrite */
	__u32 dir;    /* enum cb_natfrag_dir */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct cb_frag_key);
	__type(value, struct cb_natfrag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cb_nat_frags SEC(".maps");

/* cb_natfrag_record: later fragments of datagram (k's zone, addresses, id, proto) get their
 * destination (dir DST) or source (SRC) rewritten to addr. */
CB_INLINE void cb_natfrag_record(const struct cb_frag_key *k, __u32 dir, __be32 addr, __u32 net)
{
	struct cb_natfrag v = {.expires = cb_now() + CB_FRAG_TIMEOUT, .addr = addr, .net = net, .dir = dir};

	bpf_map_update_elem(&cb_nat_frags, k, &v, BPF_ANY);
}

/* cb_lb_frag handles a later fragment (no ports) while services exist: one of a balanced
 * datagram is DNATed to its backend now (t->svc, c->net), one of a hairpin datagram (either
 * way) goes from the VIP back to the client now (t->svc, t->hairpin), one of a reply is
 * marked for its source to go back to the VIP after policy (t->svc_reply, c->frag_snat,
 * c->ip, c->net); any other to a VIP is dropped. DST and HAIRPIN records apply only to a
 * local client's fragments (t->client_net set), a HAIRPIN one only in the client's own
 * network. Returns 0 or a reason. */
static __noinline int cb_lb_frag(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				 struct cb_track *t, struct cb_lb_choice *c)
{
	struct cb_frag_key k = {};
	struct cb_natfrag *n;
	int r;

	cb_frag_key_of(&k, f, t);
	n = bpf_map_lookup_elem(&cb_nat_frags, &k);
	if (n && n->expires >= cb_now()) {
		if (n->dir == CB_NATFRAG_DST && t->client_net) {
			t->svc = 1;
			t->vip = f->daddr;
			c->net = n->net;
			return cb_nat(skb, p, f, 1, n->addr, 0);
		}
		if (n->dir == CB_NATFRAG_HAIRPIN && t->client_net && t->client_net == n->net &&
		    n->addr == f->saddr) {
			t->svc = 1;
			t->hairpin = 1;
			t->vip = f->daddr;
			c->net = n->net;
			r = cb_nat(skb, p, f, 1, n->addr, 0);
			if (!r)
				r = cb_nat(skb, p, f, 0, t->vip, 0);
			return r;
		}
		if (n->dir == CB_NATFRAG_SRC) {
			t->svc_reply = 1;
			c->frag_snat = 1;
			c->ip = n->addr;
			c->net = n->net;
			return 0;
		}
	}
	if (t->client_net && cb_is_vip(t->zone, f->daddr))
		return CB_DROP_FRAG_TO_SERVICE;
	return 0;
}

/* cb_lb_finish runs after policy passed a packet: the source of a reply's later fragment
 * goes back to the VIP, and a reply's first fragment records that for its later ones (a
 * hairpin reply's: that they go from the VIP to the client). Inlined: on most packets it
 * does nothing, and a call would cost more (cb_track_flags). */
CB_INLINE int cb_lb_finish(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				   const struct cb_track *t, const struct cb_lb_choice *c)
{
	struct cb_frag_key fk = {};

	if (c->frag_snat)
		return cb_nat(skb, p, f, 0, c->ip, 0);
	if (t->rev_nat && p->frag == CB_FRAG_FIRST && !t->inner) {
		cb_frag_key_of(&fk, f, t);
		if (t->rev_nat->flags & CB_CT_HAIRPIN)
			cb_natfrag_record(&fk, CB_NATFRAG_HAIRPIN, f->saddr, t->rev_nat->nat_net);
		else
			cb_natfrag_record(&fk, CB_NATFRAG_SRC, t->rev_nat->nat_ip, t->rev_nat->nat_net);
	}
	return 0;
}

/* cb_lb_key is the client→VIP key of a service flow whose packet (already DNATed or not)
 * is f: the VIP:port come from t. */
CB_INLINE void cb_lb_key(struct cb_ct_key *k, const struct cb_flow *f, const struct cb_track *t)
{
	k->zone = t->zone;
	k->kind = cb_ct_kind_of(t);
	k->saddr = t->hairpin ? f->daddr : f->saddr; /* hairpin: the client is the backend */
	k->daddr = t->vip;
	k->sport = f->sport;
	k->dport = t->vport;
	k->proto = f->proto;
}

/* cb_lb_seed keys the flow hash of cb_lb_pick: random, set by the agent at load, so a
 * client cannot choose its backend by choosing its ports. */
volatile __u32 cb_lb_seed;

CB_INLINE __u32 cb_rotl32(__u32 x, int r)
{
	return (x << r) | (x >> (32 - r));
}

CB_INLINE __u32 cb_mix32(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = cb_rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = cb_rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

/* cb_flow_hash is MurmurHash3 (x86_32) of the 5-tuple's three words, as they lie in the
 * packet, seeded with cb_lb_seed ^ proto (pkg/dataplane/ebpf/service.go: flowHash).
 * Not the kernel's skb hash: that one leaves the ports out of a fragment's, so every
 * fragmented flow between two addresses would go to one backend. */
CB_INLINE __u32 cb_flow_hash(const struct cb_flow *f)
{
	__u32 h = cb_lb_seed ^ f->proto;

	h = cb_mix32(h, f->saddr);
	h = cb_mix32(h, f->daddr);
	h = cb_mix32(h, (__u32)f->sport | (__u32)f->dport << 16);
	h ^= 12;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* cb_lb_pick chooses a backend of svc for flow f: by its 5-tuple's hash, or with
 * session affinity by the client's address alone. */
CB_INLINE int cb_lb_pick(const struct cb_flow *f, const struct cb_svc *svc, struct cb_lb_choice *c)
{
	struct cb_backend_key bk = {};
	struct cb_backend *be;
	__u32 h;

	if (!svc->count)
		return CB_DROP_NO_BACKEND;
	bk.svc_id = svc->id;
	if (svc->flags & CB_SVC_AFFINITY) {
		h = bpf_ntohl(f->saddr) * 2654435761U; /* Knuth's multiplicative hash */
		h ^= h >> 16;
	} else {
		h = cb_flow_hash(f);
	}
	bk.index = h % svc->count;
	be = bpf_map_lookup_elem(&cb_backends, &bk);
	if (!be)
		return CB_DROP_NO_BACKEND;
	c->ip = be->ip;
	c->port = svc->target_port;
	c->net = be->net;
	c->svc_id = svc->id;
	c->commit = 1;
	return 0;
}

/* cb_lb_forward applies service DNAT to a packet from a local client of zone t->zone, whose
 * network key the caller put in t->client_net; c->net is then the backend's network. The backend a live client→VIP
 * entry remembers is used while it is still a member of the service; otherwise the flow
 * is re-balanced on this packet. Returns 0 or a drop reason; sets t->svc for service
 * flows. */
static __noinline int cb_lb_forward(struct __sk_buff *skb, const struct cb_pkt *p, struct cb_flow *f,
				    struct cb_track *t, struct cb_lb_choice *c)
{
	struct cb_svc_key sk = {};
	struct cb_ct_key key = {};
	struct cb_ct_entry *ct;
	struct cb_svc *svc;
	__be32 client, ip;
	__u32 rev;
	int r;

	if (f->proto != CB_PROTO_TCP && f->proto != CB_PROTO_UDP)
		return 0;
	if (!f->has_ports)
		return 0; /* later fragments: cb_lb_frag */
	sk.zone = t->zone;
	sk.vip = f->daddr;
	sk.port = f->dport;
	sk.proto = f->proto;
	cb_ct_key_of(&key, t->zone, cb_ct_kind_of(t), f, 0);
	ct = cb_ct_live(&key, cb_now());
	if (ct && !(ct->flags & CB_CT_SVC))
		ct = 0;
	c->svc_ct = ct;
	if (ct) {
		/* An established service flow: its entry names the backend, re-validated on
		 * every packet (cb_lb_member: by revision or membership); the service itself is
		 * looked up only when the backend is gone (to re-balance, or to notice it gone). */
		ip = ct->nat_ip;
		rev = cb_svc_rev_of(ct->svc_id); /* before the membership: a removal bumps it after */
		if (cb_lb_member(ct, ip, rev)) {
			/* Checked at this revision (an entry whose flow policy then denies keeps
			 * it: the check holds all the same). */
			if ((ct->epoch != rev || ct->state != CB_CTS_NEW) && ct->nat_ip == ip) {
				ct->epoch = rev;
				ct->state = CB_CTS_NEW; /* (a memo's stamp no more) */
			}
			c->ip = ct->nat_ip;
			c->port = ct->nat_port;
			c->net = ct->nat_net;
			c->svc_id = ct->svc_id;
		} else if (!(svc = bpf_map_lookup_elem(&cb_services, &sk))) {
			/* The service is gone: the flow is no longer a service flow. */
			bpf_map_delete_elem(&cb_ct, &key);
			c->svc_ct = 0;
			return 0;
		} else if ((r = cb_lb_pick(f, svc, c))) {
			return r;
		}
	} else {
		svc = bpf_map_lookup_elem(&cb_services, &sk);
		if (!svc)
			return 0;
		if ((r = cb_lb_pick(f, svc, c)))
			return r;
	}
	t->svc = 1;
	t->vip = f->daddr;
	t->vport = f->dport;
	client = f->saddr;
	r = cb_nat(skb, p, f, 1, c->ip, c->port);
	if (r || c->ip != client || c->net != t->client_net)
		return r;
	/* Hairpin: the client is its own backend. Its packet would arrive from its own
	 * address (a martian); it comes from the VIP instead, and replies go back through the
	 * VIP's entry. */
	t->hairpin = 1;
	return cb_nat(skb, p, f, 0, t->vip, f->sport);
}

/* cb_lb_follow gives client→VIP entry svc the deadline of its flow's entry (expires),
 * written only when it moves (the entry's line stays clean between ticks): cb_lb_commit's
 * and the fast path's (cb_svc_fast). */
CB_INLINE void cb_lb_follow(struct cb_ct_entry *svc, __u64 expires)
{
	if (svc->expires != expires)
		svc->expires = expires;
}

/* cb_lb_unnat makes a service flow's reply (from saddr:sport; ports: whether the packet
 * has them) leave from the VIP:port its client sent to, which the flow's entry rev holds
 * (cb_ct_dnat_flow): the one reply rewrite of the full stage and the fast path. */
CB_INLINE int cb_lb_unnat(struct __sk_buff *skb, __u32 l4_off, __u8 proto, int ports, __be32 saddr, __be16 sport,
			  const struct cb_ct_entry *rev)
{
	return cb_nat_rewrite(skb, l4_off, proto, ports, 0, saddr, rev->nat_ip, sport, rev->nat_port);
}

/* cb_lb_commit records (or refreshes) the client→VIP entry after policy passed the flow;
 * it lives as long as the flow's entry. Returns 0 or CB_DROP_CT_FULL. */
static __noinline int cb_lb_commit(const struct cb_lb_choice *c, const struct cb_pkt *p, const struct cb_flow *f,
				   const struct cb_track *t)
{
	struct cb_ct_entry e = {};
	struct cb_ct_entry *cur = c->svc_ct;
	struct cb_ct_key key = {};
	struct cb_frag_key fk = {};
	__u8 was;

	if (!t->entry) {
		/* passed without a flow entry (e.g. a RST): nothing to remember */
	} else if (cur && !c->commit) {
		cb_lb_follow(cur, t->entry->expires);
	} else if (cur) {
		cur->nat_ip = c->ip;
		cur->nat_port = c->port;
		cur->nat_net = c->net;
		cur->svc_id = c->svc_id;
		cur->epoch = 0; /* a new backend: its membership looked up on the next packet */
		cur->state = CB_CTS_NEW; /* (no memo) */
		cur->expires = t->entry->expires;
		/* A memo another CPU writes meanwhile, of the old backend's flow, is stale. */
		cb_ct_changed(CB_CT_DNAT);
	} else {
		e.flags = CB_CT_SVC;
		e.state = CB_CTS_NEW;
		e.nat_ip = c->ip;
		e.nat_port = c->port;
		e.nat_net = c->net;
		e.svc_id = c->svc_id;
		e.expires = t->entry->expires; /* epoch 0: the next packet checks the backend */
		/* Counts against the flow's owner, never refused by its quota: the flow's own
		 * entry was admitted. */
		e.owner = t->owner;
		cb_lb_key(&key, f, t);
		/* It may replace a service flow's entry: one whose backend is this VIP's address
		 * (a service on an endpoint's address and port). */
		cur = bpf_map_lookup_elem(&cb_ct, &key);
		was = cur ? cur->flags : 0;
		if (cb_ct_insert(&key, &e, 0))
			return CB_DROP_CT_FULL;
		cb_ct_changed(was);
		cb_ct_shadow(&key);
	}
	if (p->frag == CB_FRAG_FIRST) {
		/* Later fragments of this datagram go to the same backend (a hairpin's: also from
		 * the VIP). */
		cb_frag_key_of(&fk, f, t);
		cb_natfrag_record(&fk, t->hairpin ? CB_NATFRAG_HAIRPIN : CB_NATFRAG_DST, f->daddr, c->net);
	}
	return 0;
}

/* cb_lb_reply finds the service flow a packet is the reply of (before the destination
 * lookup, which needs the client's network); the VIP is restored after policy. An ICMP
 * error about a packet the client sent to a backend (inner = client→backend) belongs to
 * that flow too; a TCP SYN without ACK never does. */
CB_INLINE struct cb_ct_entry *cb_lb_reply(const struct cb_pkt *p, const struct cb_flow *f, __u32 zone, __u8 kind)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *e;

	if (f->proto == CB_PROTO_ICMP && p->inner.proto) {
		if (f->saddr != p->inner.daddr || f->daddr != p->inner.saddr)
			return 0; /* not from the quoted packet's destination to its sender */
		cb_ct_key_of(&k, zone, kind, &p->inner, 0);
	} else if (f->has_ports) {
		/* A SYN without ACK opens a flow of its own: taken for a service flow's reply
		 * (a hairpin's: to the VIP), it would pass unjudged and unbalanced, and its entry
		 * would hide the flow's replies from it. */
		if (cb_tcp_opens(f))
			return 0;
		cb_ct_key_of(&k, zone, kind, f, 1);
	} else {
		return 0;
	}
	e = cb_ct_live(&k, cb_now());
	if (!e || !cb_ct_dnat_flow(e))
		return 0;
	return e;
}

/* cb_lb_icmp_client says whether an ICMP error a local client (network t->client_net)
 * sends is about a reply it received from a service: quoting VIP:port → client:cport, sent
 * to the VIP. It is when the client→VIP entry is live and the flow's own entry
 * (client:cport → backend:bport; a hairpin's VIP:cport → client:target) is live, allowed
 * and restores that VIP:port: then t->svc_icmp (t->hairpin) is set and c holds the
 * backend:bport and its network for cb_nat_icmp_client. (Lookups only: the rewrite runs in
 * a frame of its own, the stack is short.) */
static __noinline int cb_lb_icmp_client(const struct cb_pkt *p, const struct cb_flow *f, struct cb_track *t,
					struct cb_lb_choice *c)
{
	struct cb_ct_key k = {};
	struct cb_ct_entry *svc, *flow;
	__u64 now = cb_now();
	int hairpin;

	if (!p || !f || !t || !c || p->frag != CB_FRAG_NONE || !p->inner.has_ports ||
	    f->saddr != p->inner.daddr || f->daddr != p->inner.saddr)
		return 0;
	k.zone = t->zone;
	k.kind = cb_ct_kind_of(t);
	k.saddr = f->saddr;
	k.daddr = f->daddr;
	k.sport = p->inner.dport;
	k.dport = p->inner.sport;
	k.proto = p->inner.proto;
	svc = cb_ct_live(&k, now);
	if (!svc || !(svc->flags & CB_CT_SVC))
		return 0;
	c->ip = svc->nat_ip;
	c->port = svc->nat_port;
	c->net = svc->nat_net;
	hairpin = c->ip == f->saddr && c->net == t->client_net;
	if (hairpin)
		k.saddr = f->daddr;
	k.daddr = c->ip;
	k.dport = c->port;
	flow = cb_ct_flow(&k, now);
	if (!flow || !(flow->flags & CB_CT_DNAT) || !(flow->flags & CB_CT_HAIRPIN) != !hairpin ||
	    flow->nat_ip != f->daddr || flow->nat_port != p->inner.sport)
		return 0;
	t->svc_icmp = 1;
	t->hairpin = hairpin;
	return 1;
}

/* cb_nat_icmp_client turns the error cb_lb_icmp_client matched into one about the packet
 * the backend (c) sent: to the backend, quoting backend:bport → client:cport; a hairpin's
 * from the VIP to the client, quoting client:target → VIP:cport. Returns 0 or a reason. */
static __noinline int cb_nat_icmp_client(struct __sk_buff *skb, struct cb_pkt *p, struct cb_flow *f,
					 const struct cb_track *t, const struct cb_lb_choice *c)
{
	int r;

	if (!p || !f || !t || !c)
		return CB_DROP_NAT_ERR;
	if (t->hairpin)
		return cb_nat_icmp_hairpin(skb, p, f, c->port, p->inner.dport);
	r = cb_icmp_quote_nat(skb, p, 1, c->ip, c->port);
	if (!r)
		r = cb_nat(skb, p, f, 1, c->ip, f->dport);
	return r;
}

/* The keys of the fast path: the packet's tuple, and the service its destination would be. */
struct cb_fast_keys {
	struct cb_ct_key ct;
	struct cb_svc_key svc;
};

/* cb_fast_pass decides, for cb_ipv4_fast, whether an unfragmented TCP or UDP packet (not
 * SYN, FIN or RST) from a local endpoint to an endpoint of its network, keys in k (its
 * tuple may be left reversed; e: the entry under it, never a client→VIP one with services
 * on), may skip the full stage. With services on (lb), it must not be addressed to
 * a service (cb_lb_forward's test) nor be a service flow's reply (cb_lb_reply's). An entry
 * under its own tuple answers both without a lookup when it is live, of the current
 * policy epoch and nobody's service flow (flags exactly CB_CT_ALLOWED): a service flow's
 * entry under the reverse tuple would have marked it (CB_CT_SHADOW, cb_ct_shadow), and a
 * service on the destination's address and port added since its verdict moved the epoch
 * (the driver bumps it when a service takes an endpoint's address).
 * When the flow is tracked (a group with rules, or a pod with a NetworkPolicy entry, at
 * either end), a live entry of the current policy epoch that policy allowed and that is
 * nobody's service flow (flags exactly CB_CT_ALLOWED) must hold its tuple, either way; it
 * then moves that entry by cb_ct_pass, as cb_ct_check does (ack, a TCP segment's
 * acknowledgment or 0, noted; a first reply makes it ESTABLISHED; refreshed). The reply of a service flow (not a hairpin's; no entry under its own
 * tuple) to a client of net, whose flow entry is of the current policy epoch, is that
 * entry's reply as cb_ct_check takes it: *rev is then the entry, whose VIP:port the
 * caller restores as the packet's source. "Of the current policy epoch": not older than
 * need, the stamp of the flow's groups and zone (cb_epg_track; a service taking an
 * endpoint's address stamps the endpoint's group). Returns 1 to pass, or 0 having written
 * nothing: the full stage decides. */
CB_INLINE int cb_fast_pass(struct cb_fast_keys *k, struct cb_ct_entry *e, int tracked, int lb, __u32 net,
			   __u32 need, __u32 ack, struct cb_ct_entry **rev)
{
	struct cb_ct_entry *r = 0;
	__u64 now = cb_now();
	int plain = cb_ct_trusted(e, now, CB_CT_ALLOWED, need);
	__be32 a;
	__be16 port;

	if (!e) {
		a = k->ct.saddr;
		k->ct.saddr = k->ct.daddr;
		k->ct.daddr = a;
		port = k->ct.sport;
		k->ct.sport = k->ct.dport;
		k->ct.dport = port;
		r = bpf_map_lookup_elem(&cb_ct, &k->ct);
	}
	if (lb && !plain) {
		/* Marked: its packets may be a service flow's replies. */
		if (e && (e->flags & CB_CT_SHADOW))
			return 0;
		if (r && r->expires >= now && cb_ct_dnat_flow(r)) {
			/* A service flow's reply (cb_lb_reply's test): only from a backend that is
			 * no hairpin, with no entry of its own direction, to a client of net (where
			 * its destination was looked up), and of the current policy epoch. */
			if (!cb_ct_trusted(r, now, CB_CT_ALLOWED | CB_CT_DNAT, need) || r->nat_net != net)
				return 0;
			cb_ct_pass(r, k->ct.proto, 1, ack, now, 0);
			*rev = r;
			return 1;
		}
		if (bpf_map_lookup_elem(&cb_services, &k->svc))
			return 0;
	}
	if (!tracked)
		return 1;
	if (e) {
		if (!plain)
			return 0;
		cb_ct_pass(e, k->ct.proto, 0, ack, now, 0);
	} else {
		if (!cb_ct_trusted(r, now, CB_CT_ALLOWED, need))
			return 0;
		cb_ct_pass(r, k->ct.proto, 1, ack, now, 0);
	}
	return 1;
}
