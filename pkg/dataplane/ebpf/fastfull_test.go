package ebpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// The fast stage is the full stage's early exit, not a second copy of its decisions
// (issue 33; that it is the one way in besides the tail call to the container stage is
// TestOneWayIn's): each packet an established flow sends is run twice from the same
// conntrack table, once through the fast stage alone (the container stage removed from
// cb_calls, so a packet it declined would be dropped drop_no_stage) and once forced past
// it, through the container stage and the full stage (the same packet with a 4-byte IPv4
// option, which the fast stage declines). Both must give the same verdict and reason, the same frame (addresses, ports,
// checksums, payload; MACs), the same conntrack entries (state, flags, NAT fields, TCP
// notes, deadline within a second: the client→VIP entry's memo and the destination note
// are the fast path's own caches, left out) and move the memo generation alike (but for
// a service flow's own note, which the fast path carries in its memo instead). Direct
// tracked flows (TCP and UDP, forward and first reply, acknowledgments noted), and a
// service flow's forward packets and backend replies. A packet the fast path declines
// (its entry older than a policy change) changes nothing.
func TestFastPathIsTheFullStage(t *testing.T) {
	objs := ctPolicyFixture(t)
	setFeatures(t, objs, uint32(contivbpfCbFeaturesCB_FEAT_POLICY|contivbpfCbFeaturesCB_FEAT_LB))
	putPolicy(t, objs, dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-80", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 80, Action: dataplane.ActionAllow},
		{ID: "allow-8080", Priority: 10, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 8080, Action: dataplane.ActionAllow}}})
	vip := netip.MustParseAddr("10.1.0.101")
	putTestService(t, objs, 9, vip, 80, 6, 8080, localIP)
	fc := objs.CbFromContainer
	client, backend, setIfc := backendIfaces(t, objs)
	const stageContainer = uint32(0) // CB_CALL_CONTAINER

	type pkt struct {
		from       contivbpfCbIface
		proto      uint8
		src, dst   netip.Addr
		sport, dpt uint16
		flags      uint8
		seq, ack   uint32
	}
	frame := func(p pkt, opts []byte) []byte {
		f := l4FrameOpts(p.proto, p.src, p.dst, p.sport, p.dpt, p.flags, ipOpts{options: opts})
		if p.proto == 6 {
			f = withSeq(f, p.seq, p.ack)
		}
		return f
	}
	gen := func() uint32 {
		t.Helper()
		var g uint32
		if err := objs.CbCtGens.Lookup(uint32(0), &g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	table := func() map[contivbpfCbCtKey]contivbpfCbCtEntry {
		t.Helper()
		m := map[contivbpfCbCtKey]contivbpfCbCtEntry{}
		var k contivbpfCbCtKey
		var e contivbpfCbCtEntry
		it := objs.CbCt.Iterate()
		for it.Next(&k, &e) {
			m[k] = e
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	restore := func(m map[contivbpfCbCtKey]contivbpfCbCtEntry) {
		t.Helper()
		for k := range table() {
			if err := objs.CbCt.Delete(&k); err != nil {
				t.Fatal(err)
			}
		}
		for k, e := range m {
			if err := objs.CbCt.Put(&k, &e); err != nil {
				t.Fatal(err)
			}
		}
	}
	// cached leaves out what only the fast path keeps: a client→VIP entry's memo
	// (epoch, state, tcp_ack[0]) and a flow entry's destination note.
	cached := func(e contivbpfCbCtEntry) contivbpfCbCtEntry {
		if e.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) != 0 {
			e.Epoch, e.State, e.TcpAck[0] = 0, 0, 0
		}
		if e.Flags&uint8(contivbpfCbCtFlagsCB_CT_NODEPORT) == 0 {
			e.Nodeport = 0
		}
		return e
	}
	sameTables := func(what string, fast, full map[contivbpfCbCtKey]contivbpfCbCtEntry) {
		t.Helper()
		if len(fast) != len(full) {
			t.Errorf("%s: %d entries after the fast path, %d after the full stage", what, len(fast), len(full))
		}
		for k, a := range fast {
			b, ok := full[k]
			if !ok {
				t.Errorf("%s: entry %+v only after the fast path", what, k)
				continue
			}
			d := time.Duration(a.Expires) - time.Duration(b.Expires)
			a, b = cached(a), cached(b)
			a.Expires, b.Expires = 0, 0
			if a != b || d > time.Second || d < -time.Second {
				t.Errorf("%s: entry %+v\nfast path  %+v\nfull stage %+v (deadlines %v apart)", what, k, a, b, d)
			}
		}
	}
	// sameFrames compares an output frame of the fast path with the full stage's, whose
	// IPv4 header carries the 4 option bytes.
	sameFrames := func(what string, fast, full []byte) {
		t.Helper()
		if len(fast) < 34 || len(full) < 38 {
			t.Errorf("%s: frames of %d and %d bytes", what, len(fast), len(full))
			return
		}
		checkSums(t, fast)
		n := int(binary.BigEndian.Uint16(fast[14+2:]))
		if m := int(binary.BigEndian.Uint16(full[14+2:])); m != n+4 || len(fast) < 14+n || len(full) < 14+m {
			t.Errorf("%s: IPv4 lengths %d and %d", what, n, m)
			return
		}
		if !bytes.Equal(fast[:14], full[:14]) || !bytes.Equal(fast[14+1:14+2], full[14+1:14+2]) ||
			!bytes.Equal(fast[14+4:14+10], full[14+4:14+10]) || !bytes.Equal(fast[14+12:14+20], full[14+12:14+20]) ||
			!bytes.Equal(fast[34:14+n], full[38:14+n+4]) {
			t.Errorf("%s: frames differ\nfast path  %x\nfull stage %x", what, fast[:14+n], full[:14+n+4])
		}
	}
	// fastOnly runs p from its interface through the fast stage alone: the container
	// stage is out of cb_calls meanwhile.
	fastOnly := func(p pkt) runResult {
		t.Helper()
		setIfc(p.from)
		defer setIfc(client)
		if err := objs.CbCalls.Delete(stageContainer); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := objs.CbCalls.Put(stageContainer, objs.CbStageContainer); err != nil {
				t.Fatal(err)
			}
		}()
		return run(t, objs, fc, frame(p, nil), nil)
	}
	// carried is the number of notes the fast path wrote into p's memo instead of moving
	// the memo generation (0 or 1): a service flow's own acknowledgment, due, which
	// cb_svc_fast copies into the client→VIP entry (the flow's one memo), where the full
	// stage's note stales every memo (TestServiceFastPathNoteKeepsMemos). Where it
	// carried one, the memo must hold the flow entry's note.
	carried := func(p pkt, before, after map[contivbpfCbCtKey]contivbpfCbCtEntry) uint32 {
		t.Helper()
		k := contivbpfCbCtKey{Zone: testZone, Saddr: ip4(p.src), Daddr: ip4(p.dst), Sport: nport(p.sport), Dport: nport(p.dpt), Proto: p.proto}
		svc, ok := after[k]
		if !ok || svc.Flags&uint8(contivbpfCbCtFlagsCB_CT_SVC) == 0 {
			return 0
		}
		k.Daddr, k.Dport = svc.NatIp, svc.NatPort
		if before[k].TcpAck[0] == after[k].TcpAck[0] {
			return 0
		}
		if svc.TcpAck[0] != after[k].TcpAck[0] {
			t.Errorf("service flow's note %d, its memo's copy %d", after[k].TcpAck[0], svc.TcpAck[0])
		}
		return 1
	}
	// both runs p through the fast path alone and through the full stage from the same
	// table, compares them, and leaves the fast path's table in place.
	both := func(what string, p pkt, reason Reason) {
		t.Helper()
		before, g0 := table(), gen()
		fast := fastOnly(p)
		fast.expect(t, tcActRedirect, reason)
		afterFast, gFast := table(), gen()
		restore(before)
		setIfc(p.from)
		defer setIfc(client)
		full := run(t, objs, fc, frame(p, []byte{1, 1, 1, 0}), nil)
		full.expect(t, tcActRedirect, reason)
		afterFull, gFull := table(), gen()
		sameFrames(what, fast.out, full.out)
		sameTables(what, afterFast, afterFull)
		if c := carried(p, before, afterFast); gFast-g0+c != gFull-gFast {
			t.Errorf("%s: the memo generation moved by %d on the fast path (%d note carried in its memo), %d on the full stage",
				what, gFast-g0, c, gFull-gFast)
		}
		restore(afterFast)
	}
	// declined runs p through the fast path alone: it must hand p on having changed
	// nothing.
	declined := func(what string, p pkt) {
		t.Helper()
		before, g0 := table(), gen()
		fastOnly(p).expect(t, tcActShot, DropNoStage)
		sameTables(what+" (declined)", table(), before)
		if gen() != g0 {
			t.Errorf("%s: declined, but the memo generation moved", what)
		}
	}
	open := func(p pkt, reason Reason) {
		t.Helper()
		setIfc(p.from)
		defer setIfc(client)
		run(t, objs, fc, frame(p, nil), nil).expect(t, tcActRedirect, reason)
	}

	// A direct tracked flow between two local endpoints: the client's segments on the
	// NEW entry, the server's first reply (NEW → ESTABLISHED), acknowledgments noted
	// either way.
	open(pkt{client, 6, srcIP, localIP, 44000, 80, tcpSYN, 1000, 0}, FwdLocal)
	both("client ACK on NEW", pkt{client, 6, srcIP, localIP, 44000, 80, tcpACK, 1001, 0}, FwdLocal)
	both("server's first reply", pkt{backend, 6, localIP, srcIP, 80, 44000, tcpACK, 5000, 1001}, FwdLocal)
	both("client ACK noted", pkt{client, 6, srcIP, localIP, 44000, 80, tcpACK, 1001, 5000}, FwdLocal)
	both("client ACK a step on", pkt{client, 6, srcIP, localIP, 44000, 80, tcpACK, 1001, 5000 + 3<<20}, FwdLocal)
	both("server ACK a step on", pkt{backend, 6, localIP, srcIP, 80, 44000, tcpACK, 5000, 1001 + 2<<20}, FwdLocal)
	// UDP: its second datagram, and the server's answer.
	open(pkt{client, 17, srcIP, localIP, 44001, 53, 0, 0, 0}, FwdLocal)
	both("UDP again", pkt{client, 17, srcIP, localIP, 44001, 53, 0, 0, 0}, FwdLocal)
	both("UDP answer", pkt{backend, 17, localIP, srcIP, 53, 44001, 0, 0, 0}, FwdLocal)

	// A service flow: the client's segments to the VIP (its backend's membership looked
	// up, then held by the revision and the memo), the backend's replies from VIP:80.
	open(pkt{client, 6, srcIP, vip, 45000, 80, tcpSYN, 7000, 0}, FwdLocal)
	both("service ACK", pkt{client, 6, srcIP, vip, 45000, 80, tcpACK, 7001, 0}, FwdLocal)
	both("service ACK again", pkt{client, 6, srcIP, vip, 45000, 80, tcpACK, 7001, 0}, FwdLocal)
	both("backend's first reply", pkt{backend, 6, localIP, srcIP, 8080, 45000, tcpACK, 9000, 7001}, FwdLocal)
	both("service ACK noted", pkt{client, 6, srcIP, vip, 45000, 80, tcpACK, 7001, 9000}, FwdLocal)
	both("service ACK a step on", pkt{client, 6, srcIP, vip, 45000, 80, tcpACK, 7001, 9000 + 5<<20}, FwdLocal)
	both("backend ACK a step on", pkt{backend, 6, localIP, srcIP, 8080, 45000, tcpACK, 9000, 7001 + 4<<20}, FwdLocal)

	// A policy change after the verdicts: the fast path hands every one of these on
	// untouched (the full stage judges them again).
	var epoch uint32
	if err := objs.CbPolicyEpoch.Get(&epoch); err != nil {
		t.Fatal(err)
	}
	setEpoch(t, objs, epoch+1)
	declined("client ACK after a policy change", pkt{client, 6, srcIP, localIP, 44000, 80, tcpACK, 1001, 5000})
	declined("service ACK after a policy change", pkt{client, 6, srcIP, vip, 45000, 80, tcpACK, 7001, 9000})
}
