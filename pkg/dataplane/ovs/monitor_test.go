package ovs

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// TestMonitorOVS: with a stream open, a connection a rule denies is reported with the
// rule, its group and direction and the 5-tuple; with allowed-flow events on, an allowed
// connection too; only one stream at a time; the switch's flows match the state while
// monitoring and after (the controller actions are gone when the stream closes).
func TestMonitorOVS(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, _ := twoHosts(t, id)
	c1, c2 := newNS(t, id, "c1"), newNS(t, id, "c2")
	d := newDriver(t, h1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbo1"+id), ep("e2", "10.1.0.2", c2, "cbo2"+id)
	e1.EPGID, e2.EPGID = 8, 7
	st := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2},
		Policies: []dataplane.PolicySet{{EPGID: 7, Rules: []dataplane.PolicyRule{
			{ID: "deny-tcp", Priority: 1, Proto: 6, Action: dataplane.ActionDeny, Ingress: true},
			{ID: "web", Priority: 10, RemoteEPG: 8, Proto: 6, Port: 80, Action: dataplane.ActionAllow, Ingress: true}}}}}
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	listen(t, c2, "10.1.0.2:80")
	dial := func(port string) {
		_ = nsexec.Run(nsPath(c1), func() error {
			c, err := net.DialTimeout("tcp4", "10.1.0.2:"+port, 300*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return nil
		})
	}
	mctx, stop := context.WithCancel(ctx)
	evs, err := d.MonitorEvents(mctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.MonitorEvents(ctx); err == nil {
		t.Error("a second stream was opened")
	}
	if drift, err := d.Verify(st); err != nil || len(drift) != 0 {
		t.Errorf("while monitoring: drift %v, err %v", drift, err)
	}
	// Dropped packets reach the agent through the monitor's meter.
	live, _, err := d.liveFlows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a := live["policy priority=103,tcp,reg2=0x7"]; !strings.Contains(a, "meter_id=") || !strings.Contains(a, "max_len=128") {
		t.Errorf("the deny rule while monitoring: actions %q", a)
	}
	meters := func() string {
		return sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-meters", "unix:"+d.mgmtSocket())
	}
	if m := meters(); !strings.Contains(m, "pktps") || !strings.Contains(m, "rate=2000") {
		t.Errorf("monitor meter:\n%s", m)
	}
	wait := func(reason, rule string, port uint16, poke func()) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			poke()
			select {
			case ev := <-evs:
				if ev.Reason == reason && ev.DstPort == port {
					if ev.Rule != rule || ev.RuleEPG != 7 || ev.RuleDir != "ingress" || ev.Src != e1.IP || ev.Dst != e2.IP || ev.Proto != 6 || ev.Network != vxNet.ID {
						t.Errorf("%s event: %+v", reason, ev)
					}
					return
				}
			case <-deadline:
				t.Fatalf("no %s event for port %d", reason, port)
			}
		}
	}
	wait("drop_policy", "deny-tcp", 22, func() { dial("22") })
	if err := d.SetAllowEvents(true); err != nil {
		t.Fatal(err)
	}
	wait("policy_allow", "web", 80, func() { dial("80") })
	if err := d.SetAllowEvents(false); err != nil {
		t.Fatal(err)
	}
	stop()
	for range evs { // closes once the flows are back
	}
	if drift, err := d.Verify(st); err != nil || len(drift) != 0 {
		t.Errorf("after the stream closed: drift %v, err %v", drift, err)
	}
	if live, _, err = d.liveFlows(ctx); err != nil {
		t.Fatal(err)
	}
	if m := meters(); strings.Contains(m, fmt.Sprintf("meter=%d ", monitorMeter)) || !strings.Contains(m, fmt.Sprintf("meter=%d ", rejectMeter)) {
		t.Errorf("the monitor's meter outlived the stream, or the reject meter went with it:\n%s", m)
	}
	for k, a := range live {
		// (The refusals and expired TTLs of the answer table go to the agent whether or
		// not it monitors.)
		agents := strings.Contains(k, "reg4=0x10/0x10") || strings.Contains(k, "reg4=0x40/0x40")
		if strings.Contains(strings.ToLower(a), "controller") && !(strings.HasPrefix(k, "answer ") && agents) {
			t.Errorf("flow %s still sends to the controller: %s", k, a)
		}
	}
	// A new stream after the last one closed.
	m2, stop2 := context.WithCancel(ctx)
	if _, err := d.MonitorEvents(m2); err != nil {
		t.Errorf("reopen: %v", err)
	}
	stop2()
}

// TestPacketInFields reads a packet-in as OVS sends one (registers and in_port in the
// match) and never reads past a truncated or lying one.
func TestPacketInFields(t *testing.T) {
	oxm := func(class uint16, field uint8, v []byte) []byte {
		return append([]byte{byte(class >> 8), byte(class), field << 1, byte(len(v))}, v...)
	}
	var match []byte
	match = append(match, oxm(0x8000, 0, []byte{0, 0, 0, 100})...) // in_port 100
	match = append(match, oxm(0x0001, 1, []byte{0, 0, 0, 8})...)   // reg1 = 8
	match = append(match, oxm(0x0001, 2, []byte{0, 0, 0, 7})...)   // reg2 = 7
	mlen := 4 + len(match)
	m := append([]byte{0, 1, byte(mlen >> 8), byte(mlen)}, match...)
	for len(m)%8 != 0 {
		m = append(m, 0)
	}
	frame := []byte("0123456789abcdef-frame")
	body := append(append(append([]byte{0xff, 0xff, 0xff, 0xff, 0, 22, ofprAction, byte(tPolicy)}, make([]byte, 8)...), m...), 0, 0)
	body = append(body, frame...)
	table, regs, port, data, ok := packetInFields(body)
	if !ok || table != tPolicy || regs[1] != 8 || regs[2] != 7 || port != 100 || string(data) != string(frame) {
		t.Fatalf("packet-in: %v %v %d %q %v", table, regs, port, data, ok)
	}
	for n := 0; n < len(body); n++ {
		packetInFields(body[:n]) // must not panic
	}
	lying := append([]byte(nil), body...)
	lying[16+3] = 200 // match length beyond the message
	if _, _, _, _, ok := packetInFields(lying); ok {
		t.Error("a match longer than the message was read")
	}
	bad := append([]byte(nil), body...)
	bad[16+4+3] = 60 // an OXM field longer than the match
	if _, _, _, _, ok := packetInFields(bad); ok {
		t.Error("an OXM field longer than its match was read")
	}
}

// TestPacketInNeverBlocks: the OpenFlow read loop hands packet-ins on without waiting;
// beyond what the stream holds they are counted lost, and with no stream open ignored.
func TestPacketInNeverBlocks(t *testing.T) {
	d := &Driver{}
	d.packetIn([]byte("no stream")) // nothing open: dropped, no panic
	d.monRaw = make(chan []byte, 2)
	for i := 0; i < 5; i++ {
		d.packetIn([]byte{byte(i)})
	}
	if len(d.monRaw) != 2 || d.monLost.Load() != 3 {
		t.Errorf("queued %d, lost %d; want 2 and 3", len(d.monRaw), d.monLost.Load())
	}
}
