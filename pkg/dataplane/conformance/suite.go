package conformance

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// Factory starts a driver for one simulated host. It is called again with the same
// config to restart a host; the suite calls Close or Teardown on what it returns.
type Factory func(t *testing.T, cfg dataplane.HostConfig) dataplane.Driver

const (
	wireIf    = "wire0"
	vxlanPort = 4789
	transfer  = 256 << 10 // bytes per TCP check: many full-size segments
)

// Host is one simulated host of the suite.
type Host struct {
	Name   string
	NS     string // namespace path
	Cfg    dataplane.HostConfig
	Driver dataplane.Driver
	State  dataplane.State // what the suite last synced
}

// Container is one container namespace with its endpoint.
type Container struct {
	NS string
	EP dataplane.Endpoint
}

// Env is the two-host topology the scenarios run on.
type Env struct {
	Prefix  string
	Net     dataplane.Network // VXLAN network
	VLANNet dataplane.Network // VLAN network over the wire (HostConfig.VLANIf)
	H1, H2  *Host
	factory Factory
}

// NewEnv builds two hosts joined by a veth wire (10.254.0.1/24 and 10.254.0.2/24) and
// starts a driver on each, in bridge mode.
func NewEnv(t *testing.T, factory Factory) *Env {
	t.Helper()
	return NewEnvMode(t, factory, dataplane.FwdBridge)
}

// NewEnvMode is NewEnv with a forwarding mode.
func NewEnvMode(t *testing.T, factory Factory, mode dataplane.FwdMode) *Env {
	t.Helper()
	RequireRoot(t)
	p := Prefix()
	e := &Env{Prefix: p, factory: factory, Net: dataplane.Network{
		ID: "blue.default", Encap: dataplane.EncapVXLAN, Tag: 5001,
		Subnet: netip.MustParsePrefix("10.36.1.0/24"), Gateway: netip.MustParseAddr("10.36.1.254"), MTU: 1450,
	}}
	e.VLANNet = dataplane.Network{ID: "green.default", Encap: dataplane.EncapVLAN, Tag: 100,
		Subnet: netip.MustParsePrefix("10.36.2.0/24"), Gateway: netip.MustParseAddr("10.36.2.254"), MTU: 1500}
	pinBase := filepath.Join("/sys/fs/bpf", p)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	mk := func(name, addr string) *Host {
		ns := NewNetNS(t, p+"-"+name)
		return &Host{Name: name, NS: ns, Cfg: dataplane.HostConfig{
			Host: name, NetNS: ns, VTEP: netip.MustParseAddr(addr), VXLANPort: vxlanPort,
			FwdMode: mode, PinRoot: filepath.Join(pinBase, name), VXLANIf: "cbevx0",
			VLANIf: wireIf,
		}}
	}
	e.H1, e.H2 = mk("h1", "10.254.0.1"), mk("h2", "10.254.0.2")
	if err := wire(e.H1.NS, e.H2.NS); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*Host{e.H1, e.H2} {
		h.Driver = factory(t, h.Cfg)
		h.State = dataplane.State{Networks: []dataplane.Network{e.Net}}
	}
	t.Cleanup(func() {
		for _, h := range []*Host{e.H1, e.H2} {
			if h.Driver != nil {
				if err := h.Driver.Teardown(context.Background()); err != nil {
					t.Logf("teardown %s: %v", h.Name, err)
				}
			}
		}
	})
	return e
}

func wire(ns1, ns2 string) error {
	h1, err := netns.GetFromPath(ns1)
	if err != nil {
		return err
	}
	defer h1.Close()
	h2, err := netns.GetFromPath(ns2)
	if err != nil {
		return err
	}
	defer h2.Close()
	nl1, err := netlink.NewHandleAt(h1)
	if err != nil {
		return err
	}
	defer nl1.Close()
	nl2, err := netlink.NewHandleAt(h2)
	if err != nil {
		return err
	}
	defer nl2.Close()
	if err := nl1.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: wireIf}, PeerName: wireIf, PeerNamespace: netlink.NsFd(int(h2))}); err != nil {
		return fmt.Errorf("create wire: %w", err)
	}
	for i, nl := range []*netlink.Handle{nl1, nl2} {
		l, err := nl.LinkByName(wireIf)
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(fmt.Sprintf("10.254.0.%d/24", i+1))
		if err := nl.AddrAdd(l, a); err != nil {
			return fmt.Errorf("address on wire: %w", err)
		}
		if err := nl.LinkSetUp(l); err != nil {
			return err
		}
	}
	return nil
}

// AddContainer creates a container namespace and the endpoint description for it in the
// VXLAN network (the caller programs it through the driver).
func (e *Env) AddContainer(t *testing.T, name string, ip string) *Container {
	return e.AddContainerIn(t, e.Net, name, ip)
}

// AddContainerIn is AddContainer for any network.
func (e *Env) AddContainerIn(t *testing.T, n dataplane.Network, name string, ip string) *Container {
	t.Helper()
	ns := NewNetNS(t, e.Prefix+"-"+name)
	a := netip.MustParseAddr(ip)
	return &Container{NS: ns, EP: dataplane.Endpoint{
		ID: n.ID + "-" + name, NetworkID: n.ID, IP: a, MAC: dataplane.ContivMAC(a),
		HostIfName: e.Prefix + name, NetNS: ns, IfName: "eth0",
	}}
}

// Remote describes c as seen from another host.
func (e *Env) Remote(c *Container, owner *Host) dataplane.RemoteEndpoint {
	return dataplane.RemoteEndpoint{ID: c.EP.ID, NetworkID: c.EP.NetworkID, IP: c.EP.IP, MAC: c.EP.MAC,
		EPGID: c.EP.EPGID, VTEP: owner.Cfg.VTEP, Host: owner.Name}
}

// Peer describes h as a peer.
func (h *Host) Peer() dataplane.Peer { return dataplane.Peer{Host: h.Name, VTEP: h.Cfg.VTEP} }

// Sync hands the host's State to its driver.
func (h *Host) Sync(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Driver.Sync(ctx, h.State); err != nil {
		t.Fatalf("sync %s: %v", h.Name, err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func linkExists(ns, name string) bool {
	found := false
	_ = nsexec.Run(ns, func() error {
		_, err := net.InterfaceByName(name)
		found = err == nil
		return nil
	})
	return found
}

// threeContainers attaches a1 and a2 on host 1 and b1 on host 2 (10.36.1.1-3) in the
// given groups, makes the hosts peers and syncs both.
func (e *Env) threeContainers(t *testing.T, ga1, ga2, gb1 uint16) (a1, a2, b1 *Container) {
	t.Helper()
	a1 = e.AddContainer(t, "a1", "10.36.1.1")
	a2 = e.AddContainer(t, "a2", "10.36.1.2")
	b1 = e.AddContainer(t, "b1", "10.36.1.3")
	a1.EP.EPGID, a2.EP.EPGID, b1.EP.EPGID = ga1, ga2, gb1
	e.H1.State.Peers = []dataplane.Peer{e.H2.Peer()}
	e.H2.State.Peers = []dataplane.Peer{e.H1.Peer()}
	e.H1.State.Endpoints = []dataplane.Endpoint{a1.EP, a2.EP}
	e.H1.State.RemoteEndpoints = []dataplane.RemoteEndpoint{e.Remote(b1, e.H2)}
	e.H2.State.Endpoints = []dataplane.Endpoint{b1.EP}
	e.H2.State.RemoteEndpoints = []dataplane.RemoteEndpoint{e.Remote(a1, e.H1), e.Remote(a2, e.H1)}
	e.H1.Sync(t)
	e.H2.Sync(t)
	return a1, a2, b1
}

// echoServers starts a TCP echo server on port in each container (closed when t ends).
func echoServers(t *testing.T, port int, cts ...*Container) []*TCPServer {
	t.Helper()
	var srvs []*TCPServer
	for _, ct := range cts {
		srv, err := StartTCPEchoPort(ct.NS, ct.EP.IP.String(), port)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		srvs = append(srvs, srv)
	}
	return srvs
}

// upsertService programs svc on every host.
func (e *Env) upsertService(t *testing.T, c context.Context, svc dataplane.Service) {
	t.Helper()
	for _, h := range []*Host{e.H1, e.H2} {
		if err := h.Driver.UpsertService(c, svc); err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}

// Run drives a Driver through every backend-neutral scenario.
func Run(t *testing.T, factory Factory) {
	e := NewEnv(t, factory)
	a1, a2, b1 := e.threeContainers(t, 1, 1, 2)
	ip := func(c *Container) string { return c.EP.IP.String() }

	t.Run("container-config", func(t *testing.T) {
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
	})
	t.Run("same-host", func(t *testing.T) {
		PingOK(t, a1.NS, ip(a2), 3)
		if err := TCPCheck(a2.NS, ip(a2), a1.NS, transfer); err != nil {
			t.Error(err)
		}
	})
	t.Run("cross-host", func(t *testing.T) {
		PingOK(t, a1.NS, ip(b1), 3)
		PingOK(t, b1.NS, ip(a2), 3)
		if err := TCPCheck(b1.NS, ip(b1), a1.NS, transfer); err != nil {
			t.Error("a1→b1:", err)
		}
		if err := TCPCheck(a2.NS, ip(a2), b1.NS, transfer); err != nil {
			t.Error("b1→a2:", err)
		}
	})
	t.Run("arp", func(t *testing.T) {
		for _, c := range []*Container{a1, b1} {
			if err := flushNeigh(c.NS); err != nil {
				t.Fatal(err)
			}
		}
		capt, err := StartCapture(e.H1.NS, wireIf)
		if err != nil {
			t.Fatal(err)
		}
		PingOK(t, a1.NS, ip(b1), 3)
		PingOK(t, a1.NS, ip(a2), 3)
		PingOK(t, b1.NS, ip(a1), 3)
		if err := TCPCheck(b1.NS, ip(b1), a1.NS, 4096); err != nil {
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
	})
	// Created on the parent test so the namespaces outlive the subtest.
	c1 := e.AddContainerIn(t, e.VLANNet, "c1", "10.36.2.1")
	c2 := e.AddContainerIn(t, e.VLANNet, "c2", "10.36.2.2")
	t.Run("vlan", func(t *testing.T) {
		e.H1.State.Networks = append(e.H1.State.Networks, e.VLANNet)
		e.H2.State.Networks = append(e.H2.State.Networks, e.VLANNet)
		e.H1.State.Endpoints = append(e.H1.State.Endpoints, c1.EP)
		e.H2.State.Endpoints = append(e.H2.State.Endpoints, c2.EP)
		e.H1.State.RemoteEndpoints = append(e.H1.State.RemoteEndpoints, e.Remote(c2, e.H2))
		e.H2.State.RemoteEndpoints = append(e.H2.State.RemoteEndpoints, e.Remote(c1, e.H1))
		e.H1.Sync(t)
		e.H2.Sync(t)
		capt, err := StartCapture(e.H1.NS, wireIf)
		if err != nil {
			t.Fatal(err)
		}
		PingOK(t, c1.NS, ip(c2), 3)
		if err := TCPCheck(c2.NS, ip(c2), c1.NS, transfer); err != nil {
			t.Error("c1→c2:", err)
		}
		if err := TCPCheck(c1.NS, ip(c1), c2.NS, transfer); err != nil {
			t.Error("c2→c1:", err)
		}
		PingFails(t, c1.NS, ip(a1)) // networks are isolated
		st := capt.Stop(e.VLANNet.Subnet, vxlanPort)
		t.Logf("wire: frames %d, vlan %v, arp for subnet %d", st.Frames, st.VLAN, st.ARPForSubnet)
		if st.VLAN[int(e.VLANNet.Tag)] == 0 {
			t.Errorf("no frames tagged %d on the wire", e.VLANNet.Tag)
		}
		if st.ARPForSubnet != 0 {
			t.Errorf("%d container ARP frames on the wire", st.ARPForSubnet)
		}
	})
	t.Run("idempotent", func(t *testing.T) {
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
		PingOK(t, a1.NS, ip(b1), 3)
	})
	t.Run("bad-input", func(t *testing.T) {
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
	})
	t.Run("endpoint-delete", func(t *testing.T) {
		c := ctx(t)
		a3 := e.AddContainer(t, "a3", "10.36.1.4")
		if err := e.H1.Driver.UpsertEndpoint(c, a3.EP); err != nil {
			t.Fatal(err)
		}
		if err := e.H2.Driver.UpsertRemoteEndpoint(c, e.Remote(a3, e.H1)); err != nil {
			t.Fatal(err)
		}
		PingOK(t, b1.NS, ip(a3), 3)
		PingOK(t, a1.NS, ip(a3), 3)
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
		PingFails(t, a1.NS, ip(a3))
		PingOK(t, a1.NS, ip(a2), 3)
	})
	t.Run("peer-remove", func(t *testing.T) {
		c := ctx(t)
		if err := e.H1.Driver.DeletePeer(c, e.H2.Name); err != nil {
			t.Fatal(err)
		}
		PingFails(t, a1.NS, ip(b1))
		PingOK(t, a1.NS, ip(a2), 3) // local traffic unaffected
		if err := e.H1.Driver.UpsertPeer(c, e.H2.Peer()); err != nil {
			t.Fatal(err)
		}
		PingOK(t, a1.NS, ip(b1), 3)
	})
	t.Run("policy", func(t *testing.T) {
		c := ctx(t)
		const allowed, other = 8080, 8081
		for _, port := range []int{allowed, other} {
			srv, err := StartTCPEchoPort(b1.NS, ip(b1), port)
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
		addr := func(port int) string { return net.JoinHostPort(ip(b1), fmt.Sprint(port)) }
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
		PingOK(t, a1.NS, ip(b1), 3) // ICMP unmatched by group 2; the reply passes group 1 (stateful)
		PingFails(t, b1.NS, ip(a1)) // new flows from group 2 into group 1 are denied
		PingOK(t, a2.NS, ip(a1), 3) // within group 1, same host
		for _, h := range []*Host{e.H1, e.H2} {
			for _, p := range pols {
				if err := h.Driver.DeletePolicy(c, p.EPGID); err != nil {
					t.Fatalf("%s: %v", h.Name, err)
				}
			}
		}
		PingOK(t, b1.NS, ip(a1), 3)
		if conn, err := DialTCPTimeout(a1.NS, addr(other), 3*time.Second); err != nil {
			t.Errorf("after delete: %v", err)
		} else {
			conn.Close()
		}
	})
	t.Run("networkpolicy", func(t *testing.T) {
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
		addr := func(port int) string { return net.JoinHostPort(ip(b1), fmt.Sprint(port)) }
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
		PingFails(t, a1.NS, ip(b1))
		PingOK(t, b1.NS, ip(a1), 3) // b1 is not isolated for egress, a1 not for ingress
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
		PingFails(t, a1.NS, ip(a2))
		PingOK(t, a2.NS, ip(a1), 3)
		unset(a1, b1)
		dialOK(a2, allowed)
		dialOK(a2, other)
		PingOK(t, a1.NS, ip(b1), 3)
	})
	t.Run("service", func(t *testing.T) {
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
	})
	t.Run("service-affinity-drain", func(t *testing.T) {
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
	})
	t.Run("restart", func(t *testing.T) {
		// A connection opened before the restart must keep working through it.
		srv, err := StartTCPEcho(b1.NS, ip(b1))
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
		PingOK(t, a1.NS, ip(a2), 1)
		PingOK(t, a1.NS, ip(b1), 1)
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
		PingOK(t, a1.NS, ip(a2), 3)
		PingOK(t, b1.NS, ip(a1), 3)
		PingOK(t, c1.NS, ip(c2), 3)
	})
	t.Run("sync-sweeps", func(t *testing.T) {
		saved := e.H1.State.Endpoints
		e.H1.State.Endpoints = []dataplane.Endpoint{a1.EP}
		e.H1.Sync(t)
		if linkExists(e.H1.NS, a2.EP.HostIfName) {
			t.Errorf("endpoint a2 not swept: %s exists", a2.EP.HostIfName)
		}
		PingFails(t, a1.NS, ip(a2))
		PingOK(t, a1.NS, ip(b1), 3)
		e.H1.State.Endpoints = saved
		e.H1.Sync(t)
		PingOK(t, a1.NS, ip(a2), 3)
	})
	t.Run("sync-bad-remote", func(t *testing.T) {
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
		PingOK(t, c1.NS, ip(c2), 3)
		PingOK(t, c2.NS, ip(c1), 3)
		PingOK(t, a1.NS, ip(b1), 3)
		e.H1.State = saved
		e.H1.Sync(t)
		PingOK(t, a1.NS, ip(a2), 3)
	})
}

// RunRouting checks Contiv's routing mode on a fresh two-host environment: containers of
// two networks of one tenant reach each other on one host and across hosts, routed (the
// router MAC answers ARP, TTL is decremented), and a network of another tenant stays apart.
func RunRouting(t *testing.T, factory Factory) {
	e := NewEnvMode(t, factory, dataplane.FwdRouting)
	red := dataplane.Network{ID: "red.default", Encap: dataplane.EncapVXLAN, Tag: 6001,
		Subnet: netip.MustParsePrefix("10.37.1.0/24"), Gateway: netip.MustParseAddr("10.37.1.254"), MTU: 1450}
	green := dataplane.Network{ID: "green.default", Encap: dataplane.EncapVXLAN, Tag: 6002,
		Subnet: netip.MustParsePrefix("10.37.2.0/24"), Gateway: netip.MustParseAddr("10.37.2.254"), MTU: 1450}
	blue := dataplane.Network{ID: "blue.other", Encap: dataplane.EncapVXLAN, Tag: 6003,
		Subnet: netip.MustParsePrefix("10.37.3.0/24"), Gateway: netip.MustParseAddr("10.37.3.254"), MTU: 1450}
	r1 := e.AddContainerIn(t, red, "r1", "10.37.1.1")
	g1 := e.AddContainerIn(t, green, "g1", "10.37.2.1")
	g2 := e.AddContainerIn(t, green, "g2", "10.37.2.2")
	x1 := e.AddContainerIn(t, blue, "x1", "10.37.3.1")
	nets := []dataplane.Network{red, green, blue}
	e.H1.State = dataplane.State{Networks: nets, Peers: []dataplane.Peer{e.H2.Peer()},
		Endpoints: []dataplane.Endpoint{r1.EP, g1.EP, x1.EP}, RemoteEndpoints: []dataplane.RemoteEndpoint{e.Remote(g2, e.H2)}}
	e.H2.State = dataplane.State{Networks: nets, Peers: []dataplane.Peer{e.H1.Peer()},
		Endpoints:       []dataplane.Endpoint{g2.EP},
		RemoteEndpoints: []dataplane.RemoteEndpoint{e.Remote(r1, e.H1), e.Remote(g1, e.H1), e.Remote(x1, e.H1)}}
	e.H1.Sync(t)
	e.H2.Sync(t)
	ip := func(c *Container) string { return c.EP.IP.String() }
	routedPing := func(t *testing.T, from *Container, to string) {
		t.Helper()
		var out []byte
		var err error
		for i := 0; i < 3; i++ {
			out, err = exec.Command("nsenter", "--net="+from.NS, "busybox", "ping", "-c", "1", "-W", "1", to).CombinedOutput()
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Errorf("ping %s from %s: %v: %s", to, from.EP.IfName, err, out)
			return
		}
		if strings.Contains(string(out), "ttl=64") {
			t.Errorf("ping %s: reply not routed (ttl unchanged): %s", to, out)
		}
	}
	t.Run("same-host", func(t *testing.T) { routedPing(t, r1, ip(g1)) })
	t.Run("cross-host", func(t *testing.T) {
		routedPing(t, r1, ip(g2))
		routedPing(t, g2, ip(r1))
		if err := TCPCheck(g2.NS, ip(g2), r1.NS, transfer); err != nil {
			t.Error(err)
		}
	})
	t.Run("router-mac", func(t *testing.T) {
		mac, err := neighMAC(r1.NS, red.Gateway)
		if err != nil {
			t.Fatal(err)
		}
		if mac != dataplane.RouterMAC.String() {
			t.Errorf("gateway resolved to %s, want %v", mac, dataplane.RouterMAC)
		}
	})
	t.Run("other-tenant-isolated", func(t *testing.T) {
		PingFails(t, x1.NS, ip(r1))
		PingFails(t, r1.NS, ip(x1))
	})
}

func flushNeigh(ns string) error {
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
	neighs, err := nl.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, n := range neighs {
		_ = nl.NeighDel(&n)
	}
	return nil
}

func neighMAC(ns string, ip netip.Addr) (string, error) {
	h, err := netns.GetFromPath(ns)
	if err != nil {
		return "", err
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		return "", err
	}
	defer nl.Close()
	neighs, err := nl.NeighList(0, netlink.FAMILY_V4)
	if err != nil {
		return "", err
	}
	for _, n := range neighs {
		if n.IP.Equal(ip.AsSlice()) {
			return n.HardwareAddr.String(), nil
		}
	}
	return "", fmt.Errorf("no neighbour entry for %v in %s", ip, filepath.Base(ns))
}
