package ebpf

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

func TestDropEventsProgram(t *testing.T) {
	objs := loadTestObjects(t)
	rd, err := ringbuf.NewReader(objs.CbEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	unknown := netip.MustParseAddr("10.1.0.99")

	// Off: drops are counted, not reported.
	run(t, objs, objs.CbFromContainer, ipFrame(srcIP, unknown, ipOpts{}), nil).expect(t, tcActShot, DropUnknownDst)
	rd.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("event while events are off: %v", err)
	}

	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_EVENTS))
	p := ipFrame(srcIP, unknown, ipOpts{})
	run(t, objs, objs.CbFromContainer, p, nil).expect(t, tcActShot, DropUnknownDst)
	rd.SetDeadline(time.Now().Add(time.Second))
	rec, err := rd.Read()
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := decodeEvent(rec.RawSample)
	if !ok || ev.Reason != DropUnknownDst || ev.Src != srcIP || ev.Dst != unknown || ev.Proto != 6 ||
		ev.EtherType != 0x0800 || ev.Len != uint32(len(p)) || ev.Ifindex != loIfindex {
		t.Errorf("event %+v", ev)
	}
	t.Logf("event: %v", ev)
	// Forwarded packets are not reported.
	run(t, objs, objs.CbFromContainer, ipFrame(srcIP, localIP, ipOpts{}), nil).expect(t, tcActRedirect, FwdLocal)
	rd.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("event for a forwarded packet: %v", err)
	}
}

func TestDropEventsDriver(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	if err := h.d.UpsertEndpoint(ctx, a); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	evs, err := h.d.DropEvents(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.DropEvents(sctx); err == nil {
		t.Error("second stream opened")
	}
	if h.features(t)&uint32(contivbpfCbFeaturesCB_FEAT_EVENTS) == 0 {
		t.Error("events feature bit not set while streaming")
	}
	_ = pingOnce(a.NetNS, "10.50.0.99") // ARP for an unknown address is dropped
	timeout := time.After(3 * time.Second)
	for found := false; !found; {
		select {
		case ev := <-evs:
			// The container's IPv6 chatter (drop_not_ipv4) is reported too.
			t.Logf("event: %v", ev)
			found = ev.Reason == DropARPUnknownTarget && ev.EtherType == 0x0806
		case <-timeout:
			t.Fatal("no drop event for the unanswered ARP request")
		}
	}
	cancel()
	for range evs {
	}
	deadline := time.Now().Add(2 * time.Second)
	for h.features(t)&uint32(contivbpfCbFeaturesCB_FEAT_EVENTS) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("events feature bit still set after the stream ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
