package conformance

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// withService installs svc on both hosts for the duration of fn.
func withService(t *testing.T, e *Env, svc dataplane.Service, fn func()) {
	t.Helper()
	c := ctx(t)
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.UpsertService(c, svc); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
	defer func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeleteService(c, svc.ID); err != nil {
				t.Errorf("%s: delete service: %v", h.Name, err)
			}
		}
	}()
	fn()
}

// portUnreachableThroughVIP: the backend has no listener on the target port; the client's
// connected UDP socket to the VIP gets ECONNREFUSED (the port unreachable is related to
// the flow and carries the VIP again).
func portUnreachableThroughVIP(t *testing.T, e *Env) {
	a1, _, b1 := adversaries(t, e)
	vip := netip.MustParseAddr("10.36.1.204")
	svc := dataplane.Service{ID: "closed:default", VIP: vip, Backends: []netip.Addr{b1.EP.IP},
		Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: 5397}}}
	withService(t, e, svc, func() {
		if err := RefusedUDP(a1.NS, "10.36.1.204:53"); err != nil {
			t.Error(err)
		}
	})
}

// clientErrorThroughVIP: a client that closed its socket answers the service's reply
// with a port unreachable sent to the VIP; the backend on the other host, its socket
// connected to the client, gets it as an error about its own answer (ECONNREFUSED): the
// error was translated to the backend (destination and quote) and passed as related.
func clientErrorThroughVIP(t *testing.T, e *Env) {
	a1, _, b1 := adversaries(t, e)
	vip := netip.MustParseAddr("10.36.1.206")
	svc := dataplane.Service{ID: "answer:default", VIP: vip, Backends: []netip.Addr{b1.EP.IP},
		Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: 5396}}}
	client := netip.AddrPortFrom(a1.EP.IP, 40996)
	withService(t, e, svc, func() {
		p := ReplyProbe{ClientNS: a1.NS, BackendNS: b1.NS, Client: client, Backend: netip.AddrPortFrom(b1.EP.IP, 5396),
			Peer: client, VIP: netip.AddrPortFrom(vip, 53)}
		if err := p.Refused(); err != nil {
			t.Error(err)
		}
	})
}

// RefusedUDP expects a connected UDP socket in the namespace at path to see ECONNREFUSED
// from addr within three tries.
func RefusedUDP(path, addr string) error { return refusedUDPWithin(path, addr, 3) }

// refusedUDPWithin expects a connected UDP socket in the namespace at path to see
// ECONNREFUSED on a recv after one of its first tries sends to addr (a second each).
func refusedUDPWithin(path, addr string, tries int) error {
	return nsexec.Run(path, func() error {
		c, err := net.DialTimeout("udp4", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for try := 0; try < tries; try++ {
			if _, err := c.Write([]byte("ping")); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); errors.Is(err, syscall.ECONNREFUSED) {
				return nil
			}
		}
		return fmt.Errorf("udp %s: no ECONNREFUSED in %d tries (port unreachable lost or not matched to the socket)", addr, tries)
	})
}

// hairpin: a client balanced to itself through its own service reaches its listener (TCP
// and UDP) and sees the VIP as its peer both ways; its group's policy (no new TCP in) does
// not judge this traffic. A datagram larger than the MTU goes and comes back whole (its
// fragments follow the first ones both ways), and ICMP errors go back to the client from
// the VIP: port unreachable for a port nobody listens on, and the error its kernel sends
// about an answer that came after it closed its socket.
func hairpin(t *testing.T, e *Env) {
	a1, _, _ := adversaries(t, e)
	vip := netip.MustParseAddr("10.36.1.205")
	svc := dataplane.Service{ID: "self:default", VIP: vip, Backends: []netip.Addr{a1.EP.IP},
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8398}, {Proto: 17, Port: 53, TargetPort: 5398},
			{Proto: 17, Port: 54, TargetPort: 5399}, {Proto: 17, Port: 55, TargetPort: 5400}}}
	srv, err := StartTCPEchoPort(a1.NS, a1.EP.IP.String(), 8398)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	usrv, err := StartUDPEcho(a1.NS, a1.EP.IP.String(), 5398)
	if err != nil {
		t.Fatal(err)
	}
	defer usrv.Close()
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: a1.EP.EPGID, Rules: []dataplane.PolicyRule{
		{ID: "no-tcp-in", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny}}})
	defer func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeletePolicy(ctx(t), a1.EP.EPGID); err != nil {
				t.Errorf("%s: delete policy: %v", h.Name, err)
			}
		}
	}()
	withService(t, e, svc, func() {
		for i := 0; i < 3; i++ {
			c, err := DialTCPTimeout(a1.NS, "10.36.1.205:80", 3*time.Second)
			if err != nil {
				t.Fatalf("connection %d to its own service: %v", i, err)
			}
			if err := EchoRoundTrip(c, 64<<10); err != nil {
				t.Errorf("connection %d: %v", i, err)
			}
			if got := c.RemoteAddr().String(); got != "10.36.1.205:80" {
				t.Errorf("client sees peer %s, want the VIP", got)
			}
			c.Close()
		}
		from, err := UDPExchange(a1.NS, "10.36.1.205:53", []byte("hello"), 2*time.Second)
		if err != nil {
			t.Fatalf("UDP to its own service: %v", err)
		}
		if from != "10.36.1.205:53" {
			t.Errorf("UDP reply from %s, want the VIP", from)
		}
		if err := RefusedUDP(a1.NS, "10.36.1.205:54"); err != nil {
			t.Error(err)
		}
		client := netip.AddrPortFrom(a1.EP.IP, 40995)
		p := ReplyProbe{ClientNS: a1.NS, BackendNS: a1.NS, Client: client, Backend: netip.AddrPortFrom(a1.EP.IP, 5400),
			Peer: netip.AddrPortFrom(vip, client.Port()), VIP: netip.AddrPortFrom(vip, 55)}
		if err := p.Refused(); err != nil {
			t.Error(err)
		}
		t.Run("large-udp", func(t *testing.T) {
			from, err := UDPExchange(a1.NS, "10.36.1.205:53", bytes.Repeat([]byte("hairpin-fragments-"), 250), 2*time.Second)
			if err != nil {
				t.Fatalf("4,500-byte datagram to its own service: %v", err)
			}
			if from != "10.36.1.205:53" {
				t.Errorf("large UDP reply from %s, want the VIP", from)
			}
		})
	})
}

// rejectNoBackend: a service without backends refuses new flows at once (kube-proxy's
// REJECT): a TCP connect to it fails with ECONNREFUSED well before the first SYN
// retransmission (1 s), and a connected UDP socket's first recv after a send fails with
// ECONNREFUSED (eBPF: bpf/lib/icmp.h; OVS: the agent, reject.go).
func rejectNoBackend(t *testing.T, e *Env) {
	a1, _, _ := adversaries(t, e)
	vip := netip.MustParseAddr("10.36.1.206")
	svc := dataplane.Service{ID: "empty:default", VIP: vip,
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}, {Proto: 17, Port: 53, TargetPort: 5353}}}
	withService(t, e, svc, func() {
		start := time.Now()
		c, err := DialTCPTimeout(a1.NS, "10.36.1.206:80", 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatal("connected to a service without backends")
		}
		if took := time.Since(start); !errors.Is(err, syscall.ECONNREFUSED) || took > 900*time.Millisecond {
			t.Errorf("tcp connect: %v after %v, want ECONNREFUSED at once", err, took)
		}
		if err := refusedUDPWithin(a1.NS, "10.36.1.206:53", 1); err != nil { // the first recv
			t.Error(err)
		}
	})
}

// answerFlood: a container floods VIPs with what the datapath answers (UDP to a service
// without backends, refused with ICMP; echo requests to a VIP, answered from it), up to
// 20,000 of each a second; meanwhile another container is still refused and answered at once,
// every time: the budgets that bound such answers are not one container's to spend for
// everyone (OVS: a meter per port before the shared ones).
func answerFlood(t *testing.T, e *Env) {
	a1, a2, _ := adversaries(t, e)
	vip := netip.MustParseAddr("10.36.1.211")
	svc := dataplane.Service{ID: "flooded:default", VIP: vip, Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: 5353}}}
	withService(t, e, svc, func() {
		var udp net.PacketConn
		var icmp net.PacketConn
		if err := nsexec.Run(a1.NS, func() error {
			var err error
			if udp, err = net.ListenPacket("udp4", ":0"); err != nil {
				return err
			}
			icmp, err = net.ListenPacket("ip4:icmp", a1.ip())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer udp.Close()
		defer icmp.Close()
		echo := []byte{8, 0, 0, 0, 0xcb, 0x0f, 0, 1, 'f', 'l', 'o', 'o', 'd'}
		binary.BigEndian.PutUint16(echo[2:], checksum(echo, 0))
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			dst := &net.UDPAddr{IP: vip.AsSlice(), Port: 53}
			ipDst := &net.IPAddr{IP: vip.AsSlice()}
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				for i := 0; i < 200; i++ {
					_, _ = udp.WriteTo([]byte("flood"), dst)
					_, _ = icmp.WriteTo(echo, ipDst)
				}
			}
		}()
		defer func() { close(stop); <-done }()
		time.Sleep(500 * time.Millisecond) // any shared budget is spent by now
		for i := 0; i < 5; i++ {
			if err := refusedUDPWithin(a2.NS, net.JoinHostPort(vip.String(), "53"), 1); err != nil {
				t.Errorf("probe %d while a1 floods: %v", i, err)
			}
			if err := Ping(a2.NS, vip.String(), time.Second); err != nil {
				t.Errorf("probe %d while a1 floods: %v", i, err)
			}
		}
	})
}

// largeUDP: datagrams larger than the MTU (4,500 bytes: four fragments on a 1,450-byte
// network) between groups with policy, directly and through a VIP balanced over a local
// and a remote backend. Group 2 takes only UDP 5353 from group 1: the later fragments,
// which carry no ports, follow their first fragment's verdict and translation both ways,
// and a datagram to a denied port arrives in no part (a lone later fragment is never
// judged on its own).
func largeUDP(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	const target, denied = 5353, 5354
	var srvs, deniedSrvs []*UDPServer
	for _, be := range []*Container{a2, b1} {
		for port, list := range map[int]*[]*UDPServer{target: &srvs, denied: &deniedSrvs} {
			s, err := StartUDPEcho(be.NS, be.EP.IP.String(), port)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			*list = append(*list, s)
		}
	}
	defer onlyUDPPortFrom1(t, e, target)()
	big := func(label string) []byte { return append(marker(label), bytes.Repeat([]byte("large-udp-"), 450)...) }
	for _, be := range []*Container{a2, b1} {
		addr := net.JoinHostPort(be.EP.IP.String(), fmt.Sprint(target))
		from, err := UDPExchange(a1.NS, addr, big("direct"), 2*time.Second)
		if err != nil {
			t.Errorf("4,500-byte datagram to %s: %v", addr, err)
		} else if from != addr {
			t.Errorf("reply from %s, want %s", from, addr)
		}
		if _, err := UDPExchange(a1.NS, net.JoinHostPort(be.EP.IP.String(), fmt.Sprint(denied)), big("denied"), 300*time.Millisecond); err == nil {
			t.Errorf("a 4,500-byte datagram to %s:%d (denied) got an echo", be.EP.IP, denied)
		}
	}
	for i, s := range deniedSrvs {
		if n := s.Flows(); n != 0 {
			t.Errorf("denied server %d received datagrams from %d clients", i, n)
		}
	}
	vip := netip.MustParseAddr("10.36.1.207")
	svc := dataplane.Service{ID: "large:default", VIP: vip, Backends: []netip.Addr{a2.EP.IP, b1.EP.IP},
		Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: target}}}
	withService(t, e, svc, func() {
		failed := udpFlowsThroughVIP(t, a1, net.JoinHostPort(vip.String(), "53"), 16, 2*time.Second, func(i int) []byte { return big(fmt.Sprint(i)) })
		// Flows() counts distinct clients: the direct datagrams above were one each. OVS
		// balances a new flow whose datagram is fragmented by the addresses alone (its
		// later fragments carry no ports for multipath; docs/ovs.md): one client's such
		// flows share a backend there.
		local, remote := srvs[0].Flows()-1, srvs[1].Flows()-1
		t.Logf("large UDP flows per backend through the VIP: local %d, remote %d", local, remote)
		if local+remote != 16-failed {
			t.Errorf("backends saw %d large UDP flows, want %d", local+remote, 16-failed)
		}
		if e.H1.Driver.Name() != "ovs" && (local == 0 || remote == 0) {
			t.Errorf("large UDP flows per backend through the VIP: local %d, remote %d; want both used", local, remote)
		}
	})
}

// deniedServiceNoState: policy denies the client's traffic to a service's backend, so its
// SYNs and datagrams to the VIP are dropped, and they leave no conntrack state on the
// client's host (a flood of them cannot fill the table or a tenant's share of it): the
// service translation is committed only after policy passed the packet, on both backends.
func deniedServiceNoState(t *testing.T, e *Env) {
	a1, a2, _ := adversaries(t, e)
	vip := netip.MustParseAddr("10.36.1.208")
	srv, err := StartTCPEchoPort(a2.NS, a2.EP.IP.String(), 8399)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "no-tcp-in", Priority: 1, Ingress: true, Proto: 6, Action: dataplane.ActionDeny},
		{ID: "no-udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionDeny}}})
	defer func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeletePolicy(ctx(t), 2); err != nil {
				t.Errorf("%s: delete policy: %v", h.Name, err)
			}
		}
	}()
	svc := dataplane.Service{ID: "denied:default", VIP: vip, Backends: []netip.Addr{a2.EP.IP},
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8399}, {Proto: 17, Port: 53, TargetPort: 5399}}}
	withService(t, e, svc, func() {
		for i := 0; i < 4; i++ {
			if c, err := DialTCPTimeout(a1.NS, "10.36.1.208:80", 300*time.Millisecond); err == nil {
				c.Close()
				t.Fatal("connected through the VIP to a backend whose policy denies it")
			}
			if _, err := UDPExchange(a1.NS, "10.36.1.208:53", []byte("denied"), 100*time.Millisecond); err == nil {
				t.Fatal("a UDP datagram through the VIP got an answer from a backend whose policy denies it")
			}
		}
		for _, row := range conntrackRows(t, e.H1) {
			if strings.Contains(row, vip.String()) {
				t.Errorf("denied traffic to the VIP left conntrack state: %v", row)
			}
		}
	})
}

// selfNoState: a container whose policy denies its UDP sends datagrams to itself (raw
// frames, source = destination = its own address, no service involved). Whatever the
// datapath does with them, they leave no conntrack state: a container must not be able
// to fill its tenant's share of the table past its policy (the hairpin exemption from
// policy is for a client balanced to itself through a service only).
func selfNoState(t *testing.T, e *Env) {
	a1, _, _ := adversaries(t, e)
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: 1, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-out", Priority: 1, Ingress: false, Proto: 17, Action: dataplane.ActionDeny}}})
	defer func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeletePolicy(ctx(t), 1); err != nil {
				t.Errorf("%s: delete policy: %v", h.Name, err)
			}
		}
	}()
	for _, dmac := range []net.HardwareAddr{a1.EP.MAC, dataplane.RouterMAC} {
		for i := 0; i < 8; i++ {
			f := UDPFrame(dmac, a1.EP.MAC, a1.EP.IP, a1.EP.IP, uint16(41000+i), 7000, marker("self"))
			if err := SendRawFrame(a1.NS, a1.EP.IfName, f); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, s := range conntrackRows(t, e.H1) {
		if strings.Contains(s, ":7000") && strings.Contains(s, a1.EP.IP.String()) {
			t.Errorf("datagrams a1's policy denies, sent to itself, left conntrack state: %v", s)
		}
	}
}

// sharedVIPLargeUDP: two services of one tenant share a VIP on different UDP ports (a
// VIP:port, not a VIP, belongs to one service), both to a2 on the client's host: on 5353
// and on 5354. Group 2 takes UDP only on 5353 from group 1. A client's datagrams larger
// than the MTU to the allowed service's port arrive whole at its backend and nowhere
// else: the later fragments, which carry no port, must not be
// balanced and translated by the other service (whose backend port policy denies), in
// either order of the two services' names.
func sharedVIPLargeUDP(t *testing.T, e *Env) {
	a1, a2, _ := adversaries(t, e)
	const allowed, denied = 5353, 5354
	ok, err := StartUDPEcho(a2.NS, a2.EP.IP.String(), allowed)
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	bad, err := StartUDPEcho(a2.NS, a2.EP.IP.String(), denied)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	defer onlyUDPPortFrom1(t, e, allowed)()
	vip := netip.MustParseAddr("10.36.1.209")
	big := func(label string) []byte { return append(marker(label), bytes.Repeat([]byte("shared-vip-"), 400)...) }
	for _, names := range [][2]string{{"sv-a", "sv-b"}, {"sv-d", "sv-c"}} {
		good := dataplane.Service{ID: names[0] + ":default", VIP: vip, Backends: []netip.Addr{a2.EP.IP},
			Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: allowed}}}
		other := dataplane.Service{ID: names[1] + ":default", VIP: vip, Backends: []netip.Addr{a2.EP.IP},
			Ports: []dataplane.ServicePort{{Proto: 17, Port: 54, TargetPort: denied}}}
		withService(t, e, good, func() {
			withService(t, e, other, func() {
				for i := 0; i < 4; i++ {
					_, err := UDPExchange(a1.NS, net.JoinHostPort(vip.String(), "53"), big(fmt.Sprint(names[0], i)), 2*time.Second)
					if err != nil {
						t.Errorf("services %v: large datagram %d to the allowed service: %v", names, i, err)
					}
				}
			})
		})
		if n := bad.Flows(); n != 0 {
			t.Errorf("services %v: the backend whose policy denies the client received datagrams sent to the other service (%d clients)", names, n)
		}
	}
}

// fragmentHoard: a container sends 5,200 lone last fragments (distinct IP ids, no first
// fragment ever) to a neighbour, paced: more than any datapath here holds for reassembly
// in all (OVS: 5,000 for the whole vswitchd), so whatever it holds must not be a budget
// one container can spend for everyone. Another container's datagram larger than the
// MTU, through a VIP, still passes at once. (The neighbour is a sink of its own: what
// reaches it fills its kernel's reassembly memory, which is its own, not the datapath's.)
func fragmentHoard(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	sink := e.AddContainer(t, "a3", "10.36.1.4")
	sink.EP.EPGID = 2
	if err := e.H1.Driver.UpsertEndpoint(ctx(t), sink.EP); err != nil {
		t.Fatal(err)
	}
	srv, err := StartUDPEcho(b1.NS, b1.EP.IP.String(), 5360)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	vip := netip.MustParseAddr("10.36.1.210")
	svc := dataplane.Service{ID: "hoard:default", VIP: vip, Backends: []netip.Addr{b1.EP.IP},
		Ports: []dataplane.ServicePort{{Proto: 17, Port: 53, TargetPort: 5360}}}
	withService(t, e, svc, func() {
		addr := net.JoinHostPort(vip.String(), "53")
		big := bytes.Repeat([]byte("hoard-"), 700)
		if _, err := UDPExchange(a2.NS, addr, big, 2*time.Second); err != nil {
			t.Fatalf("a large datagram through the VIP before the hoard: %v (the probe does not work)", err)
		}
		var frames [][]byte
		for i := 0; i < 5200; i++ {
			frames = append(frames, LoneLastFragment(a1.EP.MAC, sink.EP.MAC, a1.EP.IP, sink.EP.IP, uint16(i+1)))
		}
		for i := 0; i < len(frames); i += 50 { // paced: a burst overflows the port's queue
			if err := SendRawFrames(a1.NS, a1.EP.IfName, frames[i:i+50]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := UDPExchange(a2.NS, addr, big, 2*time.Second); err != nil {
			t.Errorf("a2's large datagram through the VIP after a1 sent 5,200 lone fragments: %v", err)
		}
	})
}

// onlyUDPPortFrom1 gives group 2 on both hosts the rules "no UDP in, but port from group 1"
// and returns what removes them.
func onlyUDPPortFrom1(t *testing.T, e *Env, port uint16) func() {
	t.Helper()
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "no-udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionDeny},
		{ID: "udp-from-1", Priority: 10, Ingress: true, RemoteEPG: 1, Proto: 17, Port: port, Action: dataplane.ActionAllow}}})
	return func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if err := h.Driver.DeletePolicy(ctx(t), 2); err != nil {
				t.Errorf("%s: delete policy: %v", h.Name, err)
			}
		}
	}
}

// conntrackRows is host h's conntrack listing (netctl bpf ct), a row per entry, its cells
// joined by spaces.
func conntrackRows(t *testing.T, h *Host) []string {
	t.Helper()
	lister, ok := h.Driver.(dataplane.Lister)
	if !ok {
		t.Fatalf("%s driver lists no conntrack table", h.Driver.Name())
	}
	l, err := lister.Listing(dataplane.ListQuery{Kind: "ct", Limit: 100000})
	if err != nil {
		t.Fatalf("%s: list conntrack: %v", h.Name, err)
	}
	rows := make([]string, len(l.Rows))
	for i, r := range l.Rows {
		rows[i] = strings.Join(r, " ")
	}
	return rows
}
