package ovs

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// qosDropPoll is how often an open monitor stream reads the QoS meters' counters.
const qosDropPoll = time.Second

// qosDropMeter is what a QoS meter stands for in the monitor: its endpoint and direction.
type qosDropMeter struct {
	reason  string
	ip      netip.Addr
	network string
}

// qosDropEvents sends, while ctx lasts, one event per QoS meter whose drop count grew
// since the last poll (every qosDropPoll): reason drop_rate_egress (the endpoint's
// address as the source) or drop_rate_ingress (as the destination), Count the packets
// and Bytes the bytes the meter dropped meanwhile. A meter drops in the datapath without
// a flow that could copy the packet to the agent, so the monitor learns its drops only
// from its counters: what was dropped, where, how much, but not the packets' addresses
// and ports. The first poll sets the baseline (drops before the stream are not reported);
// a count that went down (the meter added again) starts a new one. Closes out at the end.
func (d *Driver) qosDropEvents(ctx context.Context, out chan<- dataplane.MonitorEvent) {
	defer close(out)
	last := map[uint32]meterStat{}
	first := true
	t := time.NewTicker(qosDropPoll)
	defer t.Stop()
	for {
		stats, err := d.conn.meterStats(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Debug("monitor: read qos meters", "err", err)
		}
		meters := d.qosDropMeters()
		now := time.Now()
		seen := map[uint32]meterStat{}
		for _, s := range stats {
			m, ok := meters[s.ID]
			if !ok {
				continue
			}
			seen[s.ID] = s
			if first {
				continue
			}
			prev := last[s.ID] // zero for a meter new since the last poll: all its drops are new
			if s.Dropped < prev.Dropped || s.DroppedBytes < prev.DroppedBytes {
				prev = meterStat{} // added again: its counts started over
			}
			if s.Dropped == prev.Dropped {
				continue
			}
			ev := dataplane.MonitorEvent{Time: now, Reason: m.reason, EtherType: 0x0800, Network: m.network,
				Count: s.Dropped - prev.Dropped, Bytes: s.DroppedBytes - prev.DroppedBytes}
			if m.reason == "drop_rate_egress" {
				ev.Src = m.ip
			} else {
				ev.Dst = m.ip
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		if err == nil {
			last, first = seen, false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// qosDrops sums what the QoS meters of the endpoints in the driver's state dropped, per
// network and direction (the rate-limit drop metrics).
func (d *Driver) qosDrops(ctx context.Context) (map[dataplane.QoSDropKey]dataplane.QoSDropCount, error) {
	stats, err := d.conn.meterStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("ovs: qos meters: %w", err)
	}
	meters := d.qosDropMeters()
	out := map[dataplane.QoSDropKey]dataplane.QoSDropCount{}
	for _, s := range stats {
		m, ok := meters[s.ID]
		if !ok {
			continue
		}
		k := dataplane.QoSDropKey{Network: m.network, Direction: strings.TrimPrefix(m.reason, "drop_rate_")}
		c := out[k]
		c.Packets += s.Dropped
		c.Bytes += s.DroppedBytes
		out[k] = c
	}
	return out, nil
}

// qosDropMeters maps the QoS meters of the endpoints in the driver's state to what their
// drops are reported as.
func (d *Driver) qosDropMeters() map[uint32]qosDropMeter {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[uint32]qosDropMeter{}
	if d.state == nil {
		return out
	}
	for id, ep := range d.state.Endpoints {
		port := d.ports.endpoints[id]
		if port == 0 {
			continue
		}
		if ep.QoS.EgressRate != 0 {
			out[qosEgressMeterID(port)] = qosDropMeter{"drop_rate_egress", ep.IP, ep.NetworkID}
		}
		if ep.QoS.IngressRate != 0 {
			out[qosIngressMeterID(port)] = qosDropMeter{"drop_rate_ingress", ep.IP, ep.NetworkID}
		}
	}
	return out
}
