package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// An endpoint's QoS (dataplane.QoS: its netprofile or pod bandwidth) is enforced with
// OpenFlow meters of its own, rates in kbit/s with a burst in kbit and one drop band:
//   - what it sends: its IPv4 leaves the classifier for table qos, where the egress meter
//     (0xcb30<port>) polices it and its DSCP is set (set_field ip_dscp), then table arp;
//     fragments have passed the port's fragment meter first. ARP is not metered.
//   - what it receives: the output flow to its port passes the ingress meter (0xcb40<port>).
//
// Endpoints without a QoS go from the classifier to arp directly, through no extra table.
// A rate change is a meter modify (its flows stay as they are); meters are installed before
// the flows that use them and deleted after them. Packets a meter drops are counted as
// drop_rate_egress / drop_rate_ingress (Counters), the eBPF datapath's reasons; OVS drops
// them in the datapath without a flow that could copy them, so the monitor learns them
// from the meters' counters (qosmonitor.go).
const (
	qosEgressMeterBase  = 0xcb300000 // + the endpoint's OpenFlow port
	qosIngressMeterBase = 0xcb400000
	// minMeterBurst is the least burst given (bytes): one full-sized frame.
	minMeterBurst = 1514
	// minDefaultBurst is the least qosDefaultBurst (bytes): a 64 KiB GSO/GRO segment
	// must fit.
	minDefaultBurst = 64 << 10
	// meterRefillMs is the least burst given, in milliseconds of the rate. vswitchd's
	// userspace meters (dpif-netdev) refill their buckets in whole milliseconds and take
	// up to 32 frames at once, so a bucket smaller than a millisecond of its rate caps
	// the rate at the bucket per millisecond, and TCP through it stalls: at 200 Mbit/s
	// with a burst of 160 kbit (0.8 ms) iperf3 moved nothing in 117 s. Two milliseconds
	// leave a refill room to land while a batch drains the bucket.
	meterRefillMs = 2
)

// minBurst is the least burst (bytes) a meter of rate (bit/s) is given: one full-sized
// frame, and meterRefillMs of the rate.
func minBurst(rate uint64) uint64 {
	return max(minMeterBurst, ceilDiv(rate, 8*1000/meterRefillMs))
}

// qosDefaultBurst is the burst (bytes) a rate (bit/s) without one gets: 250 ms of the
// rate, at least minDefaultBurst. A meter drops what exceeds its bucket, and TCP between
// containers (sub-millisecond RTT) backs off into retransmission timeouts unless the
// bucket absorbs its bursts. Through the meters (conformance scenario netprofile, frames
// on the wire): 100 ms gave 0.5 of the rate, 500 ms 0.95-1.03 (near the 1.05 ceiling: the
// bucket itself passes), 250 ms 0.95-1.03, centred. (The eBPF backend has its own,
// measured through its policer.)
func qosDefaultBurst(rate uint64) uint64 { return max(rate/32, minDefaultBurst) }

// qosBand is one meter's rate (kbit/s) and burst (kbit).
type qosBand struct{ kbps, kbit uint32 }

// qosBandOf converts a rate (bit/s) and burst (bytes; 0: qosDefaultBurst; raised to
// minBurst) to a meter band, refusing what OVS cannot express.
func qosBandOf(rate, burst uint64) (qosBand, error) {
	if burst == 0 {
		burst = qosDefaultBurst(rate)
	}
	burst = max(burst, minBurst(rate))
	// Rounded up without the overflow of rate+999 or burst*8 near 2^64 (which wrapped
	// to a zero band: accepted, then refused by vswitchd or metering nothing).
	kbps, kbit := ceilDiv(rate, 1000), ceilDiv(burst, 125)
	if kbps > math.MaxUint32 || kbit > math.MaxUint32 {
		return qosBand{}, fmt.Errorf("qos: rate %d bit/s or burst %d bytes beyond an OpenFlow meter's 32-bit kbit fields", rate, burst)
	}
	return qosBand{uint32(kbps), uint32(kbit)}, nil
}

// ceilDiv is a/b rounded up.
func ceilDiv(a, b uint64) uint64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// qosMeters are the meters endpoint ep at port needs, by id.
func qosMeters(port uint32, q dataplane.QoS) (map[uint32]qosBand, error) {
	out := map[uint32]qosBand{}
	for _, d := range []struct {
		base        uint32
		rate, burst uint64
	}{{qosEgressMeterBase, q.EgressRate, q.EgressBurst}, {qosIngressMeterBase, q.IngressRate, q.IngressBurst}} {
		if d.rate == 0 {
			continue
		}
		b, err := qosBandOf(d.rate, d.burst)
		if err != nil {
			return nil, err
		}
		out[d.base+port&0xffff] = b
	}
	return out, nil
}

func qosEgressMeterID(port uint32) uint32  { return qosEgressMeterBase + port&0xffff }
func qosIngressMeterID(port uint32) uint32 { return qosIngressMeterBase + port&0xffff }

// isQoSMeter says whether id is an endpoint's QoS meter, and which direction.
func isQoSMeter(id uint32) (egress, ok bool) {
	switch id &^ 0xffff {
	case qosEgressMeterBase:
		return true, true
	case qosIngressMeterBase:
		return false, true
	}
	return false, false
}

// marksEgress says whether the endpoint's IPv4 goes through table qos.
func marksEgress(q dataplane.QoS) bool { return q.EgressRate != 0 || q.SetDSCP }

// qosFlows are table qos's flows of the endpoint at port: its IPv4 through its egress
// meter and DSCP marking, then arp.
func (pl *pipeline) qosFlows(port uint32, q dataplane.QoS) []*flow {
	if !marksEgress(q) {
		return nil
	}
	f := pl.newFlow(tQoS, 100).inPort(port).ip()
	if q.EgressRate != 0 {
		f.metered(qosEgressMeterID(port))
	}
	if q.SetDSCP {
		f.a(of.NewActionSetField(*of.NewIpDscpField(q.DSCP)), fmt.Sprintf("set_field:%d->ip_dscp", q.DSCP))
	}
	return []*flow{f.goTo(tARP)}
}

// meterModKbps is an OFPT_METER_MOD body of a kbit/s meter with a burst and one drop band.
func meterModKbps(command uint16, id uint32, b qosBand) []byte {
	m := meterMod(command, id, b.kbps, b.kbit)
	binary.BigEndian.PutUint16(m[2:], 0x1|0x4|0x8) // OFPMF_KBPS | OFPMF_BURST | OFPMF_STATS
	return m
}

// qosRefused are the endpoints whose QoS cannot be installed, by id: a band beyond a
// meter's fields, or a meter vswitchd refused. A full install leaves them out and
// installs the rest (Sync).
type qosRefused map[string]error

func (r qosRefused) Error() string {
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(r)) {
		errs = append(errs, r[id])
	}
	return errors.Join(errs...).Error()
}

// wantQoSMeters are the QoS meters st's endpoints need at their ports, with the
// endpoint each is for; endpoints whose QoS no meter can express are refused.
func (d *Driver) wantQoSMeters(st *dataplane.Index) (want map[uint32]qosBand, owner map[uint32]string, refused qosRefused) {
	want, owner, refused = map[uint32]qosBand{}, map[uint32]string{}, qosRefused{}
	for id, ep := range st.Endpoints {
		port := d.ports.endpoints[id]
		if port == 0 || ep.QoS.IsZero() {
			continue
		}
		m, err := qosMeters(port, ep.QoS)
		if err != nil {
			refused[id] = fmt.Errorf("endpoint %s: %w", id, err)
			continue
		}
		for k, v := range m {
			want[k], owner[k] = v, id
		}
	}
	return want, owner, refused
}

// ensureQoSMeters adds the QoS meters st needs and modifies those whose band changed,
// before the flows that use them are installed. Meters an earlier agent left (read once
// after connecting) are modified in place. reread (a full install) looks at what
// vswitchd holds first: a meter deleted behind the driver's back is added again, or the
// flows using it could not be installed. The endpoints whose meters cannot be made (the
// band does not fit, vswitchd answers an error) are returned as qosRefused after every
// other meter is in place; other failures (the connection) fail it all. Called with mu
// held.
func (d *Driver) ensureQoSMeters(ctx context.Context, st *dataplane.Index, reread bool) error {
	want, owner, refused := d.wantQoSMeters(st)
	if d.qosMeters == nil || reread {
		stats, err := d.conn.meterStats(ctx)
		if err != nil {
			return fmt.Errorf("ovs: qos meters: %w", err)
		}
		live := map[uint32]qosBand{}
		for _, s := range stats {
			if _, ok := isQoSMeter(s.ID); ok {
				live[s.ID] = d.qosMeters[s.ID] // as installed, or zero (unknown): modified when wanted
			}
		}
		d.qosMeters = live
	}
	for _, id := range slices.Sorted(maps.Keys(want)) {
		b := want[id]
		cur, had := d.qosMeters[id]
		if had && cur == b {
			continue
		}
		cmd := uint16(meterAdd)
		if had {
			cmd = meterModify
		}
		if err := d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterModKbps(cmd, id, b))); err != nil {
			err = fmt.Errorf("ovs: qos meter %#x: %w", id, err)
			if oe := (*ofError)(nil); errors.As(err, &oe) {
				refused[owner[id]] = fmt.Errorf("endpoint %s: %w", owner[id], err)
				continue
			}
			return err
		}
		d.qosMeters[id] = b
	}
	if len(refused) > 0 {
		return refused
	}
	return nil
}

// dropQoSMeters deletes the QoS meters st no longer needs, after the flows that used them
// are gone. Called with mu held.
func (d *Driver) dropQoSMeters(ctx context.Context, st *dataplane.Index) error {
	want, _, _ := d.wantQoSMeters(st)
	var errs []error
	for id := range d.qosMeters {
		if _, ok := want[id]; ok {
			continue
		}
		if err := d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterModKbps(meterDelete, id, qosBand{1, 1}))); err != nil {
			errs = append(errs, fmt.Errorf("ovs: delete qos meter %#x: %w", id, err))
			continue
		}
		delete(d.qosMeters, id)
	}
	return errors.Join(errs...)
}

// qosRows lists the endpoints with a QoS (netctl bpf qos): per direction its meter, rate
// and burst as installed, what passed the meter and what it dropped (packets, bytes).
func qosRows(l *dataplane.Listing, st *dataplane.Index, p ports, stats []meterStat) {
	l.Columns = dataplane.QoSColumns()
	byID := map[uint32]meterStat{}
	for _, s := range stats {
		byID[s.ID] = s
	}
	for id, ep := range st.Endpoints {
		port := p.endpoints[id]
		if ep.QoS.IsZero() || port == 0 {
			continue
		}
		dscp := "-"
		if ep.QoS.SetDSCP {
			dscp = strconv.Itoa(int(ep.QoS.DSCP))
		}
		for _, d := range []struct {
			dir         string
			meter       uint32
			rate, burst uint64
		}{{"egress", qosEgressMeterID(port), ep.QoS.EgressRate, ep.QoS.EgressBurst}, {"ingress", qosIngressMeterID(port), ep.QoS.IngressRate, ep.QoS.IngressBurst}} {
			if d.rate == 0 {
				if d.dir == "egress" && ep.QoS.SetDSCP {
					l.Rows = append(l.Rows, []string{id, d.dir, "-", "-", "-", dscp, "-", "-", "-"})
				}
				continue
			}
			b, err := qosBandOf(d.rate, d.burst)
			if err != nil {
				continue
			}
			s := byID[d.meter]
			mark := "-"
			if d.dir == "egress" {
				mark = dscp
			}
			l.Rows = append(l.Rows, []string{id, d.dir, fmt.Sprintf("%#x", d.meter), fmt.Sprintf("%d kbit/s", b.kbps),
				fmt.Sprintf("%d kbit", b.kbit), mark, strconv.FormatUint(s.Packets, 10), strconv.FormatUint(s.Dropped, 10),
				strconv.FormatUint(s.DroppedBytes, 10)})
		}
	}
}
