package ebpf

import (
	"context"
	"encoding/binary"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// qosFixture gives the fixture's sender (lo, srcIP) the interface qos word w and its
// receiver (localIP) ingress policing when in, with the buckets e at their slots.
func qosFixture(t *testing.T, objs *contivbpfObjects, w uint32, in bool, out, inb contivbpfCbQosBucket) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(objs.CbQos.Update(testSlot(srcIP), &contivbpfCbQosEntry{Out: out}, ebpf.UpdateLock))
	must(objs.CbQos.Update(testSlot(localIP), &contivbpfCbQosEntry{In: inb}, ebpf.UpdateLock))
	ifc := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: testSlot(srcIP), Vrf: testZone, Qos: w}
	copy(ifc.Mac[:], dataplane.ContivMAC(srcIP))
	must(objs.ifaceTable().put(uint32(loIfindex), &ifc, nil))
	k := contivbpfCbEpKey{Net: testNet, Ip: ip4(localIP)}
	ep := contivbpfCbEndpoint{Ifindex: peerIfindex, Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL), Slot: testSlot(localIP)}
	dst := contivbpfCbIface{Net: testNet, Ip: ip4(localIP), Slot: testSlot(localIP), Vrf: testZone}
	if in {
		ep.Flags |= uint32(contivbpfCbEpFlagsCB_EP_QOS_IN)
		dst.Qos = uint32(contivbpfCbQosFlagsCB_QOS_INGRESS)
	}
	copy(ep.Mac[:], dataplane.ContivMAC(localIP))
	copy(dst.Mac[:], dataplane.ContivMAC(localIP))
	must(objs.CbEndpoints.Put(&k, &ep))
	must(objs.ifaceTable().put(uint32(peerIfindex), &dst, nil))
}

// drain runs pkt until the first drop (at most n runs) and returns how many passed.
func drain(t *testing.T, objs *contivbpfObjects, prog *ebpf.Program, pkt []byte, ctx any, n int, drop Reason) int {
	t.Helper()
	for i := 0; i < n; i++ {
		r := run(t, objs, prog, pkt, ctx)
		if r.ret == tcActShot {
			if r.diff[drop] != 1 {
				t.Fatalf("run %d: dropped with %v, want %v", i, r.diff, drop)
			}
			return i
		}
		r.expect(t, tcActRedirect, FwdLocal)
	}
	t.Fatalf("no drop in %d runs", n)
	return n
}

// checkBurst checks that n frames of size bytes passed a bucket b that started full
// (tat 0) at most elapsed before the last of them: the burst's worth at once (tau/cost + 1
// frames), and no more than the refill over elapsed adds. The bucket's clock is the
// kernel's (bpf_ktime_get_ns), which a test cannot hold, so a slow run (a loaded machine)
// may pass a frame more for each cost's worth of time it took, never one more beyond.
func checkBurst(t *testing.T, n int, b contivbpfCbQosBucket, size int, elapsed time.Duration) {
	t.Helper()
	cost := uint64(size) * b.Nsb >> qosNsbShift
	lo := int(b.Tau/cost) + 1
	hi := int((b.Tau+uint64(elapsed))/cost) + 1
	if n < lo || n > hi {
		t.Errorf("%d frames passed in %v, want %d..%d (a frame costs %v, the burst %v)",
			n, elapsed, lo, hi, time.Duration(cost), time.Duration(b.Tau))
	}
}

// overdrawQoS moves slot's bucket in direction in (1: what it receives) an hour behind
// the kernel's clock, its counts kept: its next frame is dropped however long the test
// took so far.
func overdrawQoS(t *testing.T, objs *contivbpfObjects, slot uint32, in bool) {
	t.Helper()
	now, err := monotonicRaw()
	if err != nil {
		t.Fatal(err)
	}
	var e contivbpfCbQosEntry
	if err := objs.CbQos.LookupWithFlags(slot, &e, ebpf.LookupLock); err != nil {
		t.Fatal(err)
	}
	b := &e.Out
	if in {
		b = &e.In
	}
	b.Tat = now + uint64(time.Hour) + b.Tau
	if err := objs.CbQos.Update(slot, &e, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
}

// TestQoSPolice: an endpoint's buckets (bpf/lib/qos.h) pass what fits the rate and burst,
// drop the rest under its own reason in each direction, refill with time, fail closed
// without an entry, and leave endpoints without QoS alone.
func TestQoSPolice(t *testing.T) {
	objs := loadTestObjects(t, contivbpfProgCbFromOverlay)
	prog := objs.CbFromContainer
	pkt := ipFrame(srcIP, localIP, ipOpts{}) // 74 bytes
	egress := uint32(contivbpfCbQosFlagsCB_QOS_EGRESS)
	// 10 kbit/s with a 1000-byte burst: 14 back-to-back frames (the 14th starts with
	// 962 bytes owed, under the burst), one more for each 59 ms the runs take
	// (checkBurst).
	slow := qosBucket(10_000, 1000)

	t.Run("egress/over-rate-dropped", func(t *testing.T) {
		start := time.Now()
		qosFixture(t, objs, egress, false, slow, contivbpfCbQosBucket{})
		checkBurst(t, drain(t, objs, prog, pkt, nil, 100, DropRateEgress), slow, len(pkt), time.Since(start))
		overdrawQoS(t, objs, testSlot(srcIP), false)
		run(t, objs, prog, pkt, nil).expect(t, tcActShot, DropRateEgress)
		// The endpoint's own bucket counts its two drops (netctl bpf qos), the other
		// direction's nothing.
		var e contivbpfCbQosEntry
		if err := objs.CbQos.Lookup(testSlot(srcIP), &e); err != nil || e.Out.Dropped != 2 || e.Out.DroppedBytes != 2*uint64(len(pkt)) || e.In.Dropped != 0 {
			t.Errorf("bucket counts %+v (%v), want out 2 drops of %d bytes", e, err, 2*len(pkt))
		}
	})
	t.Run("egress/under-rate-passes", func(t *testing.T) {
		// 1 Gbit/s: a frame costs 592 ns; 200 in a row never exceed a 64 KiB burst.
		qosFixture(t, objs, egress, false, qosBucket(1_000_000_000, 64<<10), contivbpfCbQosBucket{})
		for i := 0; i < 200; i++ {
			r := run(t, objs, prog, pkt, nil)
			if r.ret != tcActRedirect {
				t.Fatalf("run %d: verdict %d reasons %v", i, r.ret, r.diff)
			}
		}
	})
	t.Run("egress/refills", func(t *testing.T) {
		// 80 kbit/s: a 74-byte frame's cost is refilled in 7.4 ms.
		// (The drain ends with a drop; the refill after it is measured from then.)
		qosFixture(t, objs, egress, false, qosBucket(80_000, 500), contivbpfCbQosBucket{})
		drain(t, objs, prog, pkt, nil, 100, DropRateEgress)
		time.Sleep(30 * time.Millisecond)
		run(t, objs, prog, pkt, nil).expect(t, tcActRedirect, FwdLocal)
	})
	t.Run("egress/gso-larger-than-burst", func(t *testing.T) {
		// A frame larger than the burst passes from a bucket that is not behind (else a
		// GSO packet would never pass), and puts it behind.
		qosFixture(t, objs, egress, false, qosBucket(10_000, 64), contivbpfCbQosBucket{})
		run(t, objs, prog, pkt, nil).expect(t, tcActRedirect, FwdLocal)
		run(t, objs, prog, pkt, nil).expect(t, tcActShot, DropRateEgress)
	})
	t.Run("egress/no-entry-fails-closed", func(t *testing.T) {
		qosFixture(t, objs, egress, false, slow, contivbpfCbQosBucket{})
		ifc := contivbpfCbIface{Net: testNet, Ip: ip4(srcIP), Slot: objs.CbQos.MaxEntries() + 5, Vrf: testZone, Qos: egress}
		copy(ifc.Mac[:], dataplane.ContivMAC(srcIP))
		if err := objs.ifaceTable().put(uint32(loIfindex), &ifc, nil); err != nil {
			t.Fatal(err)
		}
		run(t, objs, prog, pkt, nil).expect(t, tcActShot, DropRateEgress)
	})
	t.Run("ingress/local", func(t *testing.T) {
		start := time.Now()
		qosFixture(t, objs, 0, true, contivbpfCbQosBucket{}, slow)
		checkBurst(t, drain(t, objs, prog, pkt, nil, 100, DropRateIngress), slow, len(pkt), time.Since(start))
		var e contivbpfCbQosEntry
		if err := objs.CbQos.Lookup(testSlot(localIP), &e); err != nil || e.In.Dropped != 1 || e.In.DroppedBytes != uint64(len(pkt)) {
			t.Errorf("receiver's bucket counts %+v (%v), want in 1 drop of %d bytes", e.In, err, len(pkt))
		}
	})
	t.Run("ingress/from-overlay", func(t *testing.T) {
		// Delivery from another host passes the same check.
		start := time.Now()
		qosFixture(t, objs, 0, true, contivbpfCbQosBucket{}, slow)
		ctx := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
		p := ipFrame(remoteIP, localIP, ipOpts{})
		checkBurst(t, drain(t, objs, objs.CbTestOverlay, p, ctx, 100, DropRateIngress), slow, len(p), time.Since(start))
	})
	t.Run("placement", func(t *testing.T) {
		// A limited endpoint's entry lives in the hash, its array place free (the in-place
		// fast paths never meet it); without QoS back in the array, the hash copy gone.
		tab := objs.ifaceTable()
		var v contivbpfCbIface
		qosFixture(t, objs, egress, false, slow, contivbpfCbQosBucket{})
		if err := tab.direct.Lookup(uint32(loIfindex), &v); err != nil || v != (contivbpfCbIface{}) {
			t.Errorf("array place of a limited endpoint: %+v (%v), want free", v, err)
		}
		if err := tab.hashed.Lookup(uint32(loIfindex), &v); err != nil || v.Qos != egress {
			t.Errorf("hash entry of a limited endpoint: %+v (%v)", v, err)
		}
		qosFixture(t, objs, 0, false, slow, contivbpfCbQosBucket{})
		if err := tab.direct.Lookup(uint32(loIfindex), &v); err != nil || v.Ip != ip4(srcIP) {
			t.Errorf("array place without QoS: %+v (%v)", v, err)
		}
		if err := tab.hashed.Lookup(uint32(loIfindex), &v); err == nil {
			t.Errorf("hash entry left without QoS: %+v", v)
		}
		if n, err := tab.promote(); err != nil || n != 0 {
			t.Errorf("promote moved %d (%v)", n, err)
		}
		qosFixture(t, objs, egress, false, slow, contivbpfCbQosBucket{})
		if n, err := tab.promote(); err != nil || n != 0 {
			t.Errorf("promote moved a limited endpoint's entry into the array (%d, %v)", n, err)
		}
	})
	t.Run("no-qos-untouched", func(t *testing.T) {
		// Buckets that would drop at once, but no endpoint names them.
		empty := qosBucket(10_000, 1)
		empty.Tat = uint64(time.Now().Add(time.Hour).UnixNano())
		qosFixture(t, objs, 0, false, empty, empty)
		for i := 0; i < 20; i++ {
			r := run(t, objs, prog, pkt, nil)
			r.expect(t, tcActRedirect, FwdLocal)
			if r.out[15] != 0 {
				t.Fatalf("tos %#x, want untouched", r.out[15])
			}
		}
		var e contivbpfCbQosEntry
		if err := objs.CbQos.Lookup(testSlot(srcIP), &e); err != nil || e.Out.Tat != empty.Tat {
			t.Errorf("bucket moved: %+v (%v)", e.Out, err)
		}
	})
}

// TestQoSDSCP: an endpoint's IPv4 packets leave with its DSCP, ECN bits kept and the
// header checksum valid; headers too short or malformed are left to the stages.
func TestQoSDSCP(t *testing.T) {
	objs := loadTestObjects(t)
	prog := objs.CbFromContainer
	w := qosWord(dataplane.QoS{DSCP: 46, SetDSCP: true})
	qosFixture(t, objs, w, false, contivbpfCbQosBucket{}, contivbpfCbQosBucket{})
	withCsum := func(p []byte) []byte {
		binary.BigEndian.PutUint16(p[24:], 0)
		binary.BigEndian.PutUint16(p[24:], csum(p[14:34], 0))
		return p
	}
	for _, ecn := range []byte{0, 1, 2, 3} {
		p := ipFrame(srcIP, localIP, ipOpts{})
		p[15] = 0x20<<2 | ecn // CS? a DSCP of its own: replaced
		r := run(t, objs, prog, withCsum(p), nil)
		r.expect(t, tcActRedirect, FwdLocal)
		if want := byte(46<<2) | ecn; r.out[15] != want {
			t.Errorf("ecn %d: tos %#x, want %#x", ecn, r.out[15], want)
		}
		if c := csum(r.out[14:34], 0); c != 0 {
			t.Errorf("ecn %d: header checksum does not verify (%#x)", ecn, c)
		}
	}
	t.Run("already-marked", func(t *testing.T) {
		p := withCsum(ipFrame(srcIP, localIP, ipOpts{}))
		p[15] = 46 << 2
		p = withCsum(p)
		r := run(t, objs, prog, p, nil)
		r.expect(t, tcActRedirect, FwdLocal)
		if r.out[15] != 46<<2 || csum(r.out[14:34], 0) != 0 {
			t.Errorf("tos %#x csum %#x", r.out[15], csum(r.out[14:34], 0))
		}
	})
	// (BPF_PROG_TEST_RUN refuses IPv4 frames shorter than a header: TestFromContainer.)
	for name, o := range malformedIPv4() {
		t.Run("malformed/"+name, func(t *testing.T) {
			run(t, objs, prog, ipFrame(srcIP, localIP, o), nil).expect(t, tcActShot, DropMalformedIP)
		})
	}
	t.Run("arp-unmarked", func(t *testing.T) {
		r := run(t, objs, prog, arpFrame(1, dataplane.ContivMAC(srcIP), srcIP, localIP), nil)
		r.expect(t, tcActRedirect, ARPReply)
	})
}

// TestQoSBucket: rates and bursts become the datapath's fixed-point costs, a burst of 0
// the default, and nothing overflows.
func TestQoSBucket(t *testing.T) {
	for _, c := range []struct {
		rate, burst  uint64
		nsb, tau     uint64
		zero         bool
		defaultBurst bool
	}{
		{rate: 0, zero: true},
		{rate: 8_000_000, burst: 1000, nsb: 1000 << 16, tau: 1_000_000},     // 1 µs a byte
		{rate: 1_000_000_000, burst: 125_000, nsb: 8 << 16, tau: 1_000_000}, // 1 ms of burst
		{rate: 10_000_000, burst: 0, nsb: 800 << 16, defaultBurst: true},
		{rate: 1, burst: 1, nsb: 8_000_000 << 16, tau: 8_000_000}, // clamped to 1 kbit/s
		{rate: ^uint64(0), burst: ^uint64(0), nsb: 1, tau: 8e9},
		{rate: 1000, burst: ^uint64(0), nsb: 8_000_000 << 16, tau: qosMaxTau},
		// 1000g (the agent's most) without a burst: 200 ms of it, not a burst of an
		// hour (rate/8 × 0.2 s passes 64 bits above 737g).
		{rate: 1_000_000_000_000, burst: 0, nsb: 524, tau: 200_000_000},
		{rate: 800_000_000_000, burst: 0, nsb: 655, tau: 200_000_000},
	} {
		b := qosBucket(c.rate, c.burst)
		if c.zero {
			if b != (contivbpfCbQosBucket{}) {
				t.Errorf("rate 0: %+v", b)
			}
			continue
		}
		if c.defaultBurst {
			burst := qosDefaultBurst(c.rate)
			if burst < qosMinBurstBytes || burst < c.rate/8/100 {
				t.Errorf("default burst %d of %d bit/s: below 10 ms or a GSO packet", burst, c.rate)
			}
			c.tau = burst * 8e9 / c.rate
		}
		if b.Nsb != c.nsb || b.Tau != c.tau {
			t.Errorf("rate %d burst %d: nsb %d tau %d, want %d %d", c.rate, c.burst, b.Nsb, b.Tau, c.nsb, c.tau)
		}
	}
	// Read back (listings): what the bucket enforces.
	for _, c := range [][2]uint64{{10e6, 250_000}, {1e9, 125_000}, {8e6, 1000}} {
		if r, b := qosBucket(c[0], c[1]).rate(); r != c[0] || b != c[1] {
			t.Errorf("rate %d burst %d read back as %d %d", c[0], c[1], r, b)
		}
	}
	w := qosWord(dataplane.QoS{EgressRate: 1, IngressRate: 1, DSCP: 63, SetDSCP: true})
	if w != 1|2|4|63<<8 {
		t.Errorf("qos word %#x", w)
	}
	if qosWord(dataplane.QoS{}) != 0 {
		t.Error("zero QoS has a word")
	}
}

// TestQoSDriver: through real veths, TCP (iperf3) of an endpoint with a 10 Mbit/s QoS
// holds 0.9-1.05 of the rate in both directions; a live change to 20 Mbit/s and the
// QoS's removal take effect on the running endpoint.
func TestQoSDriver(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "qa", "10.50.0.2", true)
	b := h.endpoint(t, "qb", "10.50.0.3", true)
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	set := func(q dataplane.QoS) {
		t.Helper()
		a.QoS = q
		if err := h.d.UpsertEndpoint(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	set(dataplane.QoS{EgressRate: 10e6, IngressRate: 10e6})
	if err := h.d.UpsertEndpoint(ctx, b); err != nil {
		t.Fatal(err)
	}
	const secs = 4 // the first burst (200 ms of the rate) adds 5 % to a 4 s run
	measure := func(from, to dataplane.Endpoint) float64 {
		t.Helper()
		g, err := netbench.Iperf3(ctx, filepath.Base(to.NetNS), filepath.Base(from.NetNS), to.IP.String(), 5201, secs)
		if err != nil {
			t.Fatal(err)
		}
		return g * 1e9
	}
	// A run off the mark is measured once more: on two busy cores a TCP sender that lost
	// its turn backs off past the policer's burst (seen in CI under load: 0.79).
	within := func(what string, from, to dataplane.Endpoint, rate float64) {
		t.Helper()
		for try := 1; ; try++ {
			got := measure(from, to)
			t.Logf("%s: %.2f Mbit/s of %.0f (%.3f)", what, got/1e6, rate/1e6, got/rate)
			if r := got / rate; r >= 0.9 && r <= 1.05 {
				return
			}
			if try == 2 {
				t.Errorf("%s: %.2f Mbit/s, want 0.9-1.05 of %.0f Mbit/s", what, got/1e6, rate/1e6)
				return
			}
		}
	}
	before, err := h.d.ReasonCounters()
	if err != nil {
		t.Fatal(err)
	}
	tabs, err := h.d.DumpTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tabs.Ifaces {
		if e.IP == a.IP.String() && (e.QoS == nil || *e.QoS != dataplane.QoS{EgressRate: 10e6, EgressBurst: 250_000, IngressRate: 10e6, IngressBurst: 250_000}) {
			t.Errorf("listing of a: qos %+v, want 10 Mbit/s with the default burst both ways", e.QoS)
		}
		if e.IP == b.IP.String() && e.QoS != nil {
			t.Errorf("listing of b: qos %+v, want none", e.QoS)
		}
	}
	within("egress 10M", a, b, 10e6)
	within("ingress 10M", b, a, 10e6)
	after, err := h.d.ReasonCounters()
	if err != nil {
		t.Fatal(err)
	}
	if after[DropRateEgress].Packets == before[DropRateEgress].Packets || after[DropRateIngress].Packets == before[DropRateIngress].Packets {
		t.Errorf("no policing drops counted: egress %d ingress %d", after[DropRateEgress].Packets-before[DropRateEgress].Packets,
			after[DropRateIngress].Packets-before[DropRateIngress].Packets)
	}
	if v, err := h.d.Verify(dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b}}); err != nil || len(v) != 0 {
		t.Errorf("verify with QoS: %v %v", v, err)
	}

	set(dataplane.QoS{EgressRate: 20e6, IngressRate: 20e6})
	within("ingress 20M (live change)", b, a, 20e6)

	set(dataplane.QoS{})
	if got := measure(a, b); got < 200e6 {
		t.Errorf("after removal: %.1f Mbit/s, want unlimited", got/1e6)
	}
}

// TestQoSIngressNoted: with a stage with state on, a flow's packets after the first reach
// their endpoint through the conntrack entry's note of its veth (cb_dst_noted, reading
// the interface array in place, which checks no QoS): a limited endpoint's entry is never
// there (ifaces.go), so its packets are delivered by its endpoint entry and charged.
func TestQoSIngressNoted(t *testing.T) {
	objs := ctPolicyFixture(t)
	if err := objs.CbQos.Update(testSlot(localIP), &contivbpfCbQosEntry{In: qosBucket(10_000, 1000)}, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	ifc := contivbpfCbIface{Net: testNet, Ip: ip4(localIP), Epg: 20, Slot: testSlot(localIP), Vrf: testZone,
		Qos: uint32(contivbpfCbQosFlagsCB_QOS_INGRESS)}
	copy(ifc.Mac[:], dataplane.ContivMAC(localIP))
	ep := contivbpfCbEndpoint{Ifindex: peerIfindex, Epg: 20, Slot: testSlot(localIP),
		Flags: uint32(contivbpfCbEpFlagsCB_EP_LOCAL | contivbpfCbEpFlagsCB_EP_QOS_IN)}
	copy(ep.Mac[:], dataplane.ContivMAC(localIP))
	if err := objs.ifaceTable().put(peerIfindex, &ifc, nil); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbEndpoints.Put(&contivbpfCbEpKey{Net: testNet, Ip: ip4(localIP)}, &ep); err != nil {
		t.Fatal(err)
	}
	fc := objs.CbFromContainer
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 43000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	run(t, objs, fc, l4Frame(6, srcIP, localIP, 43000, 80, tcpACK, 0), nil).expect(t, tcActRedirect, FwdLocal)
	if e, ok := ctEntry(t, objs, testZone, 6, srcIP, localIP, 43000, 80); !ok || e.Nodeport != peerIfindex {
		t.Fatalf("the flow's entry does not note the veth (%v, %d)", ok, e.Nodeport)
	}
	if n := drain(t, objs, fc, l4Frame(6, srcIP, localIP, 43000, 80, tcpACK, 0), nil, 100, DropRateIngress); n == 0 {
		t.Error("no noted delivery passed before the bucket ran out")
	}
}

// A slot handed out again starts with full buckets: an endpoint that gets the slot of a
// deleted one with the same rate and burst does not inherit what that one spent (putQoS
// keeps the state of a bucket whose parameters did not change).
func TestQoSSlotReuse(t *testing.T) {
	testroot.Need(t)
	objs := loadTestObjects(t)
	d := &Driver{objs: *objs, eps: endpointIndex{slots: map[uint32]string{}}, mapFull: map[string]uint64{}}
	q := dataplane.QoS{EgressRate: 10_000_000, EgressBurst: 100_000, IngressRate: 10_000_000, IngressBurst: 100_000}
	s, err := d.allocSlot("old")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.putQoS(s, q); err != nil {
		t.Fatal(err)
	}
	// The old endpoint spent its buckets (tat ahead of the clock), then went.
	spent := contivbpfCbQosEntry{Out: qosBucket(q.EgressRate, q.EgressBurst), In: qosBucket(q.IngressRate, q.IngressBurst)}
	spent.Out.Tat, spent.In.Tat = ^uint64(0)>>2, ^uint64(0)>>2
	if err := objs.CbQos.Update(s, &spent, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	d.freeSlot(s)
	s2, err := d.allocSlot("new")
	if err != nil || s2 != s {
		t.Fatalf("allocSlot = %d, %v; want %d again", s2, err, s)
	}
	if err := d.putQoS(s2, q); err != nil {
		t.Fatal(err)
	}
	var e contivbpfCbQosEntry
	if err := objs.CbQos.Lookup(s2, &e); err != nil {
		t.Fatal(err)
	}
	if e.Out.Tat != 0 || e.In.Tat != 0 {
		t.Errorf("new endpoint on slot %d inherits the old one's buckets: out tat %d in tat %d", s2, e.Out.Tat, e.In.Tat)
	}
}

// TestQoSVerify: Verify checks a limited endpoint's buckets, not only the word and flag
// that name them: a bucket zeroed behind the driver's back (it would pass everything)
// is drift.
func TestQoSVerify(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "qva", "10.50.0.2", true)
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	a.QoS = dataplane.QoS{EgressRate: 10e6, IngressRate: 10e6}
	if err := h.d.UpsertEndpoint(ctx, a); err != nil {
		t.Fatal(err)
	}
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a}}
	if v, err := h.d.Verify(state); err != nil || len(v) != 0 {
		t.Fatalf("verify right after upsert: %v %v", v, err)
	}
	slot := h.d.eps.endpoints[indexKey(a.ID)].slot
	if err := h.d.objs.CbQos.Update(slot, &contivbpfCbQosEntry{}, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	v, err := h.d.Verify(state)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range v {
		if d.Table == contivbpfMapCbQos && d.Object == a.ID {
			n++
		}
	}
	if n != 2 {
		t.Errorf("zeroed buckets of %s: drift %+v, want both directions named in %s", a.ID, v, contivbpfMapCbQos)
	}
}

// TestQoSListing: `netctl bpf qos` on eBPF: a row per limited endpoint and direction, in
// the OVS listing's columns, with the rates and bursts the buckets enforce and the DSCP;
// an endpoint only marked has its egress row, one without QoS none.
func TestQoSListing(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	a := h.endpoint(t, "la", "10.50.0.2", false)
	a.QoS = dataplane.QoS{EgressRate: 10e6, IngressRate: 2e6, IngressBurst: 50_000, SetDSCP: true, DSCP: 46}
	b := h.endpoint(t, "lb", "10.50.0.3", false)
	b.QoS = dataplane.QoS{SetDSCP: true, DSCP: 10}
	c := h.endpoint(t, "lc", "10.50.0.4", false)
	for _, ep := range []dataplane.Endpoint{a, b, c} {
		if err := h.d.UpsertEndpoint(ctx, ep); err != nil {
			t.Fatal(err)
		}
	}
	l, err := h.d.Listing(dataplane.ListQuery{Kind: "qos"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ENDPOINT", "DIRECTION", "METER", "RATE", "BURST", "DSCP", "PACKETS", "DROPPED", "DROPPED BYTES"}; !slices.Equal(l.Columns, want) {
		t.Errorf("columns %v, want the OVS listing's %v", l.Columns, want)
	}
	slot := func(ep dataplane.Endpoint) string {
		t.Helper()
		h.d.eps.mu.RLock()
		defer h.d.eps.mu.RUnlock()
		for _, r := range h.d.eps.endpoints {
			if r.id == ep.ID && r.slot != 0 {
				return "slot " + strconv.Itoa(int(r.slot))
			}
		}
		t.Fatalf("no slot for %s", ep.ID)
		return ""
	}
	want := [][]string{
		{a.ID, "egress", slot(a), "10000 kbit/s", "2000 kbit", "46", "", "0", "0"}, // default burst: 200 ms of the rate
		{a.ID, "ingress", slot(a), "2000 kbit/s", "400 kbit", "-", "", "0", "0"},
		{b.ID, "egress", "-", "-", "-", "10", "", "", ""},
	}
	if !slices.EqualFunc(l.Rows, want, slices.Equal) {
		t.Errorf("qos rows\n%v\nwant\n%v", l.Rows, want)
	}

	// What a's buckets dropped (as the datapath counts it: TestQoSPolice) is listed per
	// direction, and survives a change of its rate.
	n, _ := strconv.Atoi(strings.TrimPrefix(slot(a), "slot "))
	e, err := h.d.qosEntry(uint32(n))
	if err != nil {
		t.Fatal(err)
	}
	e.Out.Dropped, e.Out.DroppedBytes, e.In.Dropped, e.In.DroppedBytes = 3, 4500, 1, 60
	if err := h.d.objs.CbQos.Update(uint32(n), &e, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	a.QoS.EgressRate = 20e6
	if err := h.d.UpsertEndpoint(ctx, a); err != nil {
		t.Fatal(err)
	}
	if l, err = h.d.Listing(dataplane.ListQuery{Kind: "qos"}); err != nil {
		t.Fatal(err)
	}
	want[0] = []string{a.ID, "egress", slot(a), "20000 kbit/s", "4000 kbit", "46", "", "3", "4500"}
	want[1] = []string{a.ID, "ingress", slot(a), "2000 kbit/s", "400 kbit", "-", "", "1", "60"}
	if !slices.EqualFunc(l.Rows, want, slices.Equal) {
		t.Errorf("qos rows after a rate change\n%v\nwant\n%v", l.Rows, want)
	}
}
