package wgsteer

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// vxlanFrame is a VXLAN packet's UDP payload: the header (VNI 42) and a short inner
// Ethernet/IPv4 frame.
func vxlanFrame() []byte {
	b := []byte{0x08, 0, 0, 0, 0, 0, 42, 0}
	inner := make([]byte, 14+20)
	copy(inner[0:6], []byte{0x02, 0xcb, 0, 0, 0, 2})
	copy(inner[6:12], []byte{0x02, 0xcb, 0, 0, 0, 1})
	inner[12], inner[13] = 0x08, 0x00
	inner[14] = 0x45
	return append(b, inner...)
}

// TestClearOverlayRefused: host B runs the eBPF datapath with encryption on
// (ebpf.Options.Encrypted) and its WireGuard steering. A VXLAN packet that a process on
// peer host A (no encryption there yet: any process, any host of the underlay could send
// it) sends in clear from A's VTEP crosses the wire (B's capture sees it) and is dropped
// where it enters B (drop_clear_overlay): B's VXLAN device never receives it. Once A
// encrypts too, the same packet arrives through WireGuard and reaches B's VXLAN device.
func TestClearOverlayRefused(t *testing.T) {
	ctx := context.Background()
	h := newTwoHosts(t, "cbco")
	dir := &directory{recs: map[string]model.WireGuardHost{}, hidden: map[string]bool{}}

	pinBase := filepath.Join("/sys/fs/bpf", "cbco-"+h.id)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	vx := "cbcovx" + h.id
	start := func(vtep netip.Addr, egressIf string) (*ebpf.Driver, error) {
		return ebpf.New(ctx, dataplane.HostConfig{Host: "b", NetNS: h.pb, VTEP: vtep, VXLANPort: 4789},
			ebpf.Options{PinRoot: filepath.Join(pinBase, "b"), VXLANIf: vx, MapEntries: 1024, CgroupPath: "off", EgressIf: egressIf, Encrypted: true})
	}
	// No device holds the VTEP: nowhere to refuse clear packets, so no start.
	if d, err := start(netip.MustParseAddr("192.168.77.9"), ""); err == nil || !strings.Contains(err.Error(), "no device of this host holds the vtep") {
		if d != nil {
			_ = d.Teardown(ctx)
		}
		t.Fatalf("encrypted with the VTEP on no device: %v, want refused", err)
	}
	var drv *ebpf.Driver
	for _, egressIf := range []string{"lo", ""} {
		// Egress NAT out of another device: cb_from_uplink goes on the VTEP's device too.
		// Then on the VTEP's device as the egress device.
		d, err := start(h.vtepB, egressIf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Teardown(context.Background()) })
		drv = d
		_, err = os.Stat(filepath.Join(pinBase, "b", "links", "underlay_"+h.vb))
		if egressIf != "" && err != nil {
			t.Errorf("egress out of %s: no link on the VTEP's device: %v", egressIf, err)
		}
		if egressIf == "" && err == nil {
			t.Errorf("egress out of the VTEP's device: a second link on it")
		}
		if egressIf != "" {
			clearDropped(t, h, d, vx)
			if err := d.Teardown(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	sb := openSteer(t, ctx, dir, h.pb, "cbcow"+h.id+"b", "b", h.vtepB, dataplane.Peer{Host: "a", VTEP: h.vtepA})

	rx, dropped, send := probes(t, h, drv, vx)
	clearDropped(t, h, drv, vx)

	// A encrypts: the same packets come out of B's WireGuard device and are taken.
	sa := openSteer(t, ctx, dir, h.pa, "cbcow"+h.id+"a", "a", h.vtepA, dataplane.Peer{Host: "b", VTEP: h.vtepB})
	for _, s := range []*Steer{sa, sb} {
		if err := s.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rx1, drop1 := rx(), dropped()
	for deadline := time.Now().Add(5 * time.Second); rx() == rx1 && time.Now().Before(deadline); {
		send()
		time.Sleep(100 * time.Millisecond)
	}
	if rx() == rx1 {
		t.Fatal("B's VXLAN device received nothing through WireGuard")
	}
	if d := dropped() - drop1; d != 0 {
		t.Errorf("drop_clear_overlay counted %v packets with A encrypting", d)
	}
}

// probes returns what B's VXLAN device vx received, the drop_clear_overlay packets drv
// counted, and a send of one VXLAN packet from A's VTEP to B's.
func probes(t *testing.T, h twoHosts, drv *ebpf.Driver, vx string) (rx func() uint64, dropped func() float64, send func()) {
	rx = func() uint64 {
		t.Helper()
		var n uint64
		err := nsexec.Run(h.pb, func() error {
			l, err := netlink.LinkByName(vx)
			if err == nil {
				n = l.Attrs().Statistics.RxPackets
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	dropped = func() float64 {
		t.Helper()
		c, err := drv.Counters(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return c["drop_clear_overlay_packets"]
	}
	send = func() {
		t.Helper()
		err := nsexec.Run(h.pa, func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: h.vtepA.AsSlice()})
			if err != nil {
				return err
			}
			defer c.Close()
			_, _ = c.WriteToUDPAddrPort(vxlanFrame(), netip.AddrPortFrom(h.vtepB, 4789))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return rx, dropped, send
}

// clearDropped sends three VXLAN packets in clear from A's VTEP (A not encrypting): B's
// wire sees them, drv counts them drop_clear_overlay, B's VXLAN device never gets them.
func clearDropped(t *testing.T, h twoHosts, drv *ebpf.Driver, vx string) {
	t.Helper()
	rx, dropped, send := probes(t, h, drv, vx)
	capture, err := conformance.StartCapture(h.pb, h.vb)
	if err != nil {
		t.Fatal(err)
	}
	rx0, drop0 := rx(), dropped()
	for range 3 {
		send()
	}
	time.Sleep(200 * time.Millisecond)
	if n := udpPorts(capture.Frames())[4789]; n != 3 {
		t.Fatalf("B's wire saw %d clear VXLAN packets, want 3: the test proves nothing", n)
	}
	if n := rx() - rx0; n != 0 {
		t.Errorf("B's VXLAN device received %d clear packets from the underlay", n)
	}
	if d := dropped() - drop0; d != 3 {
		t.Errorf("drop_clear_overlay counted %v, want 3", d)
	}
}
