package ovs

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestParseMeterStats reads meter statistics as OVS sends them and refuses truncated or
// lying entries instead of reading past them (or looping on a zero length).
func TestParseMeterStats(t *testing.T) {
	entry := func(id uint32, n int, in uint64, bands ...uint64) []byte {
		b := make([]byte, 40, 40+16*len(bands))
		binary.BigEndian.PutUint32(b, id)
		binary.BigEndian.PutUint16(b[4:], uint16(n))
		binary.BigEndian.PutUint64(b[16:], in)
		for _, d := range bands {
			b = binary.BigEndian.AppendUint64(b, d)
			b = binary.BigEndian.AppendUint64(b, d*100)
		}
		return b
	}
	two := append(entry(fragMeterID(7), 56, 900, 600), entry(rejectMeter, 40, 5)...)
	got, err := parseMeterStats(two)
	if err != nil || len(got) != 2 || got[0] != (meterStat{ID: fragMeterID(7), Packets: 900, Dropped: 600, DroppedBytes: 60000}) ||
		got[1] != (meterStat{ID: rejectMeter, Packets: 5}) {
		t.Fatalf("two entries: %+v, %v", got, err)
	}
	if !isFragMeter(got[0].ID) || isFragMeter(got[1].ID) || isFragMeter(monitorMeter) || isFragMeter(responderMeter) ||
		isFragMeter(answerMeterID(7)) {
		t.Error("isFragMeter tells the meters apart wrongly")
	}
	for id, want := range map[uint32]uint32{fragMeterID(7): 7, answerMeterID(0xfeff): 0xfeff, rejectMeter: 0, monitorMeter: 0} {
		if p, ok := portMeterPort(id); p != want || ok != (want != 0) {
			t.Errorf("portMeterPort(%#x) = %d, %v", id, p, ok)
		}
	}
	for name, b := range map[string][]byte{
		"short":         two[:30],
		"zero length":   entry(1, 0, 0),
		"past the end":  entry(1, 72, 0, 1),
		"partial band":  append(entry(1, 48, 0), make([]byte, 8)...),
		"second broken": append(entry(1, 40, 0), 0, 0, 0),
	} {
		if b[4] == 0 && b[5] == 0 && name != "zero length" {
			t.Fatalf("%s: bad fixture", name)
		}
		if got, err := parseMeterStats(b); err == nil {
			t.Errorf("%s: parsed %+v", name, got)
		}
	}
}

// hostWithTwo starts the first host of a fresh pair (a private OVS) with a driver and two
// container namespaces, c1 and c2.
func hostWithTwo(t *testing.T) (d *Driver, h1 testHost, id, c1, c2 string) {
	t.Helper()
	needOVS(t)
	id = testID()
	h1, _ = twoHosts(t, id)
	c1, c2 = newNS(t, id, "c1"), newNS(t, id, "c2")
	return newDriver(t, h1), h1, id, c1, c2
}

// TestPortMeters: every container port has a meter on the fragments it sends, before
// conntrack can hold them for reassembly, and one on what is answered to it; a container
// sending lone fragments has those past the meter dropped and counted (drop_frag_limit)
// while its neighbour's meter is untouched; the meters go with the endpoint (also when it
// went while no agent ran); vswitchd holds up to 5,000 fragments. (Conformance
// answer-flood and fragment-hoard try them with traffic.)
func TestPortMeters(t *testing.T) {
	d, h1, id, c1, c2 := hostWithTwo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbo1"+id), ep("e2", "10.1.0.2", c2, "cbo2"+id)
	if err := d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2}}); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	p1, p2 := d.ports.endpoints["e1"], d.ports.endpoints["e2"]
	d.mu.Unlock()
	meters := func() string {
		return sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-meters", "unix:"+d.mgmtSocket())
	}
	m := meters()
	for _, p := range []uint32{p1, p2} {
		for _, want := range []string{
			fmt.Sprintf("meter=%d pktps burst stats bands=\ntype=drop rate=%d burst_size=%d", fragMeterID(p), fragRate, fragBurst),
			fmt.Sprintf("meter=%d pktps burst stats bands=\ntype=drop rate=%d burst_size=%d", answerMeterID(p), answerRate, answerBurst),
		} {
			if !strings.Contains(m, want) {
				t.Errorf("port %d: no meter %q:\n%s", p, want, m)
			}
		}
	}
	flows := sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "unix:"+d.mgmtSocket(), "table=0,in_port="+fmt.Sprint(p1))
	if !strings.Contains(flows, "nw_frag=yes") || !strings.Contains(flows, fmt.Sprintf("meter:%d", fragMeterID(p1))) {
		t.Errorf("port %d's fragments pass no meter:\n%s", p1, flows)
	}
	if st, err := d.appctl(ctx, "dpctl/ipf-get-status"); err != nil || !strings.Contains(st, fmt.Sprint(fragMaxHeld)) {
		t.Errorf("vswitchd's fragment ceiling: %v\n%s", err, st)
	}

	var frames [][]byte
	for i := 0; i < 600; i++ {
		frames = append(frames, conformance.LoneLastFragment(e1.MAC, e2.MAC, e1.IP, e2.IP, uint16(i+1)))
	}
	for i := 0; i < len(frames); i += 50 { // paced, so the port's queue takes them all
		if err := conformance.SendRawFrames(nsPath(c1), "eth0", frames[i:i+50]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// 600 in ~0.3 s: the burst and ~30 of the rate pass, the rest is dropped.
	eventually(t, 5*time.Second, func() error {
		c, err := d.Counters(ctx)
		if err != nil {
			return err
		}
		if n := c["drop_frag_limit"]; n < 300 || n > 600 {
			return fmt.Errorf("drop_frag_limit = %v after 600 lone fragments, want 300-600", n)
		}
		return nil
	})
	stats, err := d.conn.meterStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.ID == fragMeterID(p2) && (s.Packets != 0 || s.Dropped != 0) {
			t.Errorf("the neighbour's meter counted what another port sent: %+v", s)
		}
	}

	if err := d.DeleteEndpoint(ctx, "e1"); err != nil {
		t.Fatal(err)
	}
	has := func(m string, id uint32) bool { return strings.Contains(m, fmt.Sprintf("meter=%d ", id)) }
	m = meters()
	if has(m, fragMeterID(p1)) || has(m, answerMeterID(p1)) || !has(m, fragMeterID(p2)) || !has(m, answerMeterID(p2)) {
		t.Errorf("after e1 went: its meters stayed, or e2's went with them:\n%s", m)
	}

	// An endpoint deleted while no agent runs: the next agent's first full install
	// removes its meter, and keeps (and uses) the others.
	c3 := newNS(t, id, "c3")
	e3 := ep("e3", "10.1.0.3", c3, "cbo3"+id)
	if err := d.UpsertEndpoint(ctx, e3); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	p3 := d.ports.endpoints["e3"]
	d.mu.Unlock()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, h1)
	if err := d.Sync(ctx, dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e2}}); err != nil {
		t.Fatal(err)
	}
	m = meters()
	if has(m, fragMeterID(p3)) || has(m, answerMeterID(p3)) || !has(m, fragMeterID(p2)) || !has(m, answerMeterID(p2)) {
		t.Errorf("after a restart without e3: its meters stayed, or e2's went:\n%s", m)
	}
	flows = sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "unix:"+d.mgmtSocket(), "table=0,in_port="+fmt.Sprint(p2))
	if !strings.Contains(flows, fmt.Sprintf("meter:%d", fragMeterID(p2))) {
		t.Errorf("after a restart, port %d's fragments pass no meter:\n%s", p2, flows)
	}
}

// TestPortMetersRestored (review of the QoS meters, the same cache): a port meter deleted
// behind the driver's back (vswitchd deletes the flows that use it) is added again by the
// next full install, which failed on the missing meter before (the driver trusted its
// cache), and the endpoint's traffic comes back.
func TestPortMetersRestored(t *testing.T) {
	d, _, id, c1, c2 := hostWithTwo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e1, e2 := ep("e1", "10.1.0.1", c1, "cbr1"+id), ep("e2", "10.1.0.2", c2, "cbr2"+id)
	st := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2}}
	if err := d.Sync(ctx, st); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	p1 := d.ports.endpoints["e1"]
	d.mu.Unlock()
	sh(t, "ovs-ofctl", "-O", "OpenFlow13", "del-meter", "unix:"+d.mgmtSocket(), fmt.Sprintf("meter=%d", fragMeterID(p1)))
	if err := d.Sync(ctx, st); err != nil {
		t.Fatalf("full install after the port meter went: %v", err)
	}
	m := sh(t, "ovs-ofctl", "-O", "OpenFlow13", "dump-meters", "unix:"+d.mgmtSocket())
	if !strings.Contains(m, fmt.Sprintf("meter=%d ", fragMeterID(p1))) {
		t.Fatalf("the full install did not put port %d's fragment meter back:\n%s", p1, m)
	}
	conformance.PingOK(t, nsPath(c1), "10.1.0.2", 3)
}
