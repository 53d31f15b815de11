package conformance

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The addresses beyond host 1 the egress cases reach: the cloud instance metadata
// service, another link-local address and one of the Internet (documentation range).
const (
	metadataIP  = "169.254.169.254"
	linkLocalIP = "169.254.1.1"
	internetIP  = "203.0.113.9"
)

// outsideHost is what the egress cases put beyond host 1's uplink: host 2's namespace (a
// namespace of the test on the far side of host 1's wire, where a cloud's metadata
// service sits beyond a node's uplink) holds each address on its loopback with a TCP echo
// server on port 80 and a UDP echo server on port 53, and host 1 routes them via host 2's
// wire address. Host 2's datapath takes no part: the packets are for its own stack.
type outsideHost struct {
	tcp map[string]*TCPServer
	udp map[string]*UDPServer
}

// newOutsideHost sets up the outside; everything it adds is removed when t ends, passed
// or failed.
func newOutsideHost(t *testing.T, e *Env) *outsideHost {
	t.Helper()
	run := func(ns string, args ...string) {
		t.Helper()
		if out, err := exec.Command("nsenter", append([]string{"--net=" + ns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), filepath.Base(ns), err, out)
		}
	}
	undo := func(ns string, args ...string) {
		t.Cleanup(func() { _ = exec.Command("nsenter", append([]string{"--net=" + ns}, args...)...).Run() })
	}
	o := &outsideHost{tcp: map[string]*TCPServer{}, udp: map[string]*UDPServer{}}
	for _, a := range []string{metadataIP, linkLocalIP, internetIP} {
		run(e.H2.NS, "ip", "addr", "add", a+"/32", "dev", "lo")
		undo(e.H2.NS, "ip", "addr", "del", a+"/32", "dev", "lo")
		srv, err := StartTCPEchoPort(e.H2.NS, a, 80)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		u, err := StartUDPEcho(e.H2.NS, a, 53)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(u.Close)
		o.tcp[a], o.udp[a] = srv, u
	}
	// No device named: on OVS the wire's address lives on the underlay bridge's port.
	for _, p := range []string{"169.254.0.0/16", "203.0.113.0/24"} {
		run(e.H1.NS, "ip", "route", "add", p, "via", e.H2.Cfg.VTEP.String())
		undo(e.H1.NS, "ip", "route", "del", p, "via", e.H2.Cfg.VTEP.String())
	}
	return o
}

// egressContainer attaches one container to host 1 for the egress cases.
func egressContainer(t *testing.T, e *Env) *Container {
	t.Helper()
	c := e.AddContainer(t, "m1", "10.36.1.1")
	c.EP.EPGID = 1
	e.H1.State.Endpoints = append(e.H1.State.Endpoints, c.EP)
	e.H1.Sync(t)
	return c
}

// toLinkLocal matches untagged IPv4 frames to 169.254.0.0/16 (not inside a tunnel).
func toLinkLocal(f []byte) bool {
	return len(f) >= 14+20 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && f[14+16] == 169 && f[14+17] == 254
}

// toInternet matches untagged IPv4 frames to internetIP.
func toInternet(f []byte) bool {
	return len(f) >= 14+20 && binary.BigEndian.Uint16(f[12:]) == 0x0800 &&
		netip.AddrFrom4([4]byte(f[14+16:14+20])) == netip.MustParseAddr(internetIP)
}

// reach tries ICMP echo, a TCP connection (one echoed message) and a UDP echo from c to
// addr and returns which of them got an answer.
func reach(c *Container, addr string) (ping, tcp, udp bool) {
	ping = Ping(c.NS, addr, time.Second) == nil
	if conn, err := DialTCPTimeout(c.NS, net.JoinHostPort(addr, "80"), time.Second); err == nil {
		tcp = EchoRoundTrip(conn, 64) == nil
		conn.Close()
	}
	_, err := UDPExchange(c.NS, net.JoinHostPort(addr, "53"), marker("udp"), 500*time.Millisecond)
	return ping, tcp, err == nil
}

// metadataUnreachable (Datapath v3 issue, hole 3): a container's packets to the cloud
// metadata address 169.254.169.254, and to another link-local address, do not leave through
// host 1's egress path by default: a fake metadata service beyond host 1's wire (in a
// namespace of the test, outsideHost) gets no ping, TCP connection or UDP datagram, and
// no frame to 169.254.0.0/16 crosses the wire. The same container reaches an Internet
// address the same way (the egress path works, so the refusal is what stops the others);
// a backend without any egress path (OVS: docs/ovs.md) sends nothing at all out.
func metadataUnreachable(t *testing.T, e *Env) {
	o := newOutsideHost(t, e)
	c := egressContainer(t, e)
	var reached [3]bool
	sites := []probeSite{{"wire", e.H1.NS, wireIf}, {"container", c.NS, c.EP.IfName}}
	got := probe(t, sites, []func([]byte) bool{toLinkLocal, toInternet}, func() error {
		reached[0], reached[1], reached[2] = reach(c, internetIP)
		for _, a := range []string{metadataIP, linkLocalIP} {
			ping, tcp, udp := reach(c, a)
			if ping || tcp || udp {
				t.Errorf("%s reached from a container (ping %v, tcp %v, udp %v)", a, ping, tcp, udp)
			}
		}
		return nil
	})
	for _, a := range []string{metadataIP, linkLocalIP} {
		if n, f := o.tcp[a].Accepted.Load(), o.udp[a].Flows(); n > 0 || f > 0 {
			t.Errorf("the outside's %s got %d TCP connections and %d UDP flows", a, n, f)
		}
	}
	if n := got["wire"][0]; n > 0 {
		t.Errorf("%d frames to 169.254.0.0/16 left host 1 on its wire", n)
	}
	// The container did send them: they reached the datapath, which kept them (on a
	// backend without an egress path nothing else would show the probes were sent).
	if n := got["container"][0]; n == 0 {
		t.Errorf("the container sent no frame to 169.254.0.0/16 (the probe does not work)")
	}
	egress := reached[0] && reached[1] && reached[2]
	switch {
	case egress && got["wire"][1] == 0:
		t.Errorf("the egress to %s went unseen on the wire (the probe does not work)", internetIP)
	case !egress && e.H1.Driver.Name() != "ovs":
		t.Errorf("%s not reached from a container (ping, tcp, udp: %v): the egress path does not work (the probe does not work)", internetIP, reached)
	case !egress:
		t.Logf("%s not reached (ping, tcp, udp: %v): %s has no egress path, nothing leaves", internetIP, reached, e.H1.Driver.Name())
	}
}

// RunEgressMetadataAllowed checks a backend started with its metadata opt-in (the eBPF
// backend's EgressAllowMetadata, netplugin --egress-allow-metadata): on hosts from
// factory, a container reaches the fake metadata service beyond host 1 (outsideHost) by
// ping, TCP and UDP, from host 1's own address (egress NAT: as the node), while another
// link-local address stays refused. metadataUnreachable is the default's case.
func RunEgressMetadataAllowed(t *testing.T, factory Factory) {
	e := NewEnv(t, factory)
	o := newOutsideHost(t, e)
	c := egressContainer(t, e)
	if ping, tcp, udp := reach(c, metadataIP); !ping || !tcp || !udp {
		t.Errorf("%s with the opt-in: ping %v, tcp %v, udp %v; want all", metadataIP, ping, tcp, udp)
	}
	for _, from := range o.udp[metadataIP].Clients() {
		if h, _, _ := net.SplitHostPort(from); h != e.H1.Cfg.VTEP.String() {
			t.Errorf("the metadata service saw %s, want host 1's address %v", from, e.H1.Cfg.VTEP)
		}
	}
	if ping, tcp, udp := reach(c, linkLocalIP); ping || tcp || udp {
		t.Errorf("%s reached with the metadata opt-in (ping %v, tcp %v, udp %v)", linkLocalIP, ping, tcp, udp)
	}
}
