package ovs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/policy"
)

// Drop events (netctl monitor) on OVS. While a stream is open, every flow of the pipeline
// that drops (no actions, no next table) also sends the packet's first monitorMaxLen
// bytes to the driver's OpenFlow connection (output:CONTROLLER), and with allowed-flow
// events on, so do the policy rules that allow (they only ever see the first packet of a
// connection: established ones bypass the table). A packet-in names the table (the
// reason, in the eBPF datapath's words) and carries the pipeline's registers (source and
// destination group, VRF), with which the Go policy model names the rule. With nobody
// watching the flows only drop: the monitor costs nothing then.

const (
	monitorMaxLen = 128 // bytes of a packet sent to the driver
	ofprAction    = 1   // OFPR_ACTION: a packet-in an output:CONTROLLER action sent

	// Packets reach the driver through a meter: beyond monitorRate per second (bursts
	// of monitorBurst) the datapath drops the copies meant for the agent, so a container
	// flooding denied packets (or SYNs to an allowed port) at a watched host costs
	// vswitchd and the agent little. The meter exists only while a stream is open.
	monitorMeter = 0xcb01
	monitorRate  = 2000
	monitorBurst = 500
)

// install is the flow mod that adds f with cookie: with the controller action while
// monitoring asks for f's packets (see monitored).
func (d *Driver) install(f *flow, cookie uint64) *of.FlowMod {
	fm := f.flowMod(of.FC_ADD, cookie)
	if monitored(f, d.monitoring, d.allowEvents) {
		addController(fm, d.meter)
	}
	return fm
}

// controller2 is Nicira's controller action (NXAST_CONTROLLER2) with a maximum length
// and, when meter is set, the meter the packet-in passes first: only the copy sent to
// the agent is metered, the packet itself goes on (an allowing rule's connection is not
// slowed).
type controller2 struct {
	maxLen uint16
	meter  uint32 // 0: none
}

func (c *controller2) Header() *of.ActionHeader {
	return &of.ActionHeader{Type: of.ActionType_Experimenter, Length: c.Len()}
}

func (c *controller2) Len() uint16 {
	if c.meter != 0 {
		return 16 + 8 + 8
	}
	return 16 + 8
}

func (c *controller2) MarshalBinary() ([]byte, error) {
	b := make([]byte, c.Len())
	binary.BigEndian.PutUint16(b[0:], of.ActionType_Experimenter)
	binary.BigEndian.PutUint16(b[2:], c.Len())
	binary.BigEndian.PutUint32(b[4:], 0x00002320) // Nicira
	binary.BigEndian.PutUint16(b[8:], 37)         // NXAST_CONTROLLER2; 6 zero bytes follow
	p := b[16:]
	binary.BigEndian.PutUint16(p[0:], 0) // NXAC2PT_MAX_LEN, u16 (length 6, padded to 8)
	binary.BigEndian.PutUint16(p[2:], 6)
	binary.BigEndian.PutUint16(p[4:], c.maxLen)
	if c.meter != 0 {
		p = p[8:]
		binary.BigEndian.PutUint16(p[0:], 5) // NXAC2PT_METER_ID, u32
		binary.BigEndian.PutUint16(p[2:], 8)
		binary.BigEndian.PutUint32(p[4:], c.meter)
	}
	return b, nil
}

func (c *controller2) UnmarshalBinary([]byte) error {
	return errors.New("controller2: decoding is not needed")
}

// meterMod is an OFPT_METER_MOD body: command (0 add, 2 delete), flags packets per
// second with a burst, one drop band of rate packets per second and burst packets.
func meterMod(command uint16, id, rate, burst uint32) []byte {
	b := make([]byte, 8+16)
	binary.BigEndian.PutUint16(b[0:], command)
	binary.BigEndian.PutUint16(b[2:], 0x2|0x4|0x8) // OFPMF_PKTPS | OFPMF_BURST | OFPMF_STATS
	binary.BigEndian.PutUint32(b[4:], id)
	band := b[8:]
	binary.BigEndian.PutUint16(band[0:], 1) // OFPMBT_DROP
	binary.BigEndian.PutUint16(band[2:], 16)
	binary.BigEndian.PutUint32(band[4:], rate)
	binary.BigEndian.PutUint32(band[8:], burst)
	return b
}

// setMeter adds (on) or deletes the monitor's meter and sets d.meter: whether flows use
// it. An OVS that refuses the meter leaves the monitor unmetered (logged).
func (d *Driver) setMeter(ctx context.Context, on bool) {
	if !on {
		_ = d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(2, monitorMeter, monitorRate, monitorBurst)))
		d.meter = false
		return
	}
	err := d.addMeter(ctx, monitorMeter, monitorRate, monitorBurst)
	d.meter = err == nil
	if err != nil {
		d.log.Warn("monitor: no meter for the packets sent to the agent (unmetered)", "err", err)
	}
}

// addMeter (re)installs meter id: one left by an agent that stopped would make a plain
// add fail, so it is deleted first.
func (d *Driver) addMeter(ctx context.Context, id, rate, burst uint32) error {
	_ = d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(2, id, rate, burst)))
	return d.conn.request(ctx, d.conn.newMsg(ofptMeterMod, meterMod(0, id, rate, burst)))
}

// monitored says whether f sends its packets to the driver: a dropping flow while
// monitoring, a rule that allows while allowed-flow events are on too.
func monitored(f *flow, monitoring, allowed bool) bool {
	if !monitoring {
		return false
	}
	if len(f.actions) == 0 && f.gotoTable < 0 {
		return true
	}
	return allowed && f.table == tPolicy && f.rule != "" && f.gotoTable >= 0
}

// addController makes fm send the packet to the controller before anything else it does
// (the copy through the monitor's meter if metered).
func addController(fm *of.FlowMod, metered bool) {
	out := &controller2{maxLen: monitorMaxLen}
	if metered {
		out.meter = monitorMeter
	}
	for _, in := range fm.Instructions {
		if apply, ok := in.(*of.InstrActions); ok && apply.InstrHeader.Type == of.InstrType_APPLY_ACTIONS {
			_ = apply.AddAction(out, true)
			return
		}
	}
	apply := of.NewInstrApplyActions()
	_ = apply.AddAction(out, false)
	fm.Instructions = append([]of.Instruction{apply}, fm.Instructions...)
}

// MonitorEvents implements the agent's event source: drop events until ctx ends, with the
// QoS meters' drops as counted events (qosDropEvents). One stream at a time. Packet-ins are read by the OpenFlow read loop, which must not wait
// for the driver lock (a bundle holding it waits for that loop): it hands them to a
// goroutine that names them.
func (d *Driver) MonitorEvents(ctx context.Context) (<-chan dataplane.MonitorEvent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.monMu.Lock()
	open := d.monRaw != nil
	d.monMu.Unlock()
	if open {
		return nil, errors.New("a drop event stream is already open")
	}
	d.monitoring = true
	d.setMeter(ctx, true)
	if err := d.reinstallMonitored(ctx); err != nil {
		d.monitoring = false
		d.setMeter(ctx, false)
		return nil, fmt.Errorf("ovs: monitor: %w", err)
	}
	raw := make(chan []byte, 1024)
	out := make(chan dataplane.MonitorEvent, 64)
	d.monMu.Lock()
	d.monRaw = raw
	d.monMu.Unlock()
	qos := make(chan dataplane.MonitorEvent, 64)
	go d.qosDropEvents(ctx, qos)
	go func() { // names the packets, passes the meters' drops on
		defer close(out)
		in, qos := raw, qos
		for in != nil || qos != nil {
			var ev dataplane.MonitorEvent
			select {
			case body, ok := <-in:
				if !ok {
					in = nil
					continue
				}
				if ev, ok = d.packetInEvent(body); !ok {
					continue
				}
			case e, ok := <-qos:
				if !ok {
					qos = nil
					continue
				}
				ev = e
			}
			select {
			case out <- ev:
			case <-ctx.Done():
			}
		}
	}()
	go func() { // ends the stream
		<-ctx.Done()
		d.mu.Lock()
		d.monitoring, d.allowEvents = false, false
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := d.reinstallMonitored(rctx); err != nil {
			d.log.Warn("monitor closed: flows still send packets to the agent (dropped) until the next full resync", "err", err)
		} else {
			d.setMeter(rctx, false)
		}
		cancel()
		d.mu.Unlock()
		d.monMu.Lock()
		close(d.monRaw)
		d.monRaw = nil
		d.monMu.Unlock()
	}()
	return out, nil
}

// SetAllowEvents implements the agent's event source: events for new connections a rule
// allowed too (only while a stream is open).
func (d *Driver) SetAllowEvents(on bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.allowEvents == on {
		return nil
	}
	d.allowEvents = on
	if !d.monitoring {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.reinstallMonitored(ctx)
}

// reinstallMonitored sends again every flow whose controller action monitoring adds or
// takes away (dropping flows, allowing rules), in one bundle, and empties the datapath
// cache so cached drops see it. Call with d.mu held.
func (d *Driver) reinstallMonitored(ctx context.Context) error {
	var msgs [][]byte
	cookie := cookieFor(d.gen)
	for _, f := range d.comp.flows {
		if !monitored(f, true, true) {
			continue
		}
		m, err := d.conn.marshal(d.install(f, cookie))
		if err != nil {
			return fmt.Errorf("encode %s: %w", f, err)
		}
		msgs = append(msgs, m)
	}
	if err := d.conn.bundle(ctx, msgs); err != nil {
		return err
	}
	d.purge(ctx)
	return nil
}

// packetIn passes a packet a monitored flow sent on to be named. It runs in the
// OpenFlow read loop: it never blocks (events beyond what the stream holds are lost).
func (d *Driver) packetIn(body []byte) {
	if table, regs, inPort, data, ok := packetInFields(body); ok && isReject(table, regs) {
		d.reject(inPort, data)
	} else if ok && isTTLExpired(table, regs) {
		d.ttlExceeded(inPort, regs[regSvcIP], data)
	}
	d.monMu.Lock()
	defer d.monMu.Unlock()
	if d.monRaw == nil {
		return
	}
	select {
	case d.monRaw <- body:
	default:
		d.monLost.Add(1)
	}
}

// packetInFields reads an OpenFlow 1.3 packet-in: the table, the registers and in_port
// of its match, and the packet.
func packetInFields(body []byte) (table tableID, regs [8]uint32, inPort uint32, data []byte, ok bool) {
	// buffer_id(4) total_len(2) reason(1) table_id(1) cookie(8) ofp_match pad(2) data
	if len(body) < 16+4 {
		return
	}
	table = tableID(body[7])
	m := body[16:]
	mtype, mlen := binary.BigEndian.Uint16(m), int(binary.BigEndian.Uint16(m[2:]))
	if mtype != 1 || mlen < 4 || len(m) < (mlen+7)/8*8+2 {
		return
	}
	oxm := m[4:mlen]
	for len(oxm) >= 4 {
		hdr := binary.BigEndian.Uint32(oxm)
		n := int(hdr & 0xff)
		if len(oxm) < 4+n {
			return
		}
		class, field, hasMask := hdr>>16, (hdr>>9)&0x7f, hdr&0x100 != 0
		v := oxm[4 : 4+n]
		switch {
		case class == 0x0001 && field < 8 && !hasMask && n == 4: // NXM_NX_REG0..7
			regs[field] = binary.BigEndian.Uint32(v)
		case class == 0x8000 && field == 0 && n == 4: // OXM_OF_IN_PORT
			inPort = binary.BigEndian.Uint32(v)
		}
		oxm = oxm[4+n:]
	}
	return table, regs, inPort, m[(mlen+7)/8*8+2:], true
}

// packetInEvent builds the event for a packet-in.
func (d *Driver) packetInEvent(body []byte) (dataplane.MonitorEvent, bool) {
	table, regs, inPort, data, ok := packetInFields(body)
	if !ok {
		return dataplane.MonitorEvent{}, false
	}
	// Ifindex carries the OpenFlow port the packet came in on; Len its whole length.
	ev := dataplane.MonitorEvent{Time: time.Now(), Ifindex: inPort, Len: uint32(binary.BigEndian.Uint16(body[4:]))}
	if len(data) >= 14 {
		ev.EtherType = binary.BigEndian.Uint16(data[12:])
	}
	ev.Reason = dropReason(table, ev.EtherType)
	if isReject(table, regs) {
		ev.Reason = "reject_no_backend"
	}
	if isTTLExpired(table, regs) {
		ev.Reason = "reject_ttl_exceeded"
	}
	_, _, src, dst, proto, _, sport, dport, isIP := dataplane.TraceFrameFields(data)
	if isIP {
		ev.Src, ev.Dst, ev.Proto = src, dst, proto
		if proto == 6 || proto == 17 {
			ev.SrcPort, ev.DstPort = sport, dport
		}
	}
	d.mu.Lock() // never in the read loop (MonitorEvents)
	defer d.mu.Unlock()
	for id, p := range d.ports.endpoints {
		if p == inPort {
			ev.Network = d.state.Endpoints[id].NetworkID
		}
	}
	if table == tPolicy && isIP {
		sets := make([]dataplane.PolicySet, 0, len(d.state.Policies))
		for _, ps := range d.state.Policies {
			sets = append(sets, ps)
		}
		pk := policy.Packet{SrcEPG: uint16(regs[regSrcEPG]), DstEPG: uint16(regs[regDstEPG]), SrcIP: src, DstIP: dst,
			Proto: proto, SYN: proto == 6} // the policy table judges every TCP packet it sees as a SYN (pipeline.go policyFlows)
		if proto == 6 || proto == 17 {
			pk.DstPort = dport
		}
		if v := policy.Decide(sets, pk); v.RuleID != "" {
			ev.Rule, ev.RuleEPG, ev.RuleDir = v.RuleID, v.EPGID, "egress"
			if v.Ingress {
				ev.RuleDir = "ingress"
			}
			if v.Allowed() {
				ev.Reason = "policy_allow"
			}
		}
	}
	return ev, true
}
