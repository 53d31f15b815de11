/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tcpwin.h: the TCP window, the one rule every flow kind's blind FIN and RST protection
 * uses (docs/conntrack.md "The window"): conntrack's entries (conntrack.h, node port flows
 * included), egress NAT's (nat.h) and peer flows (nodeport.h) note and judge with these
 * two functions, so two tables that see the same segments agree on every FIN and RST.
 *
 * A FIN or RST closes a flow only with a sequence number a peer that sees the flow would
 * use: in [ref, ref + CB_TCP_CLOSE_WINDOW), where ref is the acknowledgment number last
 * noted from the other side (0: none noted yet, believed). Notes are lazy: an
 * acknowledgment is noted when none is, or when it lies CB_TCP_NOTE_STEP or more past the
 * noted one (sequence arithmetic: one behind it is noted too), so the fast path writes an
 * entry about once per step a flow receives, not per segment. A noted acknowledgment lags
 * the real one by less than a step; the window holds that step plus Linux's largest
 * default receive buffer (6 MiB).
 *
 * A RST is held to a window of one step (CB_TCP_RST_WINDOW): the RST that ends a flow at
 * an endpoint that checks (RFC 5961: Linux accepts only the exact next sequence number
 * and answers any other with a challenge ACK) carries that endpoint's latest
 * acknowledgment, which lies less than a step past the noted one; a blind one must hit
 * 2^20 of 2^32 sequence numbers (4,096 tries), not 2^23 (512). A RST further out (an
 * abort with data in flight) still goes on to the endpoint, whose challenge ACK brings the
 * exact one. A FIN follows the data in flight and keeps the whole window. A segment a
 * local endpoint sends is not judged here at all (conntrack.h, cb_ct_window): it can
 * close only its own flows. */
#pragma once

#include "common.h"
#include "parse.h"

#define CB_TCP_CLOSE_WINDOW (1u << 23)
#define CB_TCP_NOTE_STEP (1u << 20)
#define CB_TCP_RST_WINDOW CB_TCP_NOTE_STEP

/* cb_tcp_note_due says whether ack (0: none) is to be noted over ref (0: none). */
CB_INLINE int cb_tcp_note_due(__u32 ack, __u32 ref)
{
	return ack && (!ref || ack - ref >= CB_TCP_NOTE_STEP);
}

/* cb_tcp_note notes acknowledgment ack in *ref when due (cb_tcp_note_due): 1 when it
 * wrote. */
CB_INLINE int cb_tcp_note(__u32 *ref, __u32 ack)
{
	if (!cb_tcp_note_due(ack, *ref))
		return 0;
	*ref = ack;
	return 1;
}

/* cb_tcp_in_window says whether a FIN or RST (tcp_flags: a segment with RST set is a RST,
 * whatever else it carries) with sequence number seq may close a flow whose other side's
 * noted acknowledgment is ref (0: none, believed). */
CB_INLINE int cb_tcp_in_window(__u32 seq, __u32 ref, __u8 tcp_flags)
{
	return !ref || seq - ref < ((tcp_flags & CB_TCP_RST) ? CB_TCP_RST_WINDOW : CB_TCP_CLOSE_WINDOW);
}
