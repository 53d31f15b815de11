package ebpf

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
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
	ev, ok := nextEvent(t, rd)
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

// nextEvent reads the next drop event the programs reported, waiting a second at most.
func nextEvent(t *testing.T, rd *ringbuf.Reader) (DropEvent, bool) {
	t.Helper()
	rd.SetDeadline(time.Now().Add(time.Second))
	rec, err := rd.Read()
	if err != nil {
		t.Fatal(err)
	}
	return decodeEvent(rec.RawSample)
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

// TestPolicyDropNamesRule: with events on, a policy drop reports which rule denied it
// (group, direction, position), for ingress and egress rules and for the deny that wins a
// priority tie; a policy drop without a rule (a group failed closed) reports none, and a
// recorded verdict never leaks into a later event.
func TestPolicyDropNamesRule(t *testing.T) {
	objs := loadTestObjects(t)
	rd, err := ringbuf.NewReader(objs.CbEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_EVENTS|contivbpfCbFeaturesCB_FEAT_ALLOW_EVENTS))
	setEPG(t, objs, srcIP, 10)
	setEPG(t, objs, localIP, 20)
	setEPG(t, objs, remoteIP, 30)
	in20 := dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "t:p:deny-syn", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "t:p:allow-80", Priority: 5, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
		{ID: "t:p:tie-allow", Priority: 7, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionAllow},
		{ID: "t:p:tie-deny", Priority: 7, Ingress: true, Proto: 17, Port: 53, Action: dataplane.ActionDeny},
	}}
	eg10 := dataplane.PolicySet{EPGID: 10, Rules: []dataplane.PolicyRule{
		{ID: "t:q:no-udp-out", Priority: 3, Remote: netip.MustParsePrefix("10.1.0.4/32"), Proto: 17, Action: dataplane.ActionDeny},
	}}
	putPolicy(t, objs, in20)
	putPolicy(t, objs, eg10)
	next := func() DropEvent {
		t.Helper()
		rd.SetDeadline(time.Now().Add(time.Second))
		rec, err := rd.Read()
		if err != nil {
			t.Fatal(err)
		}
		ev, ok := decodeEvent(rec.RawSample)
		if !ok {
			t.Fatal("undecodable event")
		}
		return ev
	}
	idOf := func(p dataplane.PolicySet, dir string, i uint32) string {
		eg, in, err := compileRuleSet(p)
		if err != nil {
			t.Fatal(err)
		}
		rs := eg
		if dir == "ingress" {
			rs = in
		}
		return rs[i].id
	}
	fc := objs.CbFromContainer
	for _, c := range []struct {
		name   string
		frame  []byte
		epg    uint16
		dir    string
		rule   string
		policy dataplane.PolicySet
	}{
		{"ingress-syn", l4Frame(6, srcIP, localIP, 40001, 22, tcpSYN, 0), 20, "ingress", "t:p:deny-syn", in20},
		{"ingress-tie", l4Frame(17, srcIP, localIP, 40003, 53, 0, 0), 20, "ingress", "t:p:tie-deny", in20},
		{"egress-prefix", l4Frame(17, srcIP, remoteIP, 40004, 9999, 0, 0), 10, "egress", "t:q:no-udp-out", eg10},
	} {
		run(t, objs, fc, c.frame, nil).expect(t, tcActShot, DropPolicy)
		ev := next()
		_, _, sport, dport := checkSums(t, c.frame)
		if ev.Reason != DropPolicy || ev.RuleEPG != c.epg || ev.RuleDir != c.dir || idOf(c.policy, c.dir, ev.RuleIndex) != c.rule ||
			ev.SrcPort != sport || ev.DstPort != dport {
			t.Errorf("%s: event %+v, want rule %s of epg %d %s", c.name, ev, c.rule, c.epg, c.dir)
		}
	}
	// A flow a rule allows is reported as policy_allow with that rule (monitor's allowed
	// verdicts); it leaves nothing for the next drop, which carries no rule.
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40100, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	if ev := next(); ev.Reason != PolicyAllow || ev.RuleEPG != 20 || ev.RuleDir != "ingress" || idOf(in20, "ingress", ev.RuleIndex) != "t:p:allow-80" ||
		ev.SrcPort != 40100 || ev.DstPort != 80 {
		t.Errorf("allowed flow event: %+v", ev)
	}
	// Without the allow-events bit, allowed flows emit nothing.
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_EVENTS))
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40101, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, ipFrame(srcIP, netip.MustParseAddr("10.1.0.99"), ipOpts{}), nil).expect(t, tcActShot, DropUnknownDst)
	if ev := next(); ev.RuleEPG != 0 || ev.Reason != DropUnknownDst {
		t.Errorf("unknown-destination drop carries a rule: %+v", ev)
	}
	// Fail closed: denied without a rule.
	if err := objs.CbEpgs.Put(uint32(20), &contivbpfCbEpgState{Flags: uint32(contivbpfCbEpgFlagsCB_EPG_DENY_ALL)}); err != nil {
		t.Fatal(err)
	}
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 40200, 80, tcpSYN, 0), nil).expect(t, tcActShot, DropPolicy)
	if ev := next(); ev.Reason != DropPolicy || ev.RuleEPG != 0 {
		t.Errorf("fail-closed drop names a rule: %+v", ev)
	}
}

// TestMonitorStreamReleasedOnClose: when a monitor stream's channel closes, the driver's one
// event stream is free again, also when the stream was cancelled with undelivered events
// (a client reconnecting at once got "already open": seen in CI as a 503 from /monitor).
func TestMonitorStreamReleasedOnClose(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		sctx, cancel := context.WithCancel(ctx)
		evs, err := h.d.MonitorEvents(sctx)
		if err != nil {
			cancel()
			t.Fatalf("round %d: %v", i, err)
		}
		// More drops than the channels hold, none read: the stream is blocked sending.
		for j := 0; j < 700; j++ {
			if _, _, err := h.d.objs.CbFromContainer.Test(ipFrame(srcIP, localIP, ipOpts{})); err != nil {
				cancel()
				t.Fatal(err)
			}
		}
		cancel()
		for range evs {
		}
	}
	if _, err := h.d.MonitorEvents(ctx); err != nil {
		t.Fatalf("after the last stream closed: %v", err)
	}
}
