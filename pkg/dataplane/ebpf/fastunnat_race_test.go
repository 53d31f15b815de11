package ebpf

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestServiceFastReplyEntryFreed races an established service flow's reply, taken by the
// fast stage on the backend's interface entry read in place from cb_iface_direct, with
// the agent freeing that entry's place (ifaces.go freeDirect, as when QoS is added to the
// live endpoint: its address is cleared first). The fast stage reads the address once and
// checks the packet's source against it; the reply leaving from VIP:port must have its
// checksums fixed up from that source, never from the entry's address read again, which
// may be 0 by then (every reply sent must carry valid IP and L4 checksums).
func TestServiceFastReplyEntryFreed(t *testing.T) {
	objs := memoFixture(t, 9, netip.MustParseAddr("10.1.0.101"))
	vip := netip.MustParseAddr("10.1.0.101")
	fc := objs.CbFromContainer
	run(t, objs, fc, l4Frame(6, srcIP, vip, 43000, 80, tcpSYN, 0), nil).expect(t, tcActRedirect, FwdLocal)
	client, backend, setIfc := backendIfaces(t, objs)
	setIfc(backend)
	defer setIfc(client)
	reply := l4Frame(6, localIP, srcIP, 8080, 43000, tcpACK, 0)
	for range 2 { // the first establishes the flow, the second takes the fast path
		r := run(t, objs, fc, reply, nil)
		r.expect(t, tcActRedirect, FwdLocal)
		if src, _, sport, _ := checkSums(t, r.out); src != vip || sport != 80 {
			t.Fatalf("the reply left from %v:%d, want %v:80", src, sport, vip)
		}
	}

	freed := backend
	freed.Ip = 0 // freeDirect's first write
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	flip := false
	stop := rewriteWhile(ctx, t, func() error {
		flip = !flip
		if flip {
			return objs.CbIfaceDirect.Put(uint32(loIfindex), &freed)
		}
		return objs.CbIfaceDirect.Put(uint32(loIfindex), &backend)
	})
	out := make([]byte, len(reply)+256)
	runs, sent, bad := 0, 0, 0
	for ctx.Err() == nil && bad == 0 {
		opts := &ebpf.RunOptions{Data: reply, DataOut: out, Repeat: 1}
		ret, err := fc.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		runs++
		if ret != tcActRedirect {
			continue // found the place free: dropped, as it should be
		}
		sent++
		if !validSums(opts.DataOut) {
			bad++
		}
	}
	stop()
	if bad > 0 {
		t.Fatalf("a service reply left with a bad checksum after %d runs (%d sent): unNATed from the entry's address read again as 0", runs, sent)
	}
	t.Logf("%d runs, %d sent", runs, sent)
}

// validSums reports whether IPv4 frame f's IP and L4 checksums are valid.
func validSums(f []byte) bool {
	ip := f[14:]
	n := int(binary.BigEndian.Uint16(ip[2:]))
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	return csum(ip[:20], 0) == 0 && csum(ip[20:n], pseudo(src, dst, ip[9], n-20)) == 0
}
