package ovs

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestCompileQoS: an endpoint with a QoS sends its IPv4 through table qos (its egress
// meter, its DSCP set) and receives through its ingress meter; one without sends straight
// to arp and no flow of it names a QoS meter.
func TestCompileQoS(t *testing.T) {
	host := dataplane.HostConfig{FwdMode: dataplane.FwdBridge}
	st := testState()
	ep := st.Endpoints["e1"]
	ep.QoS = dataplane.QoS{EgressRate: 10e6, EgressBurst: 625_000, IngressRate: 20e6, DSCP: 46, SetDSCP: true}
	st.Endpoints["e1"] = ep
	all := compileTexts(t, st, host, testPorts, newIDs())
	wantFlows(t, all,
		"table=classifier,priority=100,in_port=100,vlan_tci=0x0000/0x1fff,dl_type=0x0800,dl_src=02:02:0a:01:00:01,nw_src=10.1.0.1 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:16385->reg9,goto_table:qos",
		// 0xcb300064, 0xcb400064: port 100's egress and ingress meters
		"table=qos,priority=100,in_port=100,dl_type=0x0800 actions=meter:3408920676,set_field:46->ip_dscp,goto_table:arp",
		"table=qos,priority=0, actions=drop",
		"actions=meter:3409969252,output:100",
	)
	// ARP is not metered.
	wantFlows(t, all, "arp_sha=02:02:0a:01:00:01 actions=load:5000->reg0,load:7->reg1,load:1->reg3,load:1->reg8,load:16385->reg9,goto_table:arp")

	// DSCP alone: table qos without a meter; nothing received is metered.
	ep.QoS = dataplane.QoS{DSCP: 10, SetDSCP: true}
	st.Endpoints["e1"] = ep
	all = compileTexts(t, st, host, testPorts, newIDs())
	wantFlows(t, all, "table=qos,priority=100,in_port=100,dl_type=0x0800 actions=set_field:10->ip_dscp,goto_table:arp")
	if hasQoSMeter(all) {
		t.Errorf("a DSCP-only QoS compiled a QoS meter:\n%s", all)
	}

	ep.QoS = dataplane.QoS{}
	st.Endpoints["e1"] = ep
	all = compileTexts(t, st, host, testPorts, newIDs())
	if strings.Contains(all, "goto_table:qos") || strings.Contains(all, "table=qos,priority=100") || hasQoSMeter(all) {
		t.Errorf("an endpoint without QoS goes through table qos or a QoS meter:\n%s", all)
	}

	// What a meter cannot express is refused for that endpoint.
	ep.QoS = dataplane.QoS{EgressRate: 1 << 62}
	st.Endpoints["e1"] = ep
	if _, err := testPipeline(t).compile(st, host, testPorts, newIDs()); err == nil || !strings.Contains(err.Error(), "e1") {
		t.Errorf("a rate beyond a meter's fields: %v", err)
	}
}

// TestQoSBands: rates round up to kbit/s, bursts to kbit; no burst is the default; a
// burst below one frame is raised to one, and one below 2 ms of the rate to 2 ms (a
// userspace meter refills by the millisecond: at 200 Mbit/s a burst of 160 kbit let
// iperf3 move nothing for 117 s).
func TestQoSBands(t *testing.T) {
	for _, c := range []struct {
		rate, burst uint64
		want        qosBand
	}{
		{10e6, 625_000, qosBand{10_000, 5_000}},
		{10e6, 0, qosBand{10_000, 2_500}},
		{1e9, 0, qosBand{1_000_000, 250_000}}, // 250 ms
		{1500, 100, qosBand{2, 13}},
		{10e6, 100, qosBand{10_000, 20}},             // 2 ms of 10 Mbit/s: 2,500 bytes
		{200e6, 20_000, qosBand{200_000, 400}},       // 0.8 ms raised to 2 ms
		{1e9, 1_310_750, qosBand{1_000_000, 10_486}}, // Contiv's largest burst: as written
		{1e9, 20_000, qosBand{1_000_000, 2_000}},
	} {
		got, err := qosBandOf(c.rate, c.burst)
		if err != nil || got != c.want {
			t.Errorf("qosBandOf(%d, %d) = %+v, %v; want %+v", c.rate, c.burst, got, err, c.want)
		}
	}
	// Near 2^64 rate+999 and burst*8 wrapped to a zero band that was accepted.
	for _, c := range [][2]uint64{{math.MaxUint64, 1 << 61}, {10e6, 1 << 61}, {math.MaxUint64 - 500, 2000}} {
		if got, err := qosBandOf(c[0], c[1]); err == nil {
			t.Errorf("qosBandOf(%d, %d) = %+v, want refused", c[0], c[1], got)
		}
	}
	m, err := qosMeters(100, dataplane.QoS{EgressRate: 1e6, IngressRate: 2e6})
	if err != nil || len(m) != 2 || m[qosEgressMeterID(100)].kbps != 1000 || m[qosIngressMeterID(100)].kbps != 2000 {
		t.Errorf("qosMeters = %v, %v", m, err)
	}
	if e, ok := isQoSMeter(qosIngressMeterID(7)); !ok || e {
		t.Error("ingress meter id not recognised")
	}
	if _, ok := isQoSMeter(fragMeterID(7)); ok {
		t.Error("a fragment meter taken for a QoS meter")
	}
}

// hasQoSMeter says whether a flow of all names port 100's egress or ingress meter.
func hasQoSMeter(all string) bool {
	return strings.Contains(all, "meter:3408920676") || strings.Contains(all, "meter:3409969252")
}

// TestQoSListing: netctl bpf qos shows each limited direction's meter as installed with
// what passed and what it dropped (packets and bytes), a DSCP-only endpoint its
// marking, others nothing.
func TestQoSListing(t *testing.T) {
	st := dataplane.NewIndex()
	st.Endpoints["a"] = dataplane.Endpoint{ID: "a", QoS: dataplane.QoS{EgressRate: 10e6, IngressRate: 20e6, IngressBurst: 1e6, DSCP: 46, SetDSCP: true}}
	st.Endpoints["b"] = dataplane.Endpoint{ID: "b", QoS: dataplane.QoS{DSCP: 8, SetDSCP: true}}
	st.Endpoints["c"] = dataplane.Endpoint{ID: "c"}
	p := ports{endpoints: map[string]uint32{"a": 100, "b": 101, "c": 102}}
	var l dataplane.Listing
	qosRows(&l, st, p, []meterStat{{ID: qosEgressMeterID(100), Packets: 50, Dropped: 7, DroppedBytes: 9800}})
	got := map[string]string{}
	for _, r := range l.Rows {
		got[r[0]+"/"+r[1]] = strings.Join(r[2:], " ")
	}
	want := map[string]string{
		"a/egress":  "0xcb300064 10000 kbit/s 2500 kbit 46 50 7 9800",
		"a/ingress": "0xcb400064 20000 kbit/s 8000 kbit - 0 0 0",
		"b/egress":  "- - - 8 - - -",
	}
	if len(got) != len(want) {
		t.Fatalf("rows %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}

// TestQoSMetersLive: an endpoint's QoS meters are installed with its band, modified in
// place on a change, and gone with the endpoint. A QoS meter deleted behind the driver's
// back (ovs-ofctl del-meter: vswitchd deletes the flows using it) leaves the endpoint's
// IPv4 dropped in table qos, never passing unlimited and unmarked, until the next full
// install puts the meter back.
func TestQoSMetersLive(t *testing.T) {
	d, _, id, c1, c2 := hostWithTwo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbq1"+id), ep("e2", "10.1.0.2", c2, "cbq2"+id)
	e1.QoS = dataplane.QoS{EgressRate: 10e6, IngressRate: 20e6, DSCP: 46, SetDSCP: true}
	st := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2}}
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	p1 := d.ports.endpoints["e1"]
	d.mu.Unlock()
	meters := func() string {
		return sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-meters", "unix:"+d.mgmtSocket())
	}
	band := func(id uint32, kbps, kbit uint32) string {
		return fmt.Sprintf("meter=%d kbps burst stats bands=\ntype=drop rate=%d burst_size=%d", id, kbps, kbit)
	}
	// Bursts: the default, 250 ms of the rate.
	if m := meters(); !strings.Contains(m, band(qosEgressMeterID(p1), 10_000, 2500)) ||
		!strings.Contains(m, band(qosIngressMeterID(p1), 20_000, 5000)) {
		t.Fatalf("e1's QoS meters:\n%s", m)
	}
	conformance.PingOK(t, nsPath(c1), "10.1.0.2", 3)

	// Changed: modified in place.
	e1.QoS = dataplane.QoS{EgressRate: 5e6}
	if err := d.UpsertEndpoint(ctx, e1); err != nil {
		t.Fatal(err)
	}
	if m := meters(); !strings.Contains(m, band(qosEgressMeterID(p1), 5_000, 1250)) ||
		strings.Contains(m, fmt.Sprintf("meter=%d ", qosIngressMeterID(p1))) {
		t.Errorf("after the change to 5 Mbit/s egress only:\n%s", m)
	}
	conformance.PingOK(t, nsPath(c1), "10.1.0.2", 3)

	// Deleted behind the driver's back: vswitchd deletes table qos's flow of e1 with it.
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "del-meter", "unix:"+d.mgmtSocket(), fmt.Sprintf("meter=%d", qosEgressMeterID(p1)))
	// The datapath's cached flows are revalidated in the background: a ping sent at once
	// can still pass (seen in CI).
	conformance.PingStops(t, nsPath(c1), "10.1.0.2", 10)
	// The next full install puts it back (it failed on the missing meter before).
	st.Endpoints[0] = e1
	if err := d.Sync(ctx, st); err != nil {
		t.Fatalf("full install after the meter went: %v", err)
	}
	if m := meters(); !strings.Contains(m, band(qosEgressMeterID(p1), 5_000, 1250)) {
		t.Fatalf("the full install did not put e1's egress meter back:\n%s", m)
	}
	conformance.PingOK(t, nsPath(c1), "10.1.0.2", 3)

	if err := d.DeleteEndpoint(ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	if m := meters(); strings.Contains(m, fmt.Sprintf("meter=%d ", qosEgressMeterID(p1))) {
		t.Errorf("e1's meter stayed after it went:\n%s", m)
	}
}

// TestRefusedMeterFailsOnlyItsEndpoint: in a full install (Sync), an endpoint whose QoS
// no meter can hold fails alone, named in the error: the other endpoint is installed
// with its meter and forwards. Before, the whole install failed, every endpoint created
// by it was rolled back, and only the agent's one-by-one fallback installed the rest.
func TestRefusedMeterFailsOnlyItsEndpoint(t *testing.T) {
	d, _, id, c1, c2 := hostWithTwo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbr1"+id), ep("e2", "10.1.0.2", c2, "cbr2"+id)
	e1.QoS = dataplane.QoS{EgressRate: 5e12} // 5e9 kbit/s: beyond a meter's 32-bit field
	e2.QoS = dataplane.QoS{EgressRate: 10e6}
	err := d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2}})
	if err == nil || !strings.Contains(err.Error(), "endpoint e1") || strings.Contains(err.Error(), "endpoint e2") {
		t.Fatalf("Sync = %v, want an error naming e1 only", err)
	}
	d.mu.Lock()
	_, has1 := d.state.Endpoints["e1"]
	_, has2 := d.state.Endpoints["e2"]
	p2 := d.ports.endpoints["e2"]
	d.mu.Unlock()
	if has1 || !has2 || p2 == 0 {
		t.Logf("Sync: %v", err)
		t.Fatalf("installed e1 %v, e2 %v (port %d); want e2 only", has1, has2, p2)
	}
	m := sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-meters", "unix:"+d.mgmtSocket())
	if !strings.Contains(m, fmt.Sprintf("meter=%d ", qosEgressMeterID(p2))) {
		t.Errorf("e2's meter not installed:\n%s", m)
	}
	// e2 forwards: it reaches e1's address once e1 has a QoS a meter can hold.
	e1.QoS = dataplane.QoS{EgressRate: 20e6}
	if err := d.UpsertEndpoint(ctx, e1); err != nil {
		t.Fatal(err)
	}
	conformance.PingOK(t, nsPath(c2), "10.1.0.1", 3)
}
