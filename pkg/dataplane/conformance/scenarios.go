package conformance

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Run drives a Driver through every backend-neutral scenario. Each is a subtest that
// builds what it needs (runScenarios), so any one runs alone
// (go test -run 'TestConformance/arp$') and a failure in one does not carry over.
func Run(t *testing.T, factory Factory) {
	runScenarios(t, func(t *testing.T, tweak func(*dataplane.HostConfig)) *Env {
		return newEnvWith(t, factory, dataplane.FwdBridge, tweak)
	}, []scenario{
		{name: "container-config", run: containerConfig},
		{name: "same-host", run: sameHost},
		{name: "cross-host", run: crossHost},
		{name: "arp", run: arp},
		{name: "vlan", run: vlan},
		{name: "idempotent", run: idempotent},
		{name: "bad-input", run: badInput},
		{name: "endpoint-delete", run: endpointDelete},
		{name: "remote-handover", run: remoteHandover},
		{name: "peer-remove", run: peerRemove},
		{name: "policy", run: policy},
		{name: "networkpolicy", run: networkpolicy},
		{name: "service", run: service},
		{name: "service-affinity-drain", run: serviceAffinityDrain},
		{name: "restart", ownHosts: true, run: restart},
		{name: "sync-sweeps", run: syncSweeps},
		{name: "sync-bad-remote", run: syncBadRemote},
		{name: "netprofile", run: netprofile},
	})
}

// containerConfig: the container end has the network's MTU, the endpoint's MAC and
// address; the hosts do not forward in their own stack.
func containerConfig(t *testing.T, e *Env) {
	a1, _, _ := e.threeContainers(t, 1, 1, 2)
	err := nsexec.Run(a1.NS, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		if ifi.MTU != e.Net.MTU {
			return fmt.Errorf("mtu %d, want %d", ifi.MTU, e.Net.MTU)
		}
		if ifi.HardwareAddr.String() != a1.EP.MAC.String() {
			return fmt.Errorf("mac %v, want %v", ifi.HardwareAddr, a1.EP.MAC)
		}
		addrs, _ := ifi.Addrs()
		if len(addrs) == 0 || addrs[0].String() != "10.36.1.1/24" {
			return fmt.Errorf("addresses %v, want 10.36.1.1/24", addrs)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// The dataplane forwards, not the host stack.
	for _, h := range []*Host{e.H1, e.H2} {
		err := nsexec.Run(h.NS, func() error {
			b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(b)) != "0" {
				return fmt.Errorf("%s: net.ipv4.ip_forward = %s, want 0", h.Name, strings.TrimSpace(string(b)))
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
}

// sameHost: ping and a TCP transfer between two containers of one host.
func sameHost(t *testing.T, e *Env) {
	a1, a2, _ := e.threeContainers(t, 1, 1, 2)
	PingOK(t, a1.NS, a2.ip(), 3)
	if err := TCPCheck(a2.NS, a2.ip(), a1.NS, transfer); err != nil {
		t.Error(err)
	}
}

// crossHost: ping and TCP both ways between containers of the two hosts (VXLAN).
func crossHost(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	PingOK(t, a1.NS, b1.ip(), 3)
	PingOK(t, b1.NS, a2.ip(), 3)
	if err := TCPCheck(b1.NS, b1.ip(), a1.NS, transfer); err != nil {
		t.Error("a1→b1:", err)
	}
	if err := TCPCheck(a2.NS, a2.ip(), b1.NS, transfer); err != nil {
		t.Error("b1→a2:", err)
	}
}

// arp: containers resolve each other with no ARP on the underlay, plain or encapsulated.
func arp(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	for _, c := range []*Container{a1, b1} {
		if err := flushNeigh(c.NS); err != nil {
			t.Fatal(err)
		}
	}
	capt, err := StartCapture(e.H1.NS, wireIf)
	if err != nil {
		t.Fatal(err)
	}
	PingOK(t, a1.NS, b1.ip(), 3)
	PingOK(t, a1.NS, a2.ip(), 3)
	PingOK(t, b1.NS, a1.ip(), 3)
	if err := TCPCheck(b1.NS, b1.ip(), a1.NS, 4096); err != nil {
		t.Error(err)
	}
	st := capt.Stop(e.Net.Subnet, vxlanPort)
	t.Logf("wire: %+v", st)
	if st.VXLAN == 0 {
		t.Error("capture saw no VXLAN frames: the capture is not working")
	}
	if st.ARPForSubnet != 0 || st.ARPInOverlay != 0 {
		t.Errorf("container ARP on the underlay: %d plain, %d encapsulated", st.ARPForSubnet, st.ARPInOverlay)
	}
	for _, want := range []*Container{b1, a2} {
		mac, err := neighMAC(a1.NS, want.EP.IP)
		if err != nil {
			t.Error(err)
		} else if mac != want.EP.MAC.String() {
			t.Errorf("a1 resolved %v to %s, want %v", want.EP.IP, mac, want.EP.MAC)
		}
	}
}

// vlan: a VLAN network forwards across the wire tagged with its tag, without container
// ARP on the wire, and is isolated from the VXLAN network.
func vlan(t *testing.T, e *Env) {
	a1, _, _ := e.threeContainers(t, 1, 1, 2)
	c1, c2 := e.vlanPair(t)
	capt, err := StartCapture(e.H1.NS, wireIf)
	if err != nil {
		t.Fatal(err)
	}
	PingOK(t, c1.NS, c2.ip(), 3)
	if err := TCPCheck(c2.NS, c2.ip(), c1.NS, transfer); err != nil {
		t.Error("c1→c2:", err)
	}
	if err := TCPCheck(c1.NS, c1.ip(), c2.NS, transfer); err != nil {
		t.Error("c2→c1:", err)
	}
	PingFails(t, c1.NS, a1.ip()) // networks are isolated
	st := capt.Stop(e.VLANNet.Subnet, vxlanPort)
	t.Logf("wire: frames %d, vlan %v, arp for subnet %d", st.Frames, st.VLAN, st.ARPForSubnet)
	if st.VLAN[int(e.VLANNet.Tag)] == 0 {
		t.Errorf("no frames tagged %d on the wire", e.VLANNet.Tag)
	}
	if st.ARPForSubnet != 0 {
		t.Errorf("%d container ARP frames on the wire", st.ARPForSubnet)
	}
}

// idempotent: every upsert may be repeated.
func idempotent(t *testing.T, e *Env) {
	a1, _, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	for i := 0; i < 2; i++ {
		if err := e.H1.Driver.UpsertNetwork(c, e.Net); err != nil {
			t.Fatal(err)
		}
		if err := e.H1.Driver.UpsertEndpoint(c, a1.EP); err != nil {
			t.Fatal(err)
		}
		if err := e.H1.Driver.UpsertRemoteEndpoint(c, e.Remote(b1, e.H2)); err != nil {
			t.Fatal(err)
		}
		if err := e.H1.Driver.UpsertPeer(c, e.H2.Peer()); err != nil {
			t.Fatal(err)
		}
	}
	PingOK(t, a1.NS, b1.ip(), 3)
}

// badInput: an endpoint in an unknown network or without MAC is refused and leaves no
// link behind.
func badInput(t *testing.T, e *Env) {
	a1, _, _ := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	bad := a1.EP
	bad.ID, bad.HostIfName, bad.NetworkID = "x-bad", e.Prefix+"bad", "nope.default"
	if err := e.H1.Driver.UpsertEndpoint(c, bad); err == nil {
		t.Error("endpoint in an unknown network accepted")
	}
	bad.NetworkID, bad.MAC = e.Net.ID, nil
	if err := e.H1.Driver.UpsertEndpoint(c, bad); err == nil {
		t.Error("endpoint without MAC accepted")
	}
	if linkExists(e.H1.NS, e.Prefix+"bad") {
		t.Error("rejected endpoint left a link behind")
	}
}

// remoteHandover: a remote endpoint's address changes hands, its new record (another id,
// as when an endpoint moves between hosts) arriving before the old one's deletion.
// Deleting the old record leaves the address reachable through the new one, both ways;
// deleting the last record of the address ends it.
func remoteHandover(t *testing.T, e *Env) {
	a1, _, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	PingOK(t, a1.NS, b1.ip(), 3)
	moved := e.Remote(b1, e.H2)
	moved.ID = b1.EP.ID + "-moved"
	if err := e.H1.Driver.UpsertRemoteEndpoint(c, moved); err != nil {
		t.Fatal(err)
	}
	if err := e.H1.Driver.DeleteRemoteEndpoint(c, b1.EP.ID); err != nil {
		t.Fatal(err)
	}
	PingOK(t, a1.NS, b1.ip(), 3)
	PingOK(t, b1.NS, a1.ip(), 3)
	if err := e.H1.Driver.DeleteRemoteEndpoint(c, moved.ID); err != nil {
		t.Fatal(err)
	}
	PingFails(t, a1.NS, b1.ip())
}

// endpointDelete: an endpoint added and deleted (twice) through the single calls leaves
// no link and no forwarding, and others are unaffected.
func endpointDelete(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	a3 := e.AddContainer(t, "a3", "10.36.1.4")
	if err := e.H1.Driver.UpsertEndpoint(c, a3.EP); err != nil {
		t.Fatal(err)
	}
	if err := e.H2.Driver.UpsertRemoteEndpoint(c, e.Remote(a3, e.H1)); err != nil {
		t.Fatal(err)
	}
	PingOK(t, b1.NS, a3.ip(), 3)
	PingOK(t, a1.NS, a3.ip(), 3)
	for i := 0; i < 2; i++ {
		if err := e.H1.Driver.DeleteEndpoint(c, a3.EP.ID); err != nil {
			t.Fatalf("delete (%d): %v", i, err)
		}
		if err := e.H2.Driver.DeleteRemoteEndpoint(c, a3.EP.ID); err != nil {
			t.Fatalf("delete remote (%d): %v", i, err)
		}
	}
	if linkExists(e.H1.NS, a3.EP.HostIfName) {
		t.Errorf("host-side %s still exists", a3.EP.HostIfName)
	}
	if linkExists(a3.NS, "eth0") {
		t.Error("container end still exists")
	}
	PingFails(t, a1.NS, a3.ip())
	PingOK(t, a1.NS, a2.ip(), 3)
}

// peerRemove: without the peer cross-host traffic stops and local traffic goes on; the
// peer added back restores it.
func peerRemove(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	if err := e.H1.Driver.DeletePeer(c, e.H2.Name); err != nil {
		t.Fatal(err)
	}
	PingFails(t, a1.NS, b1.ip())
	PingOK(t, a1.NS, a2.ip(), 3) // local traffic unaffected
	if err := e.H1.Driver.UpsertPeer(c, e.H2.Peer()); err != nil {
		t.Fatal(err)
	}
	PingOK(t, a1.NS, b1.ip(), 3)
}

// policy: group rule sets (priorities, SYN-only deny, remote group) with real
// connections, stateful for replies, and gone when deleted.
func policy(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	const allowed, other = 8080, 8081
	for _, port := range []int{allowed, other} {
		srv, err := StartTCPEchoPort(b1.NS, b1.ip(), port)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
	}
	pols := []dataplane.PolicySet{
		{EPGID: 2, Rules: []dataplane.PolicyRule{
			{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
			{ID: "allow-8080", Priority: 5, Ingress: true, Proto: 6, Port: allowed, Action: dataplane.ActionAllow},
		}},
		{EPGID: 1, Rules: []dataplane.PolicyRule{
			{ID: "deny-from-2", Priority: 10, Ingress: true, RemoteEPG: 2, Action: dataplane.ActionDeny},
		}},
	}
	for _, h := range []*Host{e.H1, e.H2} {
		for _, p := range pols {
			if err := h.Driver.UpsertPolicy(c, p); err != nil {
				t.Fatalf("%s: %v", h.Name, err)
			}
		}
	}
	addr := func(port int) string { return net.JoinHostPort(b1.ip(), fmt.Sprint(port)) }
	if conn, err := DialTCP(a1.NS, addr(allowed)); err != nil {
		t.Errorf("allowed port: %v", err)
	} else {
		if err := EchoRoundTrip(conn, transfer); err != nil {
			t.Errorf("allowed port: %v", err)
		}
		conn.Close()
	}
	if conn, err := DialTCPTimeout(a1.NS, addr(other), time.Second); err == nil {
		conn.Close()
		t.Error("connection to a denied port succeeded")
	}
	PingOK(t, a1.NS, b1.ip(), 3) // ICMP unmatched by group 2; the reply passes group 1 (stateful)
	PingFails(t, b1.NS, a1.ip()) // new flows from group 2 into group 1 are denied
	PingOK(t, a2.NS, a1.ip(), 3) // within group 1, same host
	for _, h := range []*Host{e.H1, e.H2} {
		for _, p := range pols {
			if err := h.Driver.DeletePolicy(c, p.EPGID); err != nil {
				t.Fatalf("%s: %v", h.Name, err)
			}
		}
	}
	PingOK(t, b1.NS, a1.ip(), 3)
	if conn, err := DialTCPTimeout(a1.NS, addr(other), 3*time.Second); err != nil {
		t.Errorf("after delete: %v", err)
	} else {
		conn.Close()
	}
}

// networkpolicy: Kubernetes pod policies (ingress and egress isolation) and their
// changes to established connections.
func networkpolicy(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	const allowed, other = 8082, 8083
	echoServers(t, allowed, b1)
	echoServers(t, other, b1)
	pod := func(ct *Container, p dataplane.PodPolicy) dataplane.PodPolicy {
		p.ID, p.NetworkID, p.IP = ct.EP.ID, ct.EP.NetworkID, ct.EP.IP
		return p
	}
	set := func(ps ...dataplane.PodPolicy) {
		t.Helper()
		for _, h := range []*Host{e.H1, e.H2} {
			for _, p := range ps {
				if err := h.Driver.UpsertPodPolicy(c, p); err != nil {
					t.Fatalf("%s: %v", h.Name, err)
				}
			}
		}
	}
	unset := func(cts ...*Container) {
		t.Helper()
		for _, h := range []*Host{e.H1, e.H2} {
			for _, ct := range cts {
				if err := h.Driver.DeletePodPolicy(c, ct.EP.ID); err != nil {
					t.Fatalf("%s: %v", h.Name, err)
				}
			}
		}
	}
	addr := func(port int) string { return net.JoinHostPort(b1.ip(), fmt.Sprint(port)) }
	dialOK := func(from *Container, port int) {
		t.Helper()
		conn, err := DialTCPTimeout(from.NS, addr(port), 3*time.Second)
		if err != nil {
			t.Errorf("%s → b1:%d: %v", from.EP.ID, port, err)
			return
		}
		if err := EchoRoundTrip(conn, transfer); err != nil {
			t.Errorf("%s → b1:%d: %v", from.EP.ID, port, err)
		}
		conn.Close()
	}
	dialFails := func(from *Container, port int) {
		t.Helper()
		if conn, err := DialTCPTimeout(from.NS, addr(port), time.Second); err == nil {
			conn.Close()
			t.Errorf("%s → b1:%d: connected, want refused by the NetworkPolicy layer", from.EP.ID, port)
		}
	}
	// b1 (on the other host) admits only a1, only TCP 8082: both sides of every flow
	// are judged wherever the flow is first seen.
	set(pod(b1, dataplane.PodPolicy{IngressIsolated: true,
		Ingress: []dataplane.PodRule{{Remote: netip.PrefixFrom(a1.EP.IP, 32), Proto: 6, PortMin: allowed, PortMax: allowed}}}))
	dialOK(a1, allowed)
	dialFails(a1, other)
	dialFails(a2, allowed)
	PingFails(t, a1.NS, b1.ip())
	PingOK(t, b1.NS, a1.ip(), 3) // b1 is not isolated for egress, a1 not for ingress
	// A change cuts the established connections it no longer allows (eBPF: the policy
	// epoch; OVS: conntrack judged again and flushed), and keeps the ones it does.
	held, err := DialTCPTimeout(a1.NS, addr(allowed), 3*time.Second)
	if err != nil {
		t.Fatalf("a1 → b1:%d: %v", allowed, err)
	}
	defer held.Close()
	kept, err := DialTCPTimeout(a1.NS, addr(other), 3*time.Second)
	if err == nil {
		kept.Close()
		t.Fatalf("a1 → b1:%d connected before it is allowed", other)
	}
	set(pod(b1, dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{
		{Remote: netip.PrefixFrom(a1.EP.IP, 32), Proto: 6, PortMin: allowed, PortMax: other}}}))
	kept, err = DialTCPTimeout(a1.NS, addr(other), 3*time.Second)
	if err != nil {
		t.Fatalf("a1 → b1:%d after it was allowed: %v", other, err)
	}
	defer kept.Close()
	if err := EchoRoundTrip(held, 1024); err != nil {
		t.Fatalf("a connection still allowed broke: %v", err)
	}
	set(pod(b1, dataplane.PodPolicy{IngressIsolated: true, Ingress: []dataplane.PodRule{
		{Remote: netip.PrefixFrom(a1.EP.IP, 32), Proto: 6, PortMin: other, PortMax: other}}}))
	if err := EchoRoundTrip(held, 1024); err == nil {
		t.Error("an established connection the new policy denies kept working")
	}
	if err := EchoRoundTrip(kept, 1024); err != nil {
		t.Errorf("an established connection the new policy still allows broke: %v", err)
	}
	set(pod(b1, dataplane.PodPolicy{IngressIsolated: true,
		Ingress: []dataplane.PodRule{{Remote: netip.PrefixFrom(a1.EP.IP, 32), Proto: 6, PortMin: allowed, PortMax: allowed}}}))
	// a1 isolated for egress with no rules: it opens nothing; what others open to it
	// still gets its replies.
	set(pod(a1, dataplane.PodPolicy{EgressIsolated: true}))
	dialFails(a1, allowed)
	PingFails(t, a1.NS, a2.ip())
	PingOK(t, a2.NS, a1.ip(), 3)
	unset(a1, b1)
	dialOK(a2, allowed)
	dialOK(a2, other)
	PingOK(t, a1.NS, b1.ip(), 3)
}

// service: a VIP balances connections over a local and a remote backend and stops
// answering when the service is deleted.
func service(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	const target = 8090
	srvs := echoServers(t, target, a2, b1)
	svc := dataplane.Service{ID: "web:default", VIP: netip.MustParseAddr("10.36.1.200"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: target}}, Backends: []netip.Addr{a2.EP.IP, b1.EP.IP}}
	e.upsertService(t, c, svc)
	for i := 0; i < 16; i++ {
		conn, err := DialTCP(a1.NS, "10.36.1.200:80")
		if err != nil {
			t.Fatalf("connection %d to the VIP: %v", i, err)
		}
		if err := EchoRoundTrip(conn, 8192); err != nil {
			t.Errorf("connection %d to the VIP: %v", i, err)
		}
		if la := conn.RemoteAddr().String(); la != "10.36.1.200:80" {
			t.Errorf("client sees peer %s, want the VIP", la)
		}
		conn.Close()
	}
	if srvs[0].Accepted.Load() == 0 || srvs[1].Accepted.Load() == 0 {
		t.Errorf("connections per backend: local %d, remote %d; want both used", srvs[0].Accepted.Load(), srvs[1].Accepted.Load())
	}
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.DeleteService(c, svc.ID); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
	if conn, err := DialTCPTimeout(a1.NS, "10.36.1.200:80", time.Second); err == nil {
		conn.Close()
		t.Error("VIP still answers after the service was deleted")
	}
}

// serviceAffinityDrain: ClientIP affinity keeps a client on one backend; a draining
// backend keeps its open connection and gets no new ones.
func serviceAffinityDrain(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c := ctx(t)
	const target = 8091
	srvs := echoServers(t, target, a2, b1)
	svc := dataplane.Service{ID: "sticky:default", VIP: netip.MustParseAddr("10.36.1.201"), AffinityClientIP: true,
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: target}}, Backends: []netip.Addr{a2.EP.IP, b1.EP.IP}}
	put := func(s dataplane.Service) { t.Helper(); e.upsertService(t, c, s) }
	accepted := func() [2]int64 { return [2]int64{srvs[0].Accepted.Load(), srvs[1].Accepted.Load()} }
	put(svc)
	// ClientIP affinity: every connection of a1 reaches the same backend.
	before := accepted()
	var held net.Conn
	for i := 0; i < 12; i++ {
		conn, err := DialTCP(a1.NS, "10.36.1.201:80")
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if err := EchoRoundTrip(conn, 1024); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if held == nil {
			held = conn // kept open through the drain below
		} else {
			conn.Close()
		}
	}
	defer held.Close()
	after := accepted()
	sticky := 0
	if after[1]-before[1] > 0 {
		sticky = 1
	}
	if after[sticky]-before[sticky] != 12 || after[1-sticky] != before[1-sticky] {
		t.Fatalf("with ClientIP affinity: backends accepted %v → %v, want all 12 on one", before, after)
	}
	// The sticky backend drains: its open connection goes on, new ones go to the other.
	be := []netip.Addr{a2.EP.IP, b1.EP.IP}
	drained := svc
	drained.Backends, drained.Draining = []netip.Addr{be[1-sticky]}, []netip.Addr{be[sticky]}
	put(drained)
	if err := EchoRoundTrip(held, transfer); err != nil {
		t.Errorf("the draining backend's connection broke: %v", err)
	}
	before = accepted()
	for i := 0; i < 6; i++ {
		conn, err := DialTCP(a1.NS, "10.36.1.201:80")
		if err != nil {
			t.Fatalf("connection %d while draining: %v", i, err)
		}
		if err := EchoRoundTrip(conn, 1024); err != nil {
			t.Errorf("connection %d while draining: %v", i, err)
		}
		conn.Close()
	}
	if after := accepted(); after[sticky] != before[sticky] || after[1-sticky]-before[1-sticky] != 6 {
		t.Errorf("while draining: backends accepted %v → %v, want the 6 new ones on the other", before, after)
	}
	if err := EchoRoundTrip(held, 1024); err != nil {
		t.Errorf("the draining backend's connection after new ones: %v", err)
	}
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.DeleteService(c, svc.ID); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}

// restart: with the driver closed the datapath forwards; a new driver and a Sync keep a
// connection opened before the restart.
func restart(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c1, c2 := e.vlanPair(t)
	// A connection opened before the restart must keep working through it.
	srv, err := StartTCPEcho(b1.NS, b1.ip())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := DialTCP(a1.NS, srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := EchoRoundTrip(conn, 4096); err != nil {
		t.Fatal(err)
	}
	if err := e.H1.Driver.Close(); err != nil {
		t.Fatal(err)
	}
	e.H1.Driver = nil
	// No agent: the datapath keeps forwarding.
	PingOK(t, a1.NS, a2.ip(), 1)
	PingOK(t, a1.NS, b1.ip(), 1)
	if err := EchoRoundTrip(conn, 4096); err != nil {
		t.Errorf("connection while the driver is down: %v", err)
	}
	e.H1.Driver = e.factory(t, e.H1.Cfg)
	if err := EchoRoundTrip(conn, 4096); err != nil {
		t.Errorf("connection after New: %v", err)
	}
	e.H1.Sync(t)
	if err := EchoRoundTrip(conn, transfer); err != nil {
		t.Errorf("connection after Sync: %v", err)
	}
	PingOK(t, a1.NS, a2.ip(), 3)
	PingOK(t, b1.NS, a1.ip(), 3)
	PingOK(t, c1.NS, c2.ip(), 3)
}

// syncSweeps: an endpoint left out of a Sync is removed, and comes back with the next.
func syncSweeps(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	saved := e.H1.State.Endpoints
	e.H1.State.Endpoints = []dataplane.Endpoint{a1.EP}
	e.H1.Sync(t)
	if linkExists(e.H1.NS, a2.EP.HostIfName) {
		t.Errorf("endpoint a2 not swept: %s exists", a2.EP.HostIfName)
	}
	PingFails(t, a1.NS, a2.ip())
	PingOK(t, a1.NS, b1.ip(), 3)
	e.H1.State.Endpoints = saved
	e.H1.Sync(t)
	PingOK(t, a1.NS, a2.ip(), 3)
}

// syncBadRemote: remote endpoints need a VTEP only in VXLAN networks; one invalid remote
// in a Sync is left out and named, and everything else is applied and swept.
func syncBadRemote(t *testing.T, e *Env) {
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	c1, c2 := e.vlanPair(t)
	c := ctx(t)
	// A VLAN network's remote endpoints need no VTEP (an L2 fabric); a VXLAN one does.
	noVTEP := e.Remote(c2, e.H2)
	noVTEP.VTEP = netip.Addr{}
	if err := e.H1.Driver.UpsertRemoteEndpoint(c, noVTEP); err != nil {
		t.Fatalf("vlan remote endpoint without vtep refused: %v", err)
	}
	badIP := netip.MustParseAddr("10.36.1.77")
	bad := dataplane.RemoteEndpoint{ID: "x-bad-remote", NetworkID: e.Net.ID, IP: badIP,
		MAC: dataplane.ContivMAC(badIP), Host: e.H2.Name}
	if err := e.H1.Driver.UpsertRemoteEndpoint(c, bad); err == nil {
		t.Error("vxlan remote endpoint without vtep accepted")
	}
	// One invalid remote in a Sync: everything else is applied (the VTEP-less VLAN
	// remote forwards, a1 and b1 still talk) and swept (a2, left out, is removed), and
	// the error names the invalid object.
	saved := e.H1.State
	st := saved
	st.Endpoints = []dataplane.Endpoint{a1.EP, c1.EP}
	st.RemoteEndpoints = nil
	for _, r := range saved.RemoteEndpoints {
		if r.ID == noVTEP.ID {
			r = noVTEP
		}
		st.RemoteEndpoints = append(st.RemoteEndpoints, r)
	}
	st.RemoteEndpoints = append(st.RemoteEndpoints, bad)
	err := e.H1.Driver.Sync(c, st)
	if err == nil || !strings.Contains(err.Error(), bad.ID) {
		t.Errorf("sync with an invalid remote endpoint: err = %v, want one naming %s", err, bad.ID)
	}
	if linkExists(e.H1.NS, a2.EP.HostIfName) {
		t.Errorf("sync with an invalid remote swept nothing: %s (left out) still exists", a2.EP.HostIfName)
	}
	PingOK(t, c1.NS, c2.ip(), 3)
	PingOK(t, c2.NS, c1.ip(), 3)
	PingOK(t, a1.NS, b1.ip(), 3)
	e.H1.State = saved
	e.H1.Sync(t)
	PingOK(t, a1.NS, a2.ip(), 3)
}
