package ebpf

import (
	"net/netip"
	"testing"
)

// Review of the one-owner window (branch tcpwin-rev): paths the first tests left out.

// TestWindowNodePortWrap: a node port flow whose sequence numbers wrap at 2^32 keeps its
// window across the wrap (a RST a window past the note, wrapped, is blind; one just past
// 2^32 inside it closes), and an acknowledgment of 0 is never noted (0 means none).
func TestWindowNodePortWrap(t *testing.T) {
	objs, _ := nodePortFixture(t, 6, 80, 8080, 30080)
	const cport = 5900
	client := func(flags uint8, seq, ack uint32) runResult {
		t.Helper()
		return run(t, objs, objs.CbFromUplink, withSeq(l4Frame(6, worldIP, hostIP, cport, 30080, flags, 0), seq, ack), nil)
	}
	backend := func(flags uint8, seq, ack uint32) runResult {
		t.Helper()
		return run(t, objs, objs.CbFromContainer, withSeq(l4Frame(6, srcIP, worldIP, 8080, cport, flags, 0), seq, ack), nil)
	}
	entry := func() contivbpfCbCtEntry {
		t.Helper()
		e, ok := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, srcIP, cport, 8080)
		if !ok {
			t.Fatal("no entry")
		}
		return e
	}
	isn := uint32(0xffffff00)
	client(tcpSYN, isn, 0).expect(t, tcActRedirect, FwdNodePort)
	backend(tcpSYN|tcpACK, 9000, isn+1).expect(t, tcActRedirect, FwdNodePortReply)
	client(tcpACK, isn+1, 9001).expect(t, tcActRedirect, FwdNodePort)
	backend(tcpACK, 9001, 0).expect(t, tcActRedirect, FwdNodePortReply) // ack 0: no note
	if e := entry(); e.TcpAck[1] != isn+1 {
		t.Fatalf("ack 0 noted: %v", e.TcpAck)
	}
	client(tcpRST, isn+1+winSize, 0).expect(t, tcActShot, DropNodePortBlind) // wraps to 0x7fff01
	client(tcpRST, isn-1, 0).expect(t, tcActShot, DropNodePortBlind)
	client(tcpRST, 0x100, 0).expect(t, tcActRedirect, FwdNodePort) // across the wrap, inside
	if e := entry(); e.State != uint8(contivbpfCbCtStateCB_CTS_CLOSING) {
		t.Errorf("in-window RST across the wrap: state %d", e.State)
	}
}

// TestWindowNodePortRemoteAgrees: a remote backend's node port flow keeps the client's
// acknowledgments in two tables (conntrack's tcp_ack[0], the NAT entry's tcp_ref), noted
// on the same segments by the same step; the backend side's FIN (which any process on the
// peer host can send) with 7.5 MiB in flight past a note lagging 0.9 MiB is blind to both,
// with a current note it closes both.
func TestWindowNodePortRemoteAgrees(t *testing.T) {
	objs, vip := nodePortFixture(t, 6, 80, 8080, 30080)
	putTestService(t, objs, 1, vip, 80, 6, 8080, remoteIP)
	fromPeer := &skbCtx{CB: [5]uint32{ip4(netip.MustParseAddr(testVTEP)), testNet}}
	for _, c := range []struct {
		cport  uint16
		behind uint32
		close  bool
	}{{5960, lag, false}, {5961, 0, true}} {
		client := func(flags uint8, seq, ack uint32) runResult {
			t.Helper()
			return run(t, objs, objs.CbFromUplink, withSeq(l4Frame(6, worldIP, hostIP, c.cport, 30080, flags, 0), seq, ack), nil)
		}
		r := client(tcpSYN, 2000, 0)
		r.expect(t, tcActRedirect, FwdTunnel)
		_, _, natPort, _ := checkSums(t, r.out)
		peer := func(flags uint8, seq, ack uint32) {
			t.Helper()
			run(t, objs, objs.CbTestOverlay, withSeq(l4Frame(6, remoteIP, hostIP, 8080, natPort, flags, 0), seq, ack), fromPeer).expect(t, tcActRedirect, FwdNodePortReply)
		}
		peer(tcpSYN|tcpACK, 5000, 2001)
		client(tcpACK, 2001, 5001).expect(t, tcActRedirect, FwdTunnel)
		noted := uint32(5001 + winStep + 5)
		client(tcpACK, 2001, noted).expect(t, tcActRedirect, FwdTunnel)
		last := noted + c.behind
		client(tcpACK, 2001, last).expect(t, tcActRedirect, FwdTunnel)
		peer(tcpFIN|tcpACK, last+inFlight, 2001)
		ce, ok := ctEntryKind(t, objs, testZone, ctKindNodePort, 6, worldIP, remoteIP, c.cport, 8080)
		if !ok {
			t.Fatal("no ct entry")
		}
		var ne contivbpfCbSnatEntry
		k := contivbpfCbSnatKey{Zone: testZone, Kind: ctKindNodePort, Saddr: ip4(worldIP), Daddr: ip4(remoteIP), Sport: nport(c.cport), Dport: nport(8080), Proto: 6}
		if err := objs.CbSnat.Lookup(&k, &ne); err != nil {
			t.Fatal(err)
		}
		if ce.TcpAck[0] != noted || ne.TcpRef != noted {
			t.Errorf("port %d: conntrack noted %d, NAT %d; want both %d", c.cport, ce.TcpAck[0], ne.TcpRef, noted)
		}
		closing := uint8(contivbpfCbCtStateCB_CTS_CLOSING)
		if (ce.State == closing) != c.close || (ne.State == closing) != c.close {
			t.Errorf("port %d: ct %d nat %d, want closing=%v", c.cport, ce.State, ne.State, c.close)
		}
	}
}

// TestWindowNodePortUpgradeClientSide: an old-form entry (CB_CT_TCP_REF_OLD) is moved only
// by the backend's side: the client's segments (from the wire: anyone) neither clear the
// flag nor touch svc_id, so the client's blind RST is still dropped by the old reference.
func TestWindowNodePortUpgradeClientSide(t *testing.T) {
	objs, _ := nodePortFixture(t, 6, 80, 8080, 30080)
	const cport = 5810
	client, backend := nodePortFlow(t, objs, cport)
	entry := oldFormNodePort(t, objs, cport, 1001, [2]uint32{})
	client(tcpACK, 1001, 9001+5*winStep).expect(t, tcActRedirect, FwdNodePort)
	client(tcpSYN|tcpACK, 1001, 0x40000000).expect(t, tcActRedirect, FwdNodePort)
	if e := entry(); e.SvcId != 1001 || e.Flags&uint8(contivbpfCbCtFlagsCB_CT_TCP_REF_OLD) == 0 {
		t.Fatalf("client-side segments changed the old form: %+v", e)
	}
	// The backend (a local endpoint) is never blind: its FIN outside the client's (forged)
	// noted window closes all the same.
	backend(tcpFIN|tcpACK, 9001+winSize, 1001).expect(t, tcActRedirect, FwdNodePortReply)
	if e := entry(); e.State != uint8(contivbpfCbCtStateCB_CTS_CLOSING) {
		t.Errorf("a backend FIN outside the client's noted window left the flow in state %d, want closing", e.State)
	}
	client(tcpRST, 1001+rstWin, 0).expect(t, tcActShot, DropNodePortBlind)
}
