package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// DropEvent is one packet the datapath dropped, reported while a stream is open.
type DropEvent struct {
	Time      time.Duration `json:"time"` // CLOCK_MONOTONIC (bpf_ktime_get_ns)
	Reason    Reason        `json:"reason"`
	Ifindex   uint32        `json:"ifindex"` // device the packet arrived on
	Len       uint32        `json:"len"`
	EtherType uint16        `json:"etherType"`
	Proto     uint8         `json:"proto,omitempty"`
	Src       netip.Addr    `json:"src,omitzero"` // IPv4 packets only
	Dst       netip.Addr    `json:"dst,omitzero"`
	SrcPort   uint16        `json:"srcPort,omitempty"` // TCP/UDP, first or only fragment
	DstPort   uint16        `json:"dstPort,omitempty"`
	// A policy drop decided by a rule: the group whose rules held it, the direction
	// ("ingress" or "egress"), the rule's position there and its id as the agent
	// installed it (netmaster's policyRule id). RuleEPG 0: no rule (a group failed closed).
	RuleEPG   uint16 `json:"ruleEPG,omitempty"`
	RuleDir   string `json:"ruleDir,omitempty"`
	RuleIndex uint32 `json:"ruleIndex,omitempty"`
	Rule      string `json:"rule,omitempty"`
}

func (e DropEvent) String() string {
	if e.Src.IsValid() {
		rule := ""
		if e.RuleEPG != 0 {
			rule = fmt.Sprintf(" rule %q (epg %d %s #%d)", e.Rule, e.RuleEPG, e.RuleDir, e.RuleIndex+1)
		}
		if e.SrcPort != 0 || e.DstPort != 0 {
			return fmt.Sprintf("%s if=%d %v:%d > %v:%d proto %d len %d%s", e.Reason, e.Ifindex, e.Src, e.SrcPort, e.Dst, e.DstPort, e.Proto, e.Len, rule)
		}
		return fmt.Sprintf("%s if=%d %v > %v proto %d len %d%s", e.Reason, e.Ifindex, e.Src, e.Dst, e.Proto, e.Len, rule)
	}
	return fmt.Sprintf("%s if=%d ethertype %#04x len %d", e.Reason, e.Ifindex, e.EtherType, e.Len)
}

// DropEvents streams drop events until ctx ends (the channel is then closed). The datapath
// emits events only while a stream is open, so they cost nothing otherwise; when the
// 256 KiB ring is full, events are lost (the per-reason counters still count every drop).
// One stream at a time.
func (d *Driver) DropEvents(ctx context.Context) (<-chan DropEvent, error) {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return nil, err
	}
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	if d.eventsOn {
		return nil, errors.New("ebpf: a drop event stream is already open")
	}
	rd, err := ringbuf.NewReader(d.objs.CbEvents)
	if err != nil {
		return nil, fmt.Errorf("ebpf: open drop events: %w", err)
	}
	d.eventsOn = true
	if err := d.writeConfigLocked(); err != nil {
		d.eventsOn = false
		rd.Close()
		return nil, err
	}
	ch := make(chan DropEvent, 256)
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stop:
		}
		rd.Close()
	}()
	go func() {
		defer close(ch)
		defer func() {
			close(stop)
			defer d.lock(0, 0)()
			d.cfgMu.Lock()
			defer d.cfgMu.Unlock()
			d.eventsOn, d.allowEvents = false, false
			if !d.closed {
				_ = d.writeConfigLocked()
			}
		}()
		for {
			rec, err := rd.Read()
			if err != nil {
				return // closed
			}
			ev, ok := decodeEvent(rec.RawSample)
			if !ok {
				continue
			}
			if ev.RuleEPG != 0 {
				ev.Rule = d.ruleID(ev.RuleEPG, ev.RuleDir, ev.RuleIndex)
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

func decodeEvent(b []byte) (DropEvent, bool) {
	if len(b) < 32 {
		return DropEvent{}, false
	}
	ne := binary.NativeEndian
	e := DropEvent{
		Time:      time.Duration(ne.Uint64(b[0:])),
		Reason:    Reason(ne.Uint32(b[8:])),
		Ifindex:   ne.Uint32(b[12:]),
		Len:       ne.Uint32(b[16:]),
		EtherType: ne.Uint16(b[28:]),
		Proto:     b[30],
	}
	if e.EtherType == 0x0800 {
		e.Src = netip.AddrFrom4([4]byte(b[20:24]))
		e.Dst = netip.AddrFrom4([4]byte(b[24:28]))
	}
	if len(b) >= 40 {
		if e.RuleEPG = ne.Uint16(b[32:]); e.RuleEPG != 0 {
			e.RuleDir = "egress"
			if b[31] == uint8(contivbpfCbPolDirCB_DIR_INGRESS) {
				e.RuleDir = "ingress"
			}
			e.RuleIndex = ne.Uint32(b[36:])
		}
	}
	if len(b) >= 44 {
		e.SrcPort = binary.BigEndian.Uint16(b[40:])
		e.DstPort = binary.BigEndian.Uint16(b[42:])
	}
	return e, true
}

// ruleIDs are one group's rule ids in map order, per direction, as of a revision of the
// policies (policyIndex.rev).
type ruleIDs struct {
	rev             uint32
	egress, ingress []string
}

// ruleID names the rule at index of group epg's rules of direction dir, as the agent
// installed them ("" when the group has no such rule now).
func (d *Driver) ruleID(epg uint16, dir string, index uint32) string {
	defer d.lock(0, cPols)()
	return d.ruleIDLocked(epg, dir, index)
}

// ruleIDLocked is ruleID for callers holding pols' lock (either way: the cache has its
// own).
func (d *Driver) ruleIDLocked(epg uint16, dir string, index uint32) string {
	d.pols.ruleMu.Lock()
	defer d.pols.ruleMu.Unlock()
	c, ok := d.pols.ruleIDs[epg]
	if !ok || c.rev != d.pols.rev {
		p, has := d.pols.policies[epg]
		if !has {
			return ""
		}
		eg, in, err := compileRuleSet(p)
		if err != nil {
			return ""
		}
		c = ruleIDs{rev: d.pols.rev}
		for _, r := range eg {
			c.egress = append(c.egress, r.id)
		}
		for _, r := range in {
			c.ingress = append(c.ingress, r.id)
		}
		d.pols.ruleIDs[epg] = c
	}
	ids := c.egress
	if dir == "ingress" {
		ids = c.ingress
	}
	if int(index) < len(ids) {
		return ids[index]
	}
	return ""
}

// MonitorEvents is DropEvents in the dataplane's driver-neutral form, with wall-clock times.
func (d *Driver) MonitorEvents(ctx context.Context) (<-chan dataplane.MonitorEvent, error) {
	in, err := d.DropEvents(ctx)
	if err != nil {
		return nil, err
	}
	out := make(chan dataplane.MonitorEvent, 256)
	go func() {
		defer close(out)
		for ev := range in {
			when := time.Now()
			if now, err := monotonicRaw(); err == nil && now >= uint64(ev.Time) {
				when = when.Add(-time.Duration(now - uint64(ev.Time)))
			}
			m := dataplane.MonitorEvent{Time: when, Reason: ev.Reason.String(), Ifindex: ev.Ifindex, Len: ev.Len,
				EtherType: ev.EtherType, Proto: ev.Proto, Src: ev.Src, Dst: ev.Dst, SrcPort: ev.SrcPort, DstPort: ev.DstPort,
				RuleEPG: ev.RuleEPG, RuleDir: ev.RuleDir, Rule: ev.Rule, Network: d.ifaceNetwork(ev.Ifindex)}
			select {
			case out <- m:
			case <-ctx.Done():
				// out closes only once the driver has released its stream (in closes
				// after that): a client that reconnects when out closed must find it free.
				for range in {
				}
				return
			}
		}
	}()
	return out, nil
}

// monotonicRaw is the clock of bpf_ktime_get_ns (CLOCK_MONOTONIC).
func monotonicRaw() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec), nil
}

// ifaceNetwork is the network of the local endpoint on host interface ifindex, or "".
func (d *Driver) ifaceNetwork(ifindex uint32) string {
	defer d.lock(0, cEps)()
	for _, r := range d.eps.endpoints {
		if uint32(r.ifindex) == ifindex {
			for id, n := range d.eps.networks {
				if n.key == r.key.Net {
					return id
				}
			}
		}
	}
	return ""
}

// SetAllowEvents turns the policy_allow events of an open stream on or off (one event per
// new flow a rule allows: worth paying only while somebody asks for them).
func (d *Driver) SetAllowEvents(on bool) error {
	defer d.lock(0, 0)()
	if err := d.check(); err != nil {
		return err
	}
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	if d.allowEvents == on {
		return nil
	}
	d.allowEvents = on
	return d.writeConfigLocked()
}
