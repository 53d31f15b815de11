package ebpf

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// An endpoint's QoS (dataplane.QoS) is enforced by the datapath (bpf/lib/qos.h): a GCRA
// bucket per direction in cb_qos at the endpoint's counter slot, and a word in its
// interface entry (cb_iface.qos: which checks apply, and the DSCP) and a flag in its
// endpoint entry (CB_EP_QOS_IN) that the paths already read, so an endpoint without QoS
// costs no lookup. docs/ebpf.md "Rate limits and DSCP".

const (
	// qosMinRate is the slowest rate the buckets keep exact (bit/s): a slower one is
	// enforced as this one (the fixed-point cost of a byte stays in range).
	qosMinRate = 1000
	// qosMinBurstBytes is the smallest burst a rate without one gets: a full GSO packet
	// of TCP (64 KiB) with room for a second.
	qosMinBurstBytes = 128 << 10
	// qosBurstTime is the burst a rate without one gets when that is more: what the rate
	// sends in this time. A policer drops, it does not queue: on a path of microseconds
	// TCP's window runs far past the rate, the bucket empties, and the retransmissions
	// are dropped too, so each loss ends in a retransmission timeout (200 ms). TCP then
	// moves about one burst per timeout: measured with iperf3 here, 10 ms of the rate
	// gave 0.06 of it, 100 ms 0.56, 200 ms 0.98 (10 Mbit/s) and 1.01 (1 Gbit/s), 300 ms
	// 1.03-1.08 (the first burst counts in a 3 s run). TestQoSDriver, make bench
	// ebpf.netprofile.*.
	qosBurstTime = 200 * time.Millisecond
	// qosMaxTau caps a bucket's burst in time: a burst worth more than an hour at its
	// rate is an hour's worth.
	qosMaxTau = uint64(time.Hour)
)

// qosDefaultBurst is the burst (bytes) a rate (bit/s) without one gets.
func qosDefaultBurst(rate uint64) uint64 {
	// rate × 0.2 s / 8 bits in 128 bits: at 1000g the product passes 64 bits, and the
	// quotient (25 GB there) always fits (rate / 40).
	hi, lo := bits.Mul64(rate, uint64(qosBurstTime))
	b, _ := bits.Div64(hi, lo, uint64(8*time.Second))
	return max(b, qosMinBurstBytes)
}

// qosBucket is the datapath's bucket for rate (bit/s, 0: unlimited) and burst (bytes, 0:
// qosDefaultBurst).
func qosBucket(rate, burst uint64) contivbpfCbQosBucket {
	if rate == 0 {
		return contivbpfCbQosBucket{}
	}
	rate = max(rate, qosMinRate)
	if burst == 0 {
		burst = qosDefaultBurst(rate)
	}
	// The cost of a byte: 8e9/rate ns, in fixed point.
	nsb := max((uint64(8*time.Second)<<qosNsbShift)/rate, 1)
	// tau = burst × 8e9 / rate ns, capped.
	hi, lo := bits.Mul64(burst, uint64(8*time.Second))
	tau := qosMaxTau
	if hi < rate {
		if q, _ := bits.Div64(hi, lo, rate); q < qosMaxTau {
			tau = q
		}
	}
	return contivbpfCbQosBucket{Nsb: nsb, Tau: tau}
}

// qosNsbShift is CB_QOS_NSB_SHIFT (qos.h).
const qosNsbShift = 16

// qosWord is the interface entry's qos word for q (0: nothing to apply).
func qosWord(q dataplane.QoS) uint32 {
	var w uint32
	if q.EgressRate != 0 {
		w |= uint32(contivbpfCbQosFlagsCB_QOS_EGRESS)
	}
	if q.IngressRate != 0 {
		w |= uint32(contivbpfCbQosFlagsCB_QOS_INGRESS)
	}
	if q.SetDSCP {
		w |= uint32(contivbpfCbQosFlagsCB_QOS_DSCP) | uint32(q.DSCP&0x3f)<<8
	}
	return w
}

// putQoS writes slot's buckets for q before the entries that turn them on name them. A
// bucket whose rate and burst did not change keeps its state (a resync or an unrelated
// update grants no new burst); a changed one starts full. Drop counts are kept either way. The write takes the entry's
// lock (BPF_F_LOCK) so that it never tears a packet's update.
func (d *Driver) putQoS(slot uint32, q dataplane.QoS) error {
	if d.objs.CbQos == nil {
		return errors.New("qos: map cb_qos missing")
	}
	want := contivbpfCbQosEntry{Generation: d.gen, Out: qosBucket(q.EgressRate, q.EgressBurst), In: qosBucket(q.IngressRate, q.IngressBurst)}
	cur, err := d.qosEntry(slot)
	if err != nil {
		return err
	}
	keep := func(w *contivbpfCbQosBucket, c contivbpfCbQosBucket) {
		if w.Nsb != 0 && w.Nsb == c.Nsb && w.Tau == c.Tau {
			w.Tat = c.Tat
		}
		// The endpoint's drop counts go on through a change of its rate (a drop between
		// the read and the write is lost: microseconds, only when the rate changes).
		w.Dropped, w.DroppedBytes = c.Dropped, c.DroppedBytes
	}
	keep(&want.Out, cur.Out)
	keep(&want.In, cur.In)
	if want.Out == cur.Out && want.In == cur.In {
		return nil
	}
	if err := d.objs.CbQos.Update(slot, &want, ebpf.UpdateLock); err != nil {
		return fmt.Errorf("qos: write slot %d: %w", slot, err)
	}
	return nil
}

// qosOf reads back the QoS the datapath applies to the endpoint of interface entry ifc
// (nil: none): rates and bursts from its buckets (as enforced: clamped, defaults filled
// in, rounded by the fixed point).
func (d *Driver) qosOf(ifc contivbpfCbIface) *dataplane.QoS {
	if ifc.Qos == 0 {
		return nil
	}
	q := &dataplane.QoS{}
	if ifc.Qos&uint32(contivbpfCbQosFlagsCB_QOS_DSCP) != 0 {
		q.SetDSCP, q.DSCP = true, uint8(ifc.Qos>>8&0x3f)
	}
	e, err := d.qosEntry(ifc.Slot)
	if err != nil {
		return q
	}
	q.EgressRate, q.EgressBurst = e.Out.rate()
	q.IngressRate, q.IngressBurst = e.In.rate()
	return q
}

// qosEntry reads slot's buckets under the entry's lock (BPF_F_LOCK), so that a packet's
// update in flight never shows half written.
func (d *Driver) qosEntry(slot uint32) (contivbpfCbQosEntry, error) {
	var e contivbpfCbQosEntry
	if d.objs.CbQos == nil {
		return e, errors.New("qos: map cb_qos missing")
	}
	if err := d.objs.CbQos.LookupWithFlags(slot, &e, ebpf.LookupLock); err != nil {
		return e, fmt.Errorf("qos: read slot %d: %w", slot, err)
	}
	return e, nil
}

// listQoS decodes the limited endpoints (netctl bpf qos): one row per endpoint and
// limited direction (an endpoint only marked: one egress row), in the columns of the
// OVS driver's listing. A limited endpoint's interface entry lives in the cb_ifaces hash
// (ifaces.go), never in cb_iface_direct; its buckets are cb_qos at its counter slot (the
// METER column), read locked. Rates and bursts are as enforced (qosOf); DROPPED and
// DROPPED BYTES are what the direction's bucket dropped since the endpoint got its slot
// (its share of drop_rate_egress / drop_rate_ingress). PACKETS stays empty: a bucket
// counts what it drops, not what passes (cb_ep_counters has what the endpoint sent and
// received).
func (d *Driver) listQoS(n listNames, l *dataplane.Listing) error {
	l.Columns = dataplane.QoSColumns()
	var k uint32
	var v contivbpfCbIface
	it := d.objs.CbIfaces.Iterate()
	for it.Next(&k, &v) {
		if v.Qos == 0 {
			continue
		}
		id := n.epByKey[contivbpfCbEpKey{Net: v.Net, Ip: v.Ip}]
		if id == "" {
			id = fmt.Sprintf("(ifindex %d, not in the agent's state)", k)
		}
		e, err := d.qosEntry(v.Slot)
		if err != nil {
			return fmt.Errorf("endpoint %s: %w", id, err)
		}
		dscp := "-"
		if v.Qos&uint32(contivbpfCbQosFlagsCB_QOS_DSCP) != 0 {
			dscp = strconv.Itoa(int(v.Qos >> 8 & 0x3f))
		}
		meter := "slot " + strconv.Itoa(int(v.Slot))
		for _, dir := range []struct {
			name string
			flag contivbpfCbQosFlags
			b    contivbpfCbQosBucket
		}{{"egress", contivbpfCbQosFlagsCB_QOS_EGRESS, e.Out}, {"ingress", contivbpfCbQosFlagsCB_QOS_INGRESS, e.In}} {
			if v.Qos&uint32(dir.flag) == 0 {
				if dir.name == "egress" && dscp != "-" {
					l.Rows = append(l.Rows, []string{id, dir.name, "-", "-", "-", dscp, "", "", ""})
				}
				continue
			}
			mark := "-"
			if dir.name == "egress" {
				mark = dscp
			}
			rate, burst := dir.b.rate()
			l.Rows = append(l.Rows, []string{id, dir.name, meter, fmt.Sprintf("%d kbit/s", (rate+500)/1000),
				fmt.Sprintf("%d kbit", (burst*8+500)/1000), mark, "", strconv.FormatUint(dir.b.Dropped, 10), strconv.FormatUint(dir.b.DroppedBytes, 10)})
		}
	}
	sortRows(l.Rows)
	return iterErr(it.Err(), contivbpfMapCbIfaces)
}

// qosDrops sums what the limited endpoints' buckets dropped, per network and direction
// (the rate-limit drop metrics): the limited endpoints' interface entries (cb_ifaces, as
// listQoS reads them) and their buckets, no other table, and no lock (a scrape never waits
// for an endpoint apply: network names from netNames).
func (d *Driver) qosDrops() (map[dataplane.QoSDropKey]dataplane.QoSDropCount, error) {
	out := map[dataplane.QoSDropKey]dataplane.QoSDropCount{}
	add := func(k dataplane.QoSDropKey, b contivbpfCbQosBucket) {
		c := out[k]
		c.Packets += b.Dropped
		c.Bytes += b.DroppedBytes
		out[k] = c
	}
	var k uint32
	var v contivbpfCbIface
	it := d.objs.CbIfaces.Iterate()
	for it.Next(&k, &v) {
		if v.Qos&uint32(contivbpfCbQosFlagsCB_QOS_EGRESS|contivbpfCbQosFlagsCB_QOS_INGRESS) == 0 {
			continue
		}
		e, err := d.qosEntry(v.Slot)
		if err != nil {
			return nil, err
		}
		network := d.eps.netName(v.Net)
		if v.Qos&uint32(contivbpfCbQosFlagsCB_QOS_EGRESS) != 0 {
			add(dataplane.QoSDropKey{Network: network, Direction: "egress"}, e.Out)
		}
		if v.Qos&uint32(contivbpfCbQosFlagsCB_QOS_INGRESS) != 0 {
			add(dataplane.QoSDropKey{Network: network, Direction: "ingress"}, e.In)
		}
	}
	return out, iterErr(it.Err(), contivbpfMapCbIfaces)
}

// rate is the rate (bit/s) and burst (bytes) bucket b enforces (0: unlimited).
func (b contivbpfCbQosBucket) rate() (rate, burst uint64) {
	if b.Nsb == 0 {
		return 0, 0
	}
	rate = (uint64(8*time.Second) << qosNsbShift) / b.Nsb
	hi, lo := bits.Mul64(b.Tau, rate)
	if hi < uint64(8*time.Second) {
		burst, _ = bits.Div64(hi, lo, uint64(8*time.Second))
	}
	return rate, burst
}
