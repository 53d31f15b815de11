package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// RunAdversarial drives a Driver through the cases of design §9 ("Trust") with crafted
// traffic from hostile containers and from the underlay: forged source IP/MAC and ARP
// sender, VLAN-tagged frames from a container, VXLAN injected from a peer's address with
// inner sources that do not live behind it, a bare TCP ACK trying to open state a SYN
// could not, a SYN reusing a reset flow's tuple after the policy changed, a VIP of
// another tenant, UDP flows that must be spread over a service's backends, a live UDP
// flow whose backend is removed, a container asking a fake cloud metadata service beyond
// the host's wire, and a peer host opening flows toward a pod past the conntrack quota.
// Everything is observed from containers and the wire, so every backend runs the same
// cases.
func RunAdversarial(t *testing.T, factory Factory) {
	runScenarios(t, func(t *testing.T, tweak func(*dataplane.HostConfig)) *Env {
		return newEnvWith(t, factory, dataplane.FwdBridge, tweak)
	}, []scenario{
		{name: "spoofed-source", run: spoofedSource},
		{name: "spoofed-arp", run: spoofedARP},
		{name: "vlan-tagged-from-container", run: vlanFromContainer},
		{name: "overlay-injection", run: overlayInjection},
		{name: "overlay-peer-host-source", run: overlayPeerHostSource},
		{name: "blind-rst-overlay", run: blindRSTOverlay},
		{name: "udp-spread", run: udpSpread},
		{name: "backend-removal-live-udp", run: backendRemovalLiveUDP},
		{name: "cross-tenant-vip", run: crossTenantVIP},
		{name: "bare-ack", run: bareACK},
		{name: "rst-policy-change-syn", run: rstPolicyChangeSYN},
		{name: "icmp-port-unreachable-through-vip", run: portUnreachableThroughVIP},
		{name: "client-icmp-error-through-vip", run: clientErrorThroughVIP},
		{name: "hairpin", run: hairpin},
		{name: "reject-no-backend", run: rejectNoBackend},
		{name: "large-udp", run: largeUDP},
		{name: "denied-service-no-state", run: deniedServiceNoState},
		{name: "self-no-state", run: selfNoState},
		{name: "shared-vip-large-udp", run: sharedVIPLargeUDP},
		{name: "fragment-hoard", run: fragmentHoard},
		{name: "answer-flood", run: answerFlood},
		{name: "metadata-unreachable", run: metadataUnreachable},
		{name: "ct-quota-opener", ownHosts: true, hostConfig: withOpenerQuota, run: ctQuotaOpener},
	})
}

// RunOverlayAdversarial runs the adversarial scenarios that send hand-made overlay
// packets (and the legitimate ones beside them), for a backend option that changes how
// the overlay is received (the eBPF backend's XDP prefilter).
func RunOverlayAdversarial(t *testing.T, factory Factory) {
	runScenarios(t, func(t *testing.T, tweak func(*dataplane.HostConfig)) *Env {
		return newEnvWith(t, factory, dataplane.FwdBridge, tweak)
	}, []scenario{
		{name: "overlay-injection", run: overlayInjection},
		{name: "overlay-peer-host-source", run: overlayPeerHostSource},
		{name: "blind-rst-overlay", run: blindRSTOverlay},
	})
}

// adversaries attaches a1 (group 1) and a2 (group 2) on host 1 and b1 (group 2) on host
// 2, and checks that a1 reaches both.
func adversaries(t *testing.T, e *Env) (a1, a2, b1 *Container) {
	t.Helper()
	a1, a2, b1 = e.threeContainers(t, 1, 2, 2)
	PingOK(t, a1.NS, a2.ip(), 3)
	PingOK(t, a1.NS, b1.ip(), 3)
	return a1, a2, b1
}

// marker returns a random payload that identifies one probe in a capture.
func marker(label string) []byte {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return append([]byte("cbe-"+label+"-"), b...)
}

// containing matches frames that contain each marker.
func containing(markers [][]byte) []func([]byte) bool {
	out := make([]func([]byte) bool, len(markers))
	for i, m := range markers {
		out[i] = func(f []byte) bool { return bytes.Contains(f, m) }
	}
	return out
}

// tcpPorts matches untagged IPv4 TCP frames with these ports.
func tcpPorts(sport, dport uint16) func([]byte) bool {
	return func(f []byte) bool {
		if len(f) < 14+20+4 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[14+9] != 6 {
			return false
		}
		l4 := f[14+int(f[14]&0xf)*4:]
		return len(l4) >= 4 && binary.BigEndian.Uint16(l4) == sport && binary.BigEndian.Uint16(l4[2:]) == dport
	}
}

// probeSite is where a probe captures: an interface in a namespace.
type probeSite struct {
	name, ns, ifname string
}

// probe captures at each site, runs send, and returns per site how many frames matched
// each matcher.
func probe(t *testing.T, sites []probeSite, matchers []func([]byte) bool, send func() error) map[string][]int {
	t.Helper()
	caps := make([]*Capture, len(sites))
	for i, s := range sites {
		c, err := StartCapture(s.ns, s.ifname)
		if err != nil {
			t.Fatalf("capture at %s: %v", s.name, err)
		}
		caps[i] = c
	}
	err := send()
	time.Sleep(400 * time.Millisecond)
	out := map[string][]int{}
	for i, s := range sites {
		counts := make([]int, len(matchers))
		for _, f := range caps[i].Frames() {
			for j, m := range matchers {
				if m(f) {
					counts[j]++
				}
			}
		}
		out[s.name] = counts
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// spoofedSource: UDP frames from a1 with a forged source IP or MAC (nobody's, or a
// neighbour's) reach neither a2 on the same host nor b1 across the wire; the legitimate
// frame does.
func spoofedSource(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	const port = 7007
	forgedIP := netip.MustParseAddr("10.36.1.77") // in the subnet, owned by no endpoint
	forgedMAC := net.HardwareAddr{0x02, 0x02, 0xde, 0xad, 0xbe, 0xef}
	type shot struct {
		name  string
		smac  net.HardwareAddr
		sip   netip.Addr
		legit bool
	}
	shots := []shot{
		{"legit", a1.EP.MAC, a1.EP.IP, true},
		{"forged-ip", a1.EP.MAC, forgedIP, false},
		{"forged-ip-of-neighbour", a1.EP.MAC, a2.EP.IP, false},
		{"forged-mac", forgedMAC, a1.EP.IP, false},
		{"forged-mac-of-neighbour", a2.EP.MAC, a1.EP.IP, false},
	}
	for _, dst := range []*Container{a2, b1} {
		markers := make([][]byte, len(shots))
		for i, s := range shots {
			markers[i] = marker(s.name)
		}
		sites := []probeSite{{"dst", dst.NS, dst.EP.IfName}, {"wire", e.H1.NS, wireIf}}
		got := probe(t, sites, containing(markers), func() error {
			for i, s := range shots {
				f := UDPFrame(dst.EP.MAC, s.smac, s.sip, dst.EP.IP, 40000, port, markers[i])
				if err := SendRawFrame(a1.NS, a1.EP.IfName, f); err != nil {
					return err
				}
			}
			return nil
		})
		for i, s := range shots {
			at := got["dst"][i]
			switch {
			case s.legit && at == 0:
				t.Errorf("to %s: the legitimate frame was not delivered (the probe does not work)", dst.EP.ID)
			case !s.legit && at > 0:
				t.Errorf("to %s: %s frame delivered (%d copies)", dst.EP.ID, s.name, at)
			case !s.legit && dst == b1 && got["wire"][i] > 0:
				t.Errorf("to %s: %s frame left the host on the wire", dst.EP.ID, s.name)
			}
		}
	}
}

// spoofedARP: an ARP request whose sender is another endpoint's IP (or a forged MAC) is
// not answered; the same request with the container's own sender is.
func spoofedARP(t *testing.T, e *Env) {
	a1, a2, _ := adversaries(t, e)
	gw := e.Net.Gateway
	forgedMAC := net.HardwareAddr{0x02, 0x02, 0xde, 0xad, 0xbe, 0xee}
	cases := []struct {
		name  string
		smac  net.HardwareAddr // Ethernet and ARP sender MAC
		spa   netip.Addr
		legit bool
	}{
		{"legit", a1.EP.MAC, a1.EP.IP, true},
		{"forged-sender-ip", a1.EP.MAC, a2.EP.IP, false},
		{"forged-sender-mac", forgedMAC, a1.EP.IP, false},
	}
	for _, c := range cases {
		target := gw
		capt, err := StartCapture(a1.NS, a1.EP.IfName)
		if err != nil {
			t.Fatal(err)
		}
		req := ARPFrame(1, c.smac, c.spa, net.HardwareAddr{0, 0, 0, 0, 0, 0}, target)
		if err := SendRawFrame(a1.NS, a1.EP.IfName, req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		replies := 0
		for _, f := range capt.Frames() {
			if isARPReply(f, target, c.spa) {
				replies++
			}
		}
		if c.legit && replies == 0 {
			t.Errorf("%s: no ARP reply for %v (the probe does not work)", c.name, target)
		}
		if !c.legit && replies > 0 {
			t.Errorf("%s: ARP request with sender %v/%v answered", c.name, c.spa, c.smac)
		}
	}
}

func isARPReply(f []byte, spa, tpa netip.Addr) bool {
	isARP, s, d := arpAddrs(f)
	return isARP && len(f) >= 22 && binary.BigEndian.Uint16(f[20:22]) == 2 && s == spa && d == tpa
}

// vlanFromContainer: 802.1Q and 802.1ad tagged frames written by a container reach
// neither the other containers nor the wire (where VLAN 100 is a real network's tag).
func vlanFromContainer(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	type shot struct {
		name   string
		dstMAC net.HardwareAddr
		dstIP  netip.Addr
		tpid   uint16
		vid    uint16
	}
	var shots []shot
	for _, tpid := range []uint16{0, 0x8100, 0x88a8} {
		for _, d := range []*Container{a2, b1} {
			shots = append(shots, shot{fmt.Sprintf("%04x-to-%s", tpid, d.EP.ID), d.EP.MAC, d.EP.IP, tpid, 100})
		}
		shots = append(shots, shot{fmt.Sprintf("%04x-broadcast", tpid), Broadcast, netip.MustParseAddr("10.36.1.255"), tpid, 100})
	}
	shots = append(shots, shot{"8100-vid0-to-a2", a2.EP.MAC, a2.EP.IP, 0x8100, 0})
	markers := make([][]byte, len(shots))
	for i, s := range shots {
		markers[i] = marker(s.name)
	}
	sites := []probeSite{{"a2", a2.NS, a2.EP.IfName}, {"b1", b1.NS, b1.EP.IfName}, {"wire", e.H1.NS, wireIf}}
	got := probe(t, sites, containing(markers), func() error {
		for i, s := range shots {
			f := UDPFrame(s.dstMAC, a1.EP.MAC, a1.EP.IP, s.dstIP, 40001, 7008, markers[i])
			if s.tpid != 0 {
				f = TagFrame(f, s.tpid, s.vid)
			}
			if err := SendRawFrame(a1.NS, a1.EP.IfName, f); err != nil {
				return err
			}
		}
		return nil
	})
	for i, s := range shots {
		if s.tpid == 0 {
			if s.dstMAC.String() != Broadcast.String() && got["a2"][i]+got["b1"][i] == 0 {
				t.Errorf("%s: untagged control frame not delivered (the probe does not work)", s.name)
			}
			continue
		}
		for _, site := range sites {
			if n := got[site.name][i]; n > 0 {
				t.Errorf("%s: tagged frame seen %d times at %s", s.name, n, site.name)
			}
		}
	}
}

// udpSpread: 32 UDP flows (distinct source ports, same client) to one VIP:port reach
// both backends, and every reply comes from the VIP.
func udpSpread(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	const target = 5353
	vip := netip.MustParseAddr("10.36.1.201")
	var srvs []*UDPServer
	for _, be := range []*Container{a2, b1} {
		s, err := StartUDPEcho(be.NS, be.EP.IP.String(), target)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		srvs = append(srvs, s)
	}
	svc := dataplane.Service{ID: "dns:default", VIP: vip,
		Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: target}}, Backends: []netip.Addr{a2.EP.IP, b1.EP.IP}}
	withService(t, e, svc, func() { checkUDPSpread(t, a1, vip, srvs) })
}

// checkUDPSpread sends 32 UDP flows to vip:53 from a1 and wants replies from the VIP and
// both servers used.
func checkUDPSpread(t *testing.T, a1 *Container, vip netip.Addr, srvs []*UDPServer) {
	udpFlowsThroughVIP(t, a1, net.JoinHostPort(vip.String(), "53"), 32, time.Second, func(i int) []byte { return marker(fmt.Sprint(i)) })
	local, remote := srvs[0].Flows(), srvs[1].Flows()
	t.Logf("UDP flows per backend: local %d, remote %d", local, remote)
	if local == 0 || remote == 0 {
		t.Errorf("UDP flows per backend: local %d, remote %d; want both used", local, remote)
	}
}

// udpFlowsThroughVIP sends n UDP flows (a fresh socket each, payload(i)) from a1 to vipAddr
// and wants each echoed from the VIP; it returns how many got no echo.
func udpFlowsThroughVIP(t *testing.T, a1 *Container, vipAddr string, n int, wait time.Duration, payload func(int) []byte) int {
	t.Helper()
	failed := 0
	for i := 0; i < n; i++ {
		from, err := UDPExchange(a1.NS, vipAddr, payload(i), wait)
		switch {
		case err != nil:
			failed++
			t.Logf("flow %d: %v", i, err)
		case from != vipAddr:
			t.Errorf("flow %d: reply from %s, want the VIP %s", i, from, vipAddr)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d UDP flows through %s got no echo", failed, n, vipAddr)
	}
	return failed
}

// tenantPair is two tenants with overlapping subnets on host 1: clients at .1 in both,
// the service backend at .2 in t1 and .3 in t2.
type tenantPair struct {
	net1, net2     dataplane.Network
	x1, x2, y1, y2 *Container
	vip            netip.Addr
	svc1, svc2     dataplane.Service
}

// newTenantPair creates the containers of a tenantPair and describes its networks and
// services (crossTenantVIP programs them).
func newTenantPair(t *testing.T, e *Env) *tenantPair {
	p := &tenantPair{vip: netip.MustParseAddr("10.40.1.100")}
	mk := func(id string, tag uint32) dataplane.Network {
		return dataplane.Network{ID: id, Encap: dataplane.EncapVXLAN, Tag: tag,
			Subnet: netip.MustParsePrefix("10.40.1.0/24"), Gateway: netip.MustParseAddr("10.40.1.254"), MTU: 1450}
	}
	p.net1, p.net2 = mk("n1.t1", 7001), mk("n2.t2", 7002)
	p.x1 = e.AddContainerIn(t, p.net1, "x1", "10.40.1.1")
	p.x2 = e.AddContainerIn(t, p.net1, "x2", "10.40.1.2")
	p.y1 = e.AddContainerIn(t, p.net2, "y1", "10.40.1.1")
	p.y2 = e.AddContainerIn(t, p.net2, "y2", "10.40.1.3")
	port := []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 9000}}
	p.svc1 = dataplane.Service{ID: "web:t1", VIP: p.vip, Ports: port, Backends: []netip.Addr{p.x2.EP.IP}}
	p.svc2 = dataplane.Service{ID: "web:t2", VIP: p.vip, Ports: port, Backends: []netip.Addr{p.y2.EP.IP}}
	return p
}

// crossTenantVIP: two tenants with overlapping subnets on host 1. A VIP answers (ARP,
// ping, DNAT) only its own tenant, even when the other skips ARP; the other tenant may own the
// same VIP:port. The subtests are ordered steps of this one scenario, not scenarios of
// their own: other-tenant-no-dnat forges the VIP MAC that own-tenant-reaches-vip
// resolved, and the backends' accept counts add up over the steps.
func crossTenantVIP(t *testing.T, e *Env) {
	p := newTenantPair(t, e)
	c := ctx(t)
	h := e.H1
	h.State.Networks = append(h.State.Networks, p.net1, p.net2)
	h.State.Endpoints = append(h.State.Endpoints, p.x1.EP, p.x2.EP, p.y1.EP, p.y2.EP)
	h.State.Services = append(h.State.Services, p.svc1)
	h.Sync(t)
	srvX, err := StartTCPEchoPort(p.x2.NS, p.x2.EP.IP.String(), 9000)
	if err != nil {
		t.Fatal(err)
	}
	defer srvX.Close()
	vipAddr := net.JoinHostPort(p.vip.String(), "80")
	PingOK(t, p.y1.NS, p.y2.EP.IP.String(), 3) // t2 works on its own

	t.Run("own-tenant-reaches-vip", func(t *testing.T) { dialEcho(t, p.x1.NS, vipAddr) })
	t.Run("own-tenant-pings-vip", func(t *testing.T) {
		// The VIP answers its tenant's pings; a port without a service goes nowhere.
		PingOK(t, p.x1.NS, p.vip.String(), 3)
		if conn, err := DialTCPTimeout(p.x1.NS, net.JoinHostPort(p.vip.String(), "81"), time.Second); err == nil {
			conn.Close()
			t.Errorf("a connection to the VIP's port 81 (no service) was accepted")
		}
	})
	vipMAC, err := neighMAC(p.x1.NS, p.vip)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("other-tenant-no-arp", func(t *testing.T) {
		if err := flushNeigh(p.y1.NS); err != nil {
			t.Fatal(err)
		}
		PingFails(t, p.y1.NS, p.vip.String())
		if mac, err := neighMAC(p.y1.NS, p.vip); err == nil && mac != "" {
			t.Errorf("t2 container resolved t1's VIP %v to %s", p.vip, mac)
		}
	})
	t.Run("other-tenant-no-dnat", func(t *testing.T) {
		// The attacker skips ARP: a static neighbour entry with the MAC t1 sees.
		if err := setNeigh(p.y1.NS, p.vip, vipMAC); err != nil {
			t.Fatal(err)
		}
		PingFails(t, p.y1.NS, p.vip.String())
		if conn, err := DialTCPTimeout(p.y1.NS, vipAddr, time.Second); err == nil {
			conn.Close()
			t.Errorf("t2 container connected to t1's VIP")
		}
		if n := srvX.Accepted.Load(); n != 1 {
			t.Errorf("t1 backend accepted %d connections, want 1 (only t1's)", n)
		}
	})
	t.Run("same-vip-in-two-tenants", func(t *testing.T) {
		srvY, err := StartTCPEchoPort(p.y2.NS, p.y2.EP.IP.String(), 9000)
		if err != nil {
			t.Fatal(err)
		}
		defer srvY.Close()
		if err := h.Driver.UpsertService(c, p.svc2); err != nil {
			t.Fatalf("second tenant's service on the same VIP:port refused: %v", err)
		}
		if err := flushNeigh(p.y1.NS); err != nil {
			t.Fatal(err)
		}
		beforeX := srvX.Accepted.Load()
		for i := 0; i < 3; i++ {
			dialEcho(t, p.y1.NS, vipAddr)
			dialEcho(t, p.x1.NS, vipAddr)
		}
		if got := srvY.Accepted.Load(); got != 3 {
			t.Errorf("t2 backend accepted %d connections, want 3 (t2's)", got)
		}
		if got := srvX.Accepted.Load() - beforeX; got != 3 {
			t.Errorf("t1 backend accepted %d connections, want 3 (t1's)", got)
		}
	})
	if err := h.Driver.DeleteService(c, p.svc2.ID); err != nil {
		t.Error(err)
	}
	if err := h.Driver.DeleteService(c, p.svc1.ID); err != nil {
		t.Error(err)
	}
}

func dialEcho(t *testing.T, ns, addr string) {
	t.Helper()
	conn, err := DialTCP(ns, addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	if err := EchoRoundTrip(conn, 2048); err != nil {
		t.Errorf("%s: %v", addr, err)
	}
}

// bareACK: group 2 denies TCP setup except to 8080. A crafted bare ACK from group 1 to
// port 22 (a listener exists) must not be delivered nor open state: a real connect()
// from the very same source port then fails, and 8080 still works.
func bareACK(t *testing.T, e *Env) {
	a1, a2, _ := adversaries(t, e)
	c := ctx(t)
	pol := dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
	}}
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.UpsertPolicy(c, pol); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
	defer func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeletePolicy(c, pol.EPGID); err != nil {
				t.Errorf("%s: delete policy: %v", h.Name, err)
			}
		}
	}()
	for _, port := range []int{22, 8080} {
		srv, err := StartTCPEchoPort(a2.NS, a2.EP.IP.String(), port)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
	}
	var rnd [2]byte
	_, _ = rand.Read(rnd[:])
	sport := 41000 + binary.BigEndian.Uint16(rnd[:])%1000
	frame := func(flags uint8, seq uint32, payload []byte) []byte {
		seg := TCPSegment(a1.EP.IP, a2.EP.IP, sport, 22, seq, 2000, flags, payload)
		return EthFrame(a2.EP.MAC, a1.EP.MAC, 0x0800, IPv4Packet(a1.EP.IP, a2.EP.IP, 6, seg))
	}
	// A bare ACK, then an ACK carrying data, on the tuple connect() will use below.
	frames := [][]byte{frame(TCPAck, 1000, nil), frame(TCPAck|TCPPsh, 1000, marker("ack-data"))}
	got := probe(t, []probeSite{{"a2", a2.NS, a2.EP.IfName}}, []func([]byte) bool{tcpPorts(sport, 22)}, func() error {
		for _, f := range frames {
			if err := SendRawFrame(a1.NS, a1.EP.IfName, f); err != nil {
				return err
			}
		}
		return nil
	})
	if n := got["a2"][0]; n > 0 {
		t.Errorf("ACK without SYN to denied port 22 delivered (%d frames)", n)
	}
	if conn, err := dialFrom(a1.NS, a1.EP.IP, sport, net.JoinHostPort(a2.EP.IP.String(), "22"), 2*time.Second); err == nil {
		conn.Close()
		t.Errorf("connect to port 22 from port %d after a bare ACK succeeded", sport)
	}
	if conn, err := DialTCPTimeout(a1.NS, net.JoinHostPort(a2.EP.IP.String(), "22"), time.Second); err == nil {
		conn.Close()
		t.Error("connect to denied port 22 succeeded")
	}
	dialEcho(t, a1.NS, net.JoinHostPort(a2.EP.IP.String(), "8080"))
}

// dialFrom connects from a fixed local address and port (SO_REUSEADDR) inside the
// namespace at path.
func dialFrom(path string, ip netip.Addr, port uint16, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := nsexec.Run(path, func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: ip.AsSlice(), Port: int(port)}, Control: reuseAddr}
		var err error
		c, err = d.Dial("tcp4", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from port %d: %w", addr, port, err)
	}
	return c, nil
}

// setNeigh installs a permanent neighbour entry for ip on eth0 in the namespace.
func setNeigh(ns string, ip netip.Addr, mac string) error {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("neighbour mac %q: %w", mac, err)
	}
	h, err := netns.GetFromPath(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return err
	}
	defer nl.Close()
	l, err := nl.LinkByName("eth0")
	if err != nil {
		return err
	}
	return nl.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: hw})
}

// reuseAddr sets SO_REUSEADDR on a socket before it is bound.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

// overlayInjection: H2 (the underlay side, owner of VTEP 10.254.0.2) sends hand-made
// VXLAN packets to H1 in the test network's VNI. Only the one whose inner source is an
// endpoint behind 10.254.0.2 may be delivered; an inner source that lives on H1, that is
// no endpoint, or that lives behind another VTEP must not.
func overlayInjection(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	elsewhere := addFakeHostEndpoint(t, e, netip.MustParseAddr("10.36.1.90"), netip.MustParseAddr("10.254.0.9"))
	nobody := netip.MustParseAddr("10.36.1.77")
	injectOverlay(t, e, a2, []overlayShot{
		{"inner-src-local-endpoint", a1.EP.IP, 7009, false},
		{"inner-src-no-endpoint", nobody, 7009, false},
		{"inner-src-behind-other-vtep", elsewhere, 7009, false},
		{"inner-src-behind-sender", b1.EP.IP, 7009, true},
	})
}

// overlayPeerHostSource (Datapath v3 issue, hole 1): H2 sends hand-made VXLAN whose inner
// source is its own VTEP address (how a node port flow H2 balanced to H1 arrives, and what
// any process on H2 can send) to a2, whose group refuses UDP 7009 in. It must not be
// delivered. A datagram from b1 (behind H2) to a port the group allows proves the probe.
func overlayPeerHostSource(t *testing.T, e *Env) {
	_, a2, b1 := adversaries(t, e)
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-7009", Priority: 5, Ingress: true, Proto: 17, Port: 7009, Action: dataplane.ActionDeny}}})
	injectOverlay(t, e, a2, []overlayShot{
		{"inner-src-peer-host-denied-port", e.H2.Cfg.VTEP, 7009, false},
		{"inner-src-behind-sender-allowed-port", b1.EP.IP, 7010, true},
	})
}

// overlayShot is one hand-made VXLAN packet: a UDP datagram from inner source src to
// port, which must (legit) or must not reach its destination.
type overlayShot struct {
	name  string
	src   netip.Addr
	port  uint16
	legit bool
}

// injectOverlay sends each shot from H2's VTEP address to H1's VXLAN port in the test
// network's VNI, addressed to dst, and checks which ones dst received.
func injectOverlay(t *testing.T, e *Env, dst *Container, shots []overlayShot) {
	t.Helper()
	markers := make([][]byte, len(shots))
	for i, s := range shots {
		markers[i] = marker(s.name)
	}
	to := net.JoinHostPort(e.H1.Cfg.VTEP.String(), fmt.Sprint(vxlanPort))
	got := probe(t, []probeSite{{"dst", dst.NS, dst.EP.IfName}}, containing(markers), func() error {
		for i, s := range shots {
			inner := UDPFrame(dst.EP.MAC, dataplane.ContivMAC(s.src), s.src, dst.EP.IP, 40002, s.port, markers[i])
			if err := SendUDP(e.H2.NS, e.H2.Cfg.VTEP.String(), to, VXLANPayload(e.Net.Tag, inner)); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		return nil
	})
	for i, s := range shots {
		switch n := got["dst"][i]; {
		case s.legit && n == 0:
			t.Errorf("%s: not delivered (the probe does not work)", s.name)
		case !s.legit && n > 0:
			t.Errorf("%s: inner source %v delivered to port %d (%d copies)", s.name, s.src, s.port, n)
		}
	}
}

// addFakeHostEndpoint programs on H1 a remote endpoint at ip behind a third host's VTEP
// (which need not exist), and removes it when the test ends.
func addFakeHostEndpoint(t *testing.T, e *Env, ip, vtep netip.Addr) netip.Addr {
	c := ctx(t)
	peer := dataplane.Peer{Host: "h9", VTEP: vtep}
	rem := dataplane.RemoteEndpoint{ID: e.Net.ID + "-h9x", NetworkID: e.Net.ID, IP: ip,
		MAC: dataplane.ContivMAC(ip), EPGID: 2, VTEP: vtep, Host: peer.Host}
	if err := e.H1.Driver.UpsertPeer(c, peer); err != nil {
		t.Fatalf("peer %s: %v", peer.Host, err)
	}
	if err := e.H1.Driver.UpsertRemoteEndpoint(c, rem); err != nil {
		t.Fatalf("remote endpoint behind %v: %v", vtep, err)
	}
	t.Cleanup(func() {
		c := context.Background()
		if err := e.H1.Driver.DeleteRemoteEndpoint(c, rem.ID); err != nil {
			t.Errorf("delete remote endpoint %s: %v", rem.ID, err)
		}
		if err := e.H1.Driver.DeletePeer(c, peer.Host); err != nil {
			t.Errorf("delete peer %s: %v", peer.Host, err)
		}
	})
	return ip
}

// backendRemovalLiveUDP: one UDP flow (one source port) to a VIP with a backend per
// host; the backend it is on is removed from the service while the flow runs. Within
// 1 s the same flow must be answered by the remaining backend, and replies still come
// from the VIP.
func backendRemovalLiveUDP(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	const target, port = 5454, 54
	vip := netip.MustParseAddr("10.36.1.202")
	for _, be := range []*Container{a2, b1} {
		s, err := StartUDPIdent(be.NS, be.EP.IP.String(), target)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	svc := dataplane.Service{ID: "live:default", VIP: vip,
		Ports: []dataplane.ServicePort{{Proto: 17, Port: port, TargetPort: target}}, Backends: []netip.Addr{a2.EP.IP, b1.EP.IP}}
	upsertServiceAll(t, e, svc)
	defer deleteServiceAll(t, e, svc.ID)
	vipAddr := net.JoinHostPort(vip.String(), fmt.Sprint(port))
	flow, err := OpenUDPFlow(a1.NS, vipAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer flow.Close()
	first, err := flow.Run(time.Second, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	on, err := singleBackend(first, vipAddr)
	if err != nil {
		t.Fatalf("before the removal: %v", err)
	}
	keep := a2.EP.IP
	if on == a2.EP.IP.String() {
		keep = b1.EP.IP
	}
	type result struct {
		replies []UDPReply
		err     error
	}
	done := make(chan result, 1)
	go func() {
		r, err := flow.Run(2500*time.Millisecond, 50*time.Millisecond)
		done <- result{r, err}
	}()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	svc.Backends = []netip.Addr{keep}
	upsertServiceAll(t, e, svc)
	removed := time.Now()
	t.Logf("flow on %s (%d replies); removing it took %v", on, len(first), removed.Sub(start))
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, err := range switchErrors(r.replies, vipAddr, on, keep.String(), removed) {
		t.Error(err)
	}
}

// singleBackend checks that every reply came from the VIP and named one backend, and
// returns that backend.
func singleBackend(replies []UDPReply, vipAddr string) (string, error) {
	if len(replies) < 5 {
		return "", fmt.Errorf("only %d replies in a second", len(replies))
	}
	on := replies[0].Body
	for _, r := range replies {
		switch {
		case r.From != vipAddr:
			return "", fmt.Errorf("reply from %s, want the VIP %s", r.From, vipAddr)
		case r.Body != on:
			return "", fmt.Errorf("one flow answered by %s and %s", on, r.Body)
		}
	}
	return on, nil
}

// switchErrors checks replies of a flow whose backend old was removed at removed: the
// remaining backend answers within a second, old never again after that, every reply
// comes from the VIP.
func switchErrors(replies []UDPReply, vipAddr, old, keep string, removed time.Time) []error {
	var errs []error
	var firstNew time.Time
	notVIP, oldAfterMove, oldLate, newLate := 0, 0, 0, 0
	for _, r := range replies {
		if r.From != vipAddr {
			notVIP++
		}
		late := r.At.After(removed.Add(time.Second))
		switch {
		case r.Body == keep && firstNew.IsZero():
			firstNew = r.At
		case r.Body == old && !firstNew.IsZero():
			oldAfterMove++
		case r.Body == old && late:
			oldLate++
		}
		if r.Body == keep && late {
			newLate++
		}
	}
	if notVIP > 0 {
		errs = append(errs, fmt.Errorf("%d of %d replies not from the VIP %s", notVIP, len(replies), vipAddr))
	}
	if oldAfterMove > 0 {
		errs = append(errs, fmt.Errorf("removed backend %s answered %d times after the flow had moved", old, oldAfterMove))
	}
	if oldLate > 0 {
		errs = append(errs, fmt.Errorf("removed backend %s answered %d times later than 1 s after the removal", old, oldLate))
	}
	switch {
	case firstNew.IsZero():
		errs = append(errs, fmt.Errorf("the flow never reached the remaining backend %s (%d replies)", keep, len(replies)))
	case firstNew.Sub(removed) > time.Second:
		errs = append(errs, fmt.Errorf("the flow reached %s only %v after the removal", keep, firstNew.Sub(removed)))
	case newLate < 5:
		errs = append(errs, fmt.Errorf("only %d replies from %s later than 1 s after the removal", newLate, keep))
	}
	return errs
}

func upsertServiceAll(t *testing.T, e *Env, svc dataplane.Service) {
	t.Helper()
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.UpsertService(ctx(t), svc); err != nil {
			t.Fatalf("%s: upsert service %s: %v", h.Name, svc.ID, err)
		}
	}
}

func deleteServiceAll(t *testing.T, e *Env, id string) {
	t.Helper()
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.DeleteService(ctx(t), id); err != nil {
			t.Errorf("%s: delete service %s: %v", h.Name, id, err)
		}
	}
}

func upsertPolicyAll(t *testing.T, e *Env, p dataplane.PolicySet) {
	t.Helper()
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.UpsertPolicy(ctx(t), p); err != nil {
			t.Fatalf("%s: upsert policy %d: %v", h.Name, p.EPGID, err)
		}
	}
}

// rstPolicyChangeSYN: group 2 allows tcp 8080 from group 1. A connection opens and the
// client resets it; the policy then denies 8080, and a SYN from the very same source
// port must not get through on the old flow's state. Restored, the port works again.
func rstPolicyChangeSYN(t *testing.T, e *Env) {
	a1, _, b1 := adversaries(t, e)
	const port = 8080
	rules := func(action dataplane.PolicyAction) dataplane.PolicySet {
		return dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
			{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
			{ID: "8080-from-1", Priority: 5, Ingress: true, RemoteEPG: 1, Proto: 6, Port: port, Action: action},
		}}
	}
	upsertPolicyAll(t, e, rules(dataplane.ActionAllow))
	defer func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeletePolicy(ctx(t), 2); err != nil {
				t.Errorf("%s: delete policy: %v", h.Name, err)
			}
		}
	}()
	srv, err := StartTCPEchoPort(b1.NS, b1.EP.IP.String(), port)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var rnd [2]byte
	_, _ = rand.Read(rnd[:])
	sport := 42000 + binary.BigEndian.Uint16(rnd[:])%1000
	addr := net.JoinHostPort(b1.EP.IP.String(), fmt.Sprint(port))
	if err := openAndReset(a1, sport, addr); err != nil {
		t.Fatalf("allowed connection: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the RST reaches both hosts
	upsertPolicyAll(t, e, rules(dataplane.ActionDeny))
	accepted := srv.Accepted.Load()
	if conn, err := dialFrom(a1.NS, a1.EP.IP, sport, addr, 2*time.Second); err == nil {
		conn.Close()
		t.Errorf("connect from port %d after reset and deny succeeded", sport)
	}
	if n := srv.Accepted.Load() - accepted; n > 0 {
		t.Errorf("server accepted %d connections while 8080 was denied", n)
	}
	upsertPolicyAll(t, e, rules(dataplane.ActionAllow))
	conn, err := dialFrom(a1.NS, a1.EP.IP, sport, addr, 3*time.Second)
	if err != nil {
		t.Fatalf("after the policy was restored: %v", err)
	}
	defer conn.Close()
	if err := EchoRoundTrip(conn, 2048); err != nil {
		t.Errorf("after the policy was restored: %v", err)
	}
}

// openAndReset connects from c's address and sport to addr, exchanges data and closes
// with SO_LINGER 0 (an RST instead of a FIN).
func openAndReset(c *Container, sport uint16, addr string) error {
	conn, err := dialFrom(c.NS, c.EP.IP, sport, addr, 3*time.Second)
	if err != nil {
		return err
	}
	if err := EchoRoundTrip(conn, 2048); err != nil {
		conn.Close()
		return err
	}
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		conn.Close()
		return fmt.Errorf("connection to %s is a %T", addr, conn)
	}
	if err := tc.SetLinger(0); err != nil {
		conn.Close()
		return fmt.Errorf("linger 0: %w", err)
	}
	return conn.Close()
}
