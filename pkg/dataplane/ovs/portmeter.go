package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Meters of one container port. A shared budget that one container can spend stops
// every tenant on the host; each endpoint's port has its own meters instead, installed
// before the flows that use them and deleted with the endpoint.
//
// Fragments a container may send into conntrack's reassembly (classifier priority 105).
// vswitchd holds the fragments of incomplete datagrams for the whole datapath
// (fragMaxHeld, 15 s each, no per-zone or per-port share): without a bound per port, one
// container sending lone fragments fills it, and every fragment after that reaches ct()
// unreassembled, is invalid, and no fragmented datagram passes a tracked flow or a VIP for
// any tenant on the host. A port holds at most fragRate × 15 s + fragBurst = 1,700 of the
// 5,000 fragments, so it takes three ports sending nothing but lone fragments at their
// full rate to fill it. Legitimate fragmented traffic is bounded too: ~100 fragments a
// second (two 64 KiB datagrams, fifty two-fragment ones) with bursts of 200.
//
// Answers (table answer): what vswitchd or the agent answers a container, a VIP's echo
// reply (slow path) and the refusal of a flow to a service without backends (a
// packet-in), passes the port's answer meter before the shared one of its kind
// (responderMeter, rejectMeter): one container flooding VIPs takes at most answerRate of
// the shared 1,000 a second, and the others are still answered.
const (
	fragMeterBase = 0xcb100000 // + the endpoint's OpenFlow port (below OFPM_MAX)
	fragRate      = 100        // fragments per second and port
	fragBurst     = 200
	fragMaxHeld   = 5000 // ipf-set-max-nfrags: vswitchd's ceiling (IPF_NFRAG_UBOUND)

	answerMeterBase = 0xcb200000 // + the endpoint's OpenFlow port
	answerRate      = 100        // answers per second and port
	answerBurst     = 50
)

// portMeterKind is one of the meters every endpoint port has.
type portMeterKind struct{ base, rate, burst uint32 }

// id is the kind's meter of the endpoint at OpenFlow port port.
func (k portMeterKind) id(port uint32) uint32 { return k.base + port&0xffff }

// portMeterKinds are the meters every endpoint port has.
func portMeterKinds() [2]portMeterKind {
	return [2]portMeterKind{{fragMeterBase, fragRate, fragBurst}, {answerMeterBase, answerRate, answerBurst}}
}

// OpenFlow 1.3 meter commands and the multipart type of meter statistics.
const (
	meterAdd    = 0
	meterModify = 1
	meterDelete = 2
	ofpmpMeter  = 9
)

// fragMeterID is the fragment meter of the endpoint at OpenFlow port port.
func fragMeterID(port uint32) uint32 { return portMeterKind{base: fragMeterBase}.id(port) }

// answerMeterID is the answer meter of the endpoint at OpenFlow port port.
func answerMeterID(port uint32) uint32 { return portMeterKind{base: answerMeterBase}.id(port) }

// isFragMeter says whether meter id is an endpoint's fragment meter.
func isFragMeter(id uint32) bool { return id&^0xffff == fragMeterBase }

// portMeterPort returns the port whose meter id is, if it is a port meter.
func portMeterPort(id uint32) (uint32, bool) {
	for _, k := range portMeterKinds() {
		if id&^0xffff == k.base {
			return id & 0xffff, true
		}
	}
	return 0, false
}

// ensurePortMeters installs the meters of every endpoint port that does not have them
// yet; the flows compiled for those ports refer to them, and OVS refuses a flow whose
// meter does not exist. Meters an earlier agent left (read on the first call after
// connecting) are modified in place: deleting one would delete the flows using it.
// reread (a full install) looks at what vswitchd holds again, so a meter deleted behind
// the driver's back is added again. Called with mu held, before the flows are installed.
func (d *Driver) ensurePortMeters(ctx context.Context, reread bool) error {
	existing := map[uint32]bool{}
	if d.portMeters == nil || reread {
		stats, err := d.conn.meterStats(ctx)
		if err != nil {
			return fmt.Errorf("ovs: port meters: %w", err)
		}
		for _, s := range stats {
			existing[s.ID] = true
		}
		if d.portMeters == nil {
			d.portMeters = map[uint32]bool{}
		}
		// A port whose meters vswitchd no longer holds (deleted behind the driver's
		// back, with the flows using them) gets them again: its flows could not be
		// installed without.
		for port := range d.portMeters {
			for _, k := range portMeterKinds() {
				if !existing[k.id(port)] {
					delete(d.portMeters, port)
					break
				}
			}
		}
	}
	for _, port := range d.ports.endpoints {
		if port == 0 || d.portMeters[port] {
			continue
		}
		for _, k := range portMeterKinds() {
			id, cmd := k.id(port), uint16(meterAdd)
			if existing[id] {
				cmd = meterModify
			}
			if err := d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(cmd, id, k.rate, k.burst))); err != nil {
				return fmt.Errorf("ovs: meter %#x for port %d: %w", id, port, err)
			}
		}
		d.portMeters[port] = true
	}
	return nil
}

// dropPortMeters deletes the meters of a port whose endpoint is gone (its flows went
// first).
func (d *Driver) dropPortMeters(ctx context.Context, port uint32) error {
	if !d.portMeters[port] {
		return nil
	}
	delete(d.portMeters, port)
	return d.deletePortMeters(ctx, port)
}

// deletePortMeters deletes every meter kind of port in vswitchd.
func (d *Driver) deletePortMeters(ctx context.Context, port uint32) error {
	var errs []error
	for _, k := range portMeterKinds() {
		if err := d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(meterDelete, k.id(port), k.rate, k.burst))); err != nil {
			errs = append(errs, fmt.Errorf("ovs: delete meter %#x of port %d: %w", k.id(port), port, err))
		}
	}
	return errors.Join(errs...)
}

// dropStalePortMeters deletes the meters of ports without an endpoint (an earlier
// agent's, whose endpoints went while it was away) after a full install: no flow of the
// installed generation refers to them.
func (d *Driver) dropStalePortMeters(ctx context.Context) {
	stats, err := d.conn.meterStats(ctx)
	if err != nil {
		d.log.Warn("stale port meters not removed", "err", err)
		return
	}
	stale := map[uint32]bool{}
	for _, s := range stats {
		if port, ok := portMeterPort(s.ID); ok && !d.portMeters[port] {
			stale[port] = true
		}
	}
	for port := range stale {
		if err := d.deletePortMeters(ctx, port); err != nil {
			d.log.Warn("stale port meters not removed", "err", err)
		}
	}
}

// meterStat is one meter's statistics: packets in, packets its drop band dropped.
type meterStat struct {
	ID               uint32
	Packets, Dropped uint64
	DroppedBytes     uint64 // the bands' byte counts
}

// meterStats reads every meter's statistics (OFPMP_METER, all meters).
func (c *ofConn) meterStats(ctx context.Context) ([]meterStat, error) {
	body := make([]byte, 8+8)
	binary.BigEndian.PutUint16(body[0:], ofpmpMeter)
	binary.BigEndian.PutUint32(body[8:], 0xffffffff) // OFPM_ALL
	replies, err := c.call(ctx, c.newMsg(ofptMultipartReq, body))
	if err != nil {
		return nil, fmt.Errorf("meter stats: %w", err)
	}
	var out []meterStat
	for _, r := range replies {
		if len(r) < 8 {
			continue
		}
		s, err := parseMeterStats(r[8:])
		if err != nil {
			return nil, err
		}
		out = append(out, s...)
	}
	return out, nil
}

// parseMeterStats reads the ofp_meter_stats entries of a reply body (after the multipart
// header): 40 bytes, then 16 per band.
func parseMeterStats(r []byte) ([]meterStat, error) {
	var out []meterStat
	for len(r) > 0 {
		if len(r) < 40 {
			return nil, errors.New("meter stats: short entry")
		}
		n := int(binary.BigEndian.Uint16(r[4:]))
		if n < 40 || n > len(r) || (n-40)%16 != 0 {
			return nil, fmt.Errorf("meter stats: bad entry length %d", n)
		}
		s := meterStat{ID: binary.BigEndian.Uint32(r), Packets: binary.BigEndian.Uint64(r[16:])}
		for b := r[40:n]; len(b) >= 16; b = b[16:] {
			s.Dropped += binary.BigEndian.Uint64(b)
			s.DroppedBytes += binary.BigEndian.Uint64(b[8:])
		}
		out = append(out, s)
		r = r[n:]
	}
	return out, nil
}
