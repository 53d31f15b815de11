package reffwd

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

const (
	tcActShot     = 2
	tcActRedirect = 7
)

// frame is Ethernet + IPv4 (20-byte header) + 40 bytes of payload.
func frame(dstMAC net.HardwareAddr, src, dst netip.Addr) []byte {
	b := append(append([]byte{}, dstMAC...), 0x02, 0x02, 10, 1, 0, 2)
	b = binary.BigEndian.AppendUint16(b, 0x0800)
	h := make([]byte, 20)
	h[0], h[8], h[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(h[2:], 60)
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return append(append(b, h...), make([]byte, 40)...)
}

// The reference forwarder redirects a known destination with its MAC rewritten and drops
// unknown destinations and truncated frames.
func TestReferenceForwarder(t *testing.T) {
	testroot.Need(t)
	f, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, dst := netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.3")
	mac := net.HardwareAddr{0x02, 0x02, 10, 1, 0, 3}
	if err := f.SetDest(dst, 7, mac); err != nil {
		t.Fatal(err)
	}
	run := func(pkt []byte) (uint32, []byte) {
		t.Helper()
		out := make([]byte, len(pkt))
		ret, err := f.Program().Run(&ebpf.RunOptions{Data: pkt, DataOut: out, Repeat: 1})
		if err != nil {
			t.Fatal(err)
		}
		return ret, out
	}
	in := frame(net.HardwareAddr{0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}, src, dst)
	ret, out := run(in)
	if ret != tcActRedirect {
		t.Errorf("known destination: return %d, want TC_ACT_REDIRECT (%d)", ret, tcActRedirect)
	}
	if !bytes.Equal(out[:6], mac) {
		t.Errorf("destination MAC %v, want %v", net.HardwareAddr(out[:6]), mac)
	}
	if !bytes.Equal(out[6:], in[6:]) {
		t.Errorf("bytes after the destination MAC changed")
	}
	if ret, _ := run(frame(mac, src, netip.MustParseAddr("10.1.0.99"))); ret != tcActShot {
		t.Errorf("unknown destination: return %d, want TC_ACT_SHOT", ret)
	}
	// The test run refuses an IPv4 ethertype with a short header: call it ARP.
	short := append([]byte(nil), in[:14+19]...)
	binary.BigEndian.PutUint16(short[12:], 0x0806)
	if ret, _ := run(short); ret != tcActShot {
		t.Errorf("frame shorter than Ethernet + IPv4: return %d, want TC_ACT_SHOT", ret)
	}
	if err := f.SetDest(netip.MustParseAddr("::1"), 7, mac); err == nil {
		t.Error("SetDest accepted an IPv6 address")
	}
}
