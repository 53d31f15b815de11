package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Fragments a container may send into conntrack's reassembly. vswitchd holds the
// fragments of incomplete datagrams for the whole datapath (fragMaxHeld, 15 s each, no
// per-zone or per-port share): without a bound per port, one container sending lone
// fragments fills it, and every fragment after that reaches ct() unreassembled, is
// invalid, and no fragmented datagram passes a tracked flow or a VIP for any tenant on
// the host. Each endpoint's port has its own meter on fragments (endpointClassifier): a
// port holds at most fragRate × 15 s + fragBurst = 1,700 of the 5,000 fragments, so it
// takes three ports sending nothing but lone fragments at their full rate to fill it.
// Legitimate fragmented traffic is bounded too: ~100 fragments a second (two 64 KiB
// datagrams, fifty two-fragment ones) with bursts of 200.
const (
	fragMeterBase = 0xcb100000 // + the endpoint's OpenFlow port (below OFPM_MAX)
	fragRate      = 100        // fragments per second and port
	fragBurst     = 200
	fragMaxHeld   = 5000 // ipf-set-max-nfrags: vswitchd's ceiling (IPF_NFRAG_UBOUND)
)

// OpenFlow 1.3 meter commands and the multipart type of meter statistics.
const (
	meterAdd    = 0
	meterModify = 1
	meterDelete = 2
	ofpmpMeter  = 9
)

// fragMeterID is the fragment meter of the endpoint at OpenFlow port port.
func fragMeterID(port uint32) uint32 { return fragMeterBase + port&0xffff }

// isFragMeter says whether meter id is an endpoint's fragment meter.
func isFragMeter(id uint32) bool { return id&^0xffff == fragMeterBase }

// ensureFragMeters installs the fragment meter of every endpoint port that does not have
// one yet; the classifier flows compiled for those ports refer to them, and OVS refuses
// a flow whose meter does not exist. Meters an earlier agent left (read once, on the
// first call after connecting) are modified in place: deleting one would delete the
// flows using it. Called with mu held, before the flows are installed.
func (d *Driver) ensureFragMeters(ctx context.Context) error {
	existing := map[uint32]bool{}
	if d.fragMeters == nil {
		stats, err := d.conn.meterStats(ctx)
		if err != nil {
			return fmt.Errorf("ovs: fragment meters: %w", err)
		}
		for _, s := range stats {
			existing[s.ID] = true
		}
		d.fragMeters = map[uint32]bool{}
	}
	for _, port := range d.ports.endpoints {
		if port == 0 || d.fragMeters[port] {
			continue
		}
		id, cmd := fragMeterID(port), uint16(meterAdd)
		if existing[id] {
			cmd = meterModify
		}
		if err := d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(cmd, id, fragRate, fragBurst))); err != nil {
			return fmt.Errorf("ovs: fragment meter %#x for port %d: %w", id, port, err)
		}
		d.fragMeters[port] = true
	}
	return nil
}

// dropFragMeter deletes the fragment meter of a port whose endpoint is gone (its flows
// went first).
func (d *Driver) dropFragMeter(ctx context.Context, port uint32) error {
	if !d.fragMeters[port] {
		return nil
	}
	delete(d.fragMeters, port)
	if err := d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(meterDelete, fragMeterID(port), fragRate, fragBurst))); err != nil {
		return fmt.Errorf("ovs: delete fragment meter of port %d: %w", port, err)
	}
	return nil
}

// dropStaleFragMeters deletes the fragment meters of ports without an endpoint (an
// earlier agent's, whose endpoints went while it was away) after a full install: no flow
// of the installed generation refers to them.
func (d *Driver) dropStaleFragMeters(ctx context.Context) {
	stats, err := d.conn.meterStats(ctx)
	if err != nil {
		d.log.Warn("stale fragment meters not removed", "err", err)
		return
	}
	for _, s := range stats {
		if port := s.ID & 0xffff; isFragMeter(s.ID) && !d.fragMeters[port] {
			d.fragMeters[port] = true // dropFragMeter deletes what it knows
			if err := d.dropFragMeter(ctx, port); err != nil {
				d.log.Warn("stale fragment meter not removed", "err", err)
			}
		}
	}
}

// meterStat is one meter's statistics: packets in, packets its drop band dropped.
type meterStat struct {
	ID               uint32
	Packets, Dropped uint64
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
		}
		out = append(out, s)
		r = r[n:]
	}
	return out, nil
}
