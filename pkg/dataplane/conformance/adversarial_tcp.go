package conformance

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// blindRSTOverlay (Datapath v3 issue, hole 5): a process on host 2 forges, over VXLAN,
// RSTs and FINs from b1 (which lives behind host 2, so the inner source passes the overlay's
// checks) with sequence numbers far from the connection's, into a1's TCP connection to
// b1. a1's group lets nobody open TCP to it, so the connection lives only by conntrack:
// the forged segments must not close its state, and past the closing timeout b1 must
// still reach a1 on it.
func blindRSTOverlay(t *testing.T, e *Env) {
	a1, _, b1 := adversaries(t, e)
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: 1, Rules: []dataplane.PolicyRule{
		{ID: "no-tcp-in", Priority: 5, Ingress: true, Proto: 6, Action: dataplane.ActionDeny}}})
	// The injection path works: a forged UDP datagram from b1 reaches a1.
	injectOverlay(t, e, a1, []overlayShot{{"inner-src-behind-sender-udp", b1.EP.IP, 7010, true}})

	const port = 7011
	accepted := make(chan net.Conn, 1)
	var ln net.Listener
	if err := nsexec.Run(b1.NS, func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(b1.ip(), fmt.Sprint(port)))
		return err
	}); err != nil {
		t.Fatalf("listen in b1: %v", err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	client, err := DialTCP(a1.NS, net.JoinHostPort(b1.ip(), fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var server net.Conn
	select {
	case server = <-accepted:
	case <-time.After(3 * time.Second):
		t.Fatal("b1 accepted no connection")
	}
	defer server.Close()

	// b1's next sequence number and acknowledgment, from its segment as a1 receives it.
	capt, err := StartCapture(a1.NS, a1.EP.IfName)
	if err != nil {
		t.Fatal(err)
	}
	serverSays(t, server, client, "hello")
	seq, ack, ok := nextSeq(capt.Frames(), b1.EP.IP, port)
	if !ok {
		t.Fatal("no segment of b1's captured at a1")
	}

	// The forged segments: far ahead, behind, and half the space away.
	to := net.JoinHostPort(e.H1.Cfg.VTEP.String(), fmt.Sprint(vxlanPort))
	cport := uint16(client.LocalAddr().(*net.TCPAddr).Port)
	for _, s := range []struct {
		off   uint32
		flags uint8
	}{{1 << 31, 0x04}, {1 << 30, 0x11}, {1<<32 - 1<<24, 0x04}, {3 << 30, 0x14}} {
		seg := TCPSegment(b1.EP.IP, a1.EP.IP, port, cport, seq+s.off, ack, s.flags, nil)
		inner := EthFrame(a1.EP.MAC, dataplane.ContivMAC(b1.EP.IP), 0x0800, IPv4Packet(b1.EP.IP, a1.EP.IP, 6, seg))
		if err := SendUDP(e.H2.NS, e.H2.Cfg.VTEP.String(), to, VXLANPayload(e.Net.Tag, inner)); err != nil {
			t.Fatal(err)
		}
	}
	// Past the closing timeout (10 s): a state the forged segments closed is gone, and
	// b1's next segment would be a new flow into a1, which a1's group refuses.
	time.Sleep(11 * time.Second)
	serverSays(t, server, client, "still here")
}

// serverSays writes msg on server and checks client reads it within 3 s.
func serverSays(t *testing.T, server, client net.Conn, msg string) {
	t.Helper()
	if _, err := server.Write([]byte(msg)); err != nil {
		t.Fatalf("b1 writes %q: %v", msg, err)
	}
	_ = client.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(client, got); err != nil || string(got) != msg {
		t.Fatalf("a1 reads %q from b1: %q, %v", msg, got, err)
	}
}

// nextSeq finds in frames the last TCP segment from src:sport and returns the sequence
// number that follows it and its acknowledgment number.
func nextSeq(frames [][]byte, src netip.Addr, sport uint16) (seq, ack uint32, ok bool) {
	for _, f := range frames {
		if len(f) < 14+20+20 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			continue
		}
		ip := f[14:]
		ihl := int(ip[0]&0xf) * 4
		if ip[9] != 6 || netip.AddrFrom4([4]byte(ip[12:16])) != src || len(ip) < ihl+20 {
			continue
		}
		tcp := ip[ihl:]
		if binary.BigEndian.Uint16(tcp) != sport {
			continue
		}
		n := int(binary.BigEndian.Uint16(ip[2:])) - ihl - int(tcp[12]>>4)*4
		seq = binary.BigEndian.Uint32(tcp[4:]) + uint32(max(n, 0))
		ack, ok = binary.BigEndian.Uint32(tcp[8:]), true
	}
	return seq, ack, ok
}
