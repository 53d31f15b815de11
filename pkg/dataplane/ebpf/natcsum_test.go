package ebpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestServiceNATChecksums: the service NAT's checksum updates (cb_l4_nat, without the
// helper unless the skb's checksum is COMPLETE) leave every TCP and UDP packet of a
// service flow right, as real sockets send them, both ways. With transmit checksumming on
// (the default) the packets are CHECKSUM_PARTIAL: the field must hold the pseudo header's
// sum for the rewritten addresses, or a device completing it would put a wrong checksum
// on the wire (a veth peer never checks, so nothing else here would notice). With it off
// (ethtool) they carry whole checksums, which must verify.
func TestServiceNATChecksums(t *testing.T) {
	for _, offload := range []bool{true, false} {
		name := "partial"
		if !offload {
			name = "whole"
		}
		t.Run(name, func(t *testing.T) { testServiceNATChecksums(t, offload) })
	}
}

func testServiceNATChecksums(t *testing.T, offload bool) {
	h := newOneHost(t)
	a, b, vip := h.serviceBetween(t, dataplane.ServicePort{Proto: 6, Port: 80, TargetPort: 8080}, dataplane.ServicePort{Proto: 17, Port: 53, TargetPort: 5353})
	if !offload {
		for _, ep := range []dataplane.Endpoint{a, b} {
			if out, err := exec.Command("nsenter", "--net="+ep.NetNS, "ethtool", "-K", ep.IfName, "tx", "off").CombinedOutput(); err != nil {
				t.Fatalf("transmit checksumming off in %s: %v: %s", ep.ID, err, out)
			}
		}
	}
	tsrv, err := conformance.StartTCPEchoPort(b.NetNS, b.IP.String(), 8080)
	if err != nil {
		t.Fatal(err)
	}
	defer tsrv.Close()
	usrv, err := conformance.StartUDPEcho(b.NetNS, b.IP.String(), 5353)
	if err != nil {
		t.Fatal(err)
	}
	defer usrv.Close()
	capA, err := conformance.StartCapture(a.NetNS, a.IfName)
	if err != nil {
		t.Fatal(err)
	}
	capB, err := conformance.StartCapture(b.NetNS, b.IfName)
	if err != nil {
		_ = capA.StopFrames()
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		c, err := conformance.DialTCPTimeout(a.NetNS, "10.50.0.100:80", 3*time.Second)
		if err == nil {
			err = conformance.EchoRoundTrip(c, 64<<10)
			c.Close()
		}
		if err != nil {
			t.Errorf("TCP through the VIP: %v", err)
		}
		if _, err := conformance.UDPExchange(a.NetNS, "10.50.0.100:53", make([]byte, 600), 2*time.Second); err != nil {
			t.Errorf("UDP through the VIP: %v", err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the last frames reach the captures
	atA, atB := capA.StopFrames(), capB.StopFrames()
	// To the backend: client → backend:target (DNAT); to the client: VIP:port → client (the
	// reply's source restored).
	toB := checkNATSums(t, "to the backend", atB, a.IP, b.IP)
	toA := checkNATSums(t, "to the client", atA, vip, a.IP)
	for _, c := range []struct {
		what string
		n    map[string]int
	}{{"to the backend", toB}, {"to the client", toA}} {
		for _, kind := range []string{"tcp", "udp"} {
			want := kind + " whole"
			if offload {
				want = kind + " partial"
			}
			if c.n[want] == 0 {
				t.Errorf("%s: no %s packet seen (%v): the case this run checks did not happen", c.what, want, c.n)
			}
		}
	}
}

// checkNATSums checks the TCP and UDP checksum of every IPv4 frame src → dst in frames
// and counts them by protocol and kind ("tcp partial", "udp whole", ...).
func checkNATSums(t *testing.T, what string, frames []conformance.CapturedFrame, src, dst netip.Addr) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, f := range frames {
		d := f.Data
		if len(d) < 14+20 || binary.BigEndian.Uint16(d[12:]) != 0x0800 {
			continue
		}
		ip := d[14:]
		ihl, tot, proto := int(ip[0]&0xf)*4, int(binary.BigEndian.Uint16(ip[2:])), ip[9]
		if netip.AddrFrom4([4]byte(ip[12:16])) != src || netip.AddrFrom4([4]byte(ip[16:20])) != dst ||
			(proto != 6 && proto != 17) || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			continue
		}
		kind := map[uint8]string{6: "tcp", 17: "udp"}[proto]
		off := map[uint8]int{6: 16, 17: 6}[proto]
		if len(ip) < ihl+off+2 {
			continue
		}
		field := binary.BigEndian.Uint16(ip[ihl+off:])
		ps := pseudo(src, dst, proto, tot-ihl)
		if f.CsumPartial {
			n[kind+" partial"]++
			// The field is the pseudo header's sum, folded, not complemented (±0 alike).
			if want := ^csum(nil, ps); field != want && !(field|want == 0xffff && field&want == 0) {
				t.Errorf("%s: %s %v: partial checksum field %#04x, want the pseudo header's sum %#04x", what, kind, frameLabel(ip, ihl), field, want)
			}
			continue
		}
		if len(ip) < tot {
			continue // cut short by the capture buffer
		}
		n[kind+" whole"]++
		if proto == 17 && field == 0 {
			continue // no checksum
		}
		if csum(ip[ihl:tot], ps) != 0 {
			t.Errorf("%s: %s %v: bad checksum %#04x", what, kind, frameLabel(ip, ihl), field)
		}
	}
	return n
}

func frameLabel(ip []byte, ihl int) string {
	return fmt.Sprintf("%v:%d → %v:%d", netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(ip[ihl:]),
		netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(ip[ihl+2:]))
}
