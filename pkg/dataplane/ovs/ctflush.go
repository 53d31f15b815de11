package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Flushing chosen conntrack entries (NXT_CT_FLUSH, OVS 3.1+), as `ovs-ofctl ct-flush
// SWITCH zone=N ORIG-TUPLE REPLY-TUPLE` does: the message carries a partial tuple per
// direction as nested properties and every entry matching all given fields is deleted.

// Nicira message subtypes and NXT_CT_FLUSH property types.
const (
	nxtCTFlush = 32

	ctPropOrig  = 0 // nested tuple, original direction
	ctPropReply = 1 // nested tuple, reply direction
	ctPropZone  = 2 // u16

	ctTupleSrc     = 0 // 16 bytes (IPv4-mapped IPv6)
	ctTupleDst     = 1
	ctTupleSrcPort = 2 // be16
	ctTupleDstPort = 3
)

// ctTuple is part of one direction of a connection; zero fields match anything.
type ctTuple struct {
	src, dst     netip.Addr
	sport, dport uint16
}

// ctMatch selects the conntrack entries of one zone and protocol by their tuples; vrf is
// the zone's tenant (its VRF: the guard flow of a removed backend matches it), not part of
// the flush.
type ctMatch struct {
	zone        uint16
	vrf         uint32
	proto       uint8
	orig, reply ctTuple
}

func (m ctMatch) String() string {
	return fmt.Sprintf("zone=%d proto=%d orig=%+v reply=%+v", m.zone, m.proto, m.orig, m.reply)
}

// encode returns the NXT_CT_FLUSH payload after the Nicira subtype.
func (m ctMatch) encode() []byte {
	b := []byte{m.proto, 0, 0, 0, 0, 0, 0, 0} // struct nx_ct_flush: ip_proto, family 0, zero[6]
	b = append(b, m.orig.encode(ctPropOrig)...)
	b = append(b, m.reply.encode(ctPropReply)...)
	return append(b, ofProp16(ctPropZone, m.zone)...)
}

// encode returns the tuple as a nested property of type typ, nothing when it is empty.
func (t ctTuple) encode(typ uint16) []byte {
	var nested []byte
	for _, a := range []struct {
		typ  uint16
		addr netip.Addr
	}{{ctTupleSrc, t.src}, {ctTupleDst, t.dst}} {
		if a.addr.IsValid() {
			v := a.addr.As16() // IPv4 as IPv4-mapped IPv6
			nested = append(nested, ofProp(a.typ, v[:])...)
		}
	}
	for _, p := range []struct{ typ, port uint16 }{{ctTupleSrcPort, t.sport}, {ctTupleDstPort, t.dport}} {
		if p.port != 0 {
			nested = append(nested, ofProp16(p.typ, p.port)...)
		}
	}
	if len(nested) == 0 {
		return nil
	}
	// A nested property's header is padded to 8 bytes before its properties.
	h := make([]byte, 8, 8+len(nested))
	binary.BigEndian.PutUint16(h[0:], typ)
	binary.BigEndian.PutUint16(h[2:], uint16(8+len(nested)))
	return append(h, nested...)
}

// ofProp is an OpenFlow property: type, length (without padding), value, zero padding
// to a multiple of 8 bytes.
func ofProp(typ uint16, value []byte) []byte {
	n := 4 + len(value)
	b := make([]byte, (n+7)/8*8)
	binary.BigEndian.PutUint16(b[0:], typ)
	binary.BigEndian.PutUint16(b[2:], uint16(n))
	copy(b[4:], value)
	return b
}

// ofProp16 is a 16-bit property as OVS writes it (ofpprop_put_u16/be16): the value and
// two zero bytes, all counted in the length.
func ofProp16(typ, v uint16) []byte {
	return ofProp(typ, []byte{byte(v >> 8), byte(v), 0, 0})
}

// ctFlush deletes the conntrack entries m selects.
func (c *ofConn) ctFlush(ctx context.Context, m ctMatch) error {
	if err := c.nxRequest(ctx, nxtCTFlush, m.encode()); err != nil {
		return fmt.Errorf("flush conntrack %s: %w", m, err)
	}
	return nil
}

// nxRequest sends a Nicira request that has no reply of its own (see request).
func (c *ofConn) nxRequest(ctx context.Context, subtype uint32, payload []byte) error {
	body := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint32(body[0:], 0x00002320) // Nicira
	binary.BigEndian.PutUint32(body[4:], subtype)
	return c.request(ctx, c.newMsg(ofptExperimenter, append(body, payload...)))
}

// request sends msg, which has no reply of its own, and confirms it with a barrier: an
// error OVS reports for it arrives before the barrier's reply.
func (c *ofConn) request(ctx context.Context, msg []byte) error {
	xid := xidOf(msg)
	ch, err := c.expect(xid)
	if err != nil {
		return err
	}
	defer c.forget(xid)
	if err := c.write(msg); err != nil {
		return err
	}
	if _, err := c.call(ctx, c.newMsg(ofptBarrierRequest, nil)); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	// The connection reads and delivers in order: an error for the request was put in
	// ch before the barrier's reply was delivered.
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
	default:
	}
	return nil
}

// serviceNATs returns, per service port that st compiles to flows, a match for the
// conntrack entries translating VIP:port to each backend in the service tenant's zones
// (its own: its local clients'; its inbound one: what another host sent to the VIP): of
// the services ids (nil: all).
func serviceNATs(st *dataplane.Index, vrf map[string]uint32, ids []string) map[ctMatch]bool {
	out := map[ctMatch]bool{}
	services := st.Services
	if ids != nil {
		services = map[string]dataplane.Service{}
		for _, id := range ids {
			if s, ok := st.Services[id]; ok {
				services[id] = s
			}
		}
	}
	inbound := inboundZones(vrf)
	for _, s := range services {
		tenant, err := dataplane.ServiceTenant(s.ID)
		if err != nil {
			continue
		}
		v, ok := vrf[tenant]
		if !ok {
			continue
		}
		for _, sp := range s.Ports {
			target := sp.TargetPort
			if target == 0 {
				target = sp.Port
			}
			for _, b := range append(slices.Clone(s.Backends), s.Draining...) { // draining ones keep theirs
				for _, zone := range []uint32{v, inbound[v]} {
					out[ctMatch{zone: uint16(zone), vrf: v, proto: sp.Proto,
						orig: ctTuple{dst: s.VIP, dport: sp.Port}, reply: ctTuple{src: b, sport: target}}] = true
				}
			}
		}
	}
	return out
}

// flushRemovedNATs deletes the conntrack entries of translations in before that are not
// in after (a backend left its service, a port or the service went away): the next
// packet of such a flow is new again and is balanced over the backends left, as the eBPF
// datapath re-balances a flow whose backend is gone.
//
// A reply the removed backend sent just before its translation went would arrive untracked
// and reach the client from the backend's own address: for a few seconds such packets
// (new to conntrack, from the backend's target port, in the tenant's zone) are dropped by a
// flow OVS expires itself (removedBackendGuard).
func (d *Driver) flushRemovedNATs(ctx context.Context, before, after map[ctMatch]bool) error {
	var errs []error
	for m := range before {
		if after[m] {
			continue
		}
		if err := d.removedBackendGuard(ctx, m); err != nil {
			errs = append(errs, err)
		}
		if err := d.conn.ctFlush(ctx, m); err != nil {
			errs = append(errs, err)
			continue
		}
		d.log.Debug("service conntrack entries flushed", "match", m.String())
	}
	return errors.Join(errs...)
}

// Guard flows: not the pipeline's (their cookie is outside cookieOwnerMask, so resyncs
// neither count nor sweep them); OVS deletes them after guardSeconds.
const (
	cookieGuard  uint64 = 0xcb0c << 48
	guardSeconds        = 3
)

// removedBackendGuard drops, for guardSeconds, packets from the backend of translation m
// (its address and target port) that conntrack does not know, in m's tenant (found in
// neither of its zones: the flow matches the last lookup's state).
func (d *Driver) removedBackendGuard(ctx context.Context, m ctMatch) error {
	if !m.reply.src.Is4() || m.reply.sport == 0 {
		return nil
	}
	f := d.pl.newFlow(tServiceLB, 80).ip().ctState("+new+trk", []int{of.NX_CT_STATE_NEW_OFS, of.NX_CT_STATE_TRK_OFS}, nil).
		reg(regVRF, m.vrf).ipSrc(netip.PrefixFrom(m.reply.src, 32)).proto(m.proto).tpSrc(m.proto, m.reply.sport)
	fm := f.flowMod(of.FC_ADD, cookieGuard)
	fm.HardTimeout = guardSeconds
	msg, err := d.conn.marshal(fm)
	if err != nil {
		return err
	}
	if err := d.conn.bundle(ctx, [][]byte{msg}); err != nil {
		return fmt.Errorf("ovs: guard removed backend %v: %w", m.reply.src, err)
	}
	return nil
}
