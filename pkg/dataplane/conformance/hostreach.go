package conformance

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// HostSocket is a UDP socket on an address of a host namespace: what a container whose
// group denies everything it sends must never reach, whatever it does to its own
// namespace (issue 33).
type HostSocket struct {
	hostNS string
	conn   net.PacketConn
}

// hostReachMsg is the payload ReachedBy sends and looks for.
const hostReachMsg = "unjudged"

// ListenHost opens a UDP socket on addr (ip:port) inside the host namespace at hostNS,
// closed at cleanup.
func ListenHost(t testing.TB, hostNS, addr string) *HostSocket {
	t.Helper()
	h := &HostSocket{hostNS: hostNS}
	if err := nsexec.Run(hostNS, func() error {
		var err error
		h.conn, err = net.ListenPacket("udp4", addr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, hostNS, err)
	}
	t.Cleanup(func() { h.conn.Close() })
	return h
}

// ReachedBy sends datagrams from ep's container (its interface eth0) to the socket the
// way a root in the container can without the datapath's help: the neighbour entry of gw
// (its gateway) is set by hand to the host veth's MAC, so no ARP answer is needed. It
// reports whether one arrived from ep's address. A host end or container end that is gone
// reaches nothing.
func (h *HostSocket) ReachedBy(t testing.TB, ep dataplane.Endpoint, gw netip.Addr) bool {
	t.Helper()
	var hostEnd *net.Interface
	if err := nsexec.Run(h.hostNS, func() (err error) { hostEnd, err = net.InterfaceByName(ep.HostIfName); return }); err != nil {
		return false // no host end, no way out
	}
	if err := setNeigh(ep.NetNS, gw, hostEnd.HardwareAddr.String()); err != nil {
		return false // no container end
	}
	_ = nsexec.Run(ep.NetNS, func() error {
		s, err := net.Dial("udp4", h.conn.LocalAddr().String())
		if err != nil {
			return err
		}
		defer s.Close()
		for range 3 {
			_, _ = s.Write([]byte(hostReachMsg))
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
	buf := make([]byte, 64)
	_ = h.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	got := false
	for {
		n, from, err := h.conn.ReadFrom(buf)
		if err != nil {
			return got
		}
		if string(buf[:n]) == hostReachMsg && from.(*net.UDPAddr).IP.Equal(ep.IP.AsSlice()) {
			got = true
		}
	}
}
