package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf/ringbuf"
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
}

func (e DropEvent) String() string {
	if e.Src.IsValid() {
		return fmt.Sprintf("%s if=%d %v > %v proto %d len %d", e.Reason, e.Ifindex, e.Src, e.Dst, e.Proto, e.Len)
	}
	return fmt.Sprintf("%s if=%d ethertype %#04x len %d", e.Reason, e.Ifindex, e.EtherType, e.Len)
}

// DropEvents streams drop events until ctx ends (the channel is then closed). The datapath
// emits events only while a stream is open, so they cost nothing otherwise; when the
// 256 KiB ring is full, events are lost (the per-reason counters still count every drop).
// One stream at a time.
func (d *Driver) DropEvents(ctx context.Context) (<-chan DropEvent, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.check(); err != nil {
		return nil, err
	}
	if d.eventsOn {
		return nil, errors.New("ebpf: a drop event stream is already open")
	}
	rd, err := ringbuf.NewReader(d.objs.CbEvents)
	if err != nil {
		return nil, fmt.Errorf("ebpf: open drop events: %w", err)
	}
	d.eventsOn = true
	if err := d.writeConfig(); err != nil {
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
			d.mu.Lock()
			d.eventsOn = false
			if !d.closed {
				_ = d.writeConfig()
			}
			d.mu.Unlock()
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
	return e, true
}
