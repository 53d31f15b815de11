package conformance

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// Factory starts a driver for one simulated host. It is called again with the same
// config to restart a host; the suite calls Close or Teardown on what it returns. A
// backend's own options (its pins, its private OVS) are the factory's: hosts are told
// apart by their namespace (HostConfig.NetNS), unique to each host the suite builds.
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
	return newEnvWith(t, factory, mode, nil)
}

// newEnvWith is NewEnvMode whose hosts' configs tweak changes (nil: none) before their
// drivers start.
func newEnvWith(t *testing.T, factory Factory, mode dataplane.FwdMode, tweak func(*dataplane.HostConfig)) *Env {
	t.Helper()
	testroot.Need(t)
	p := Prefix()
	e := &Env{Prefix: p, factory: factory, Net: dataplane.Network{
		ID: "blue.default", Encap: dataplane.EncapVXLAN, Tag: 5001,
		Subnet: netip.MustParsePrefix("10.36.1.0/24"), Gateway: netip.MustParseAddr("10.36.1.254"), MTU: 1450,
	}}
	e.VLANNet = dataplane.Network{ID: "green.default", Encap: dataplane.EncapVLAN, Tag: 100,
		Subnet: netip.MustParsePrefix("10.36.2.0/24"), Gateway: netip.MustParseAddr("10.36.2.254"), MTU: 1500}
	mk := func(name, addr string) *Host {
		ns := NewNetNS(t, p+"-"+name)
		return &Host{Name: name, NS: ns, Cfg: dataplane.HostConfig{
			Host: name, NetNS: ns, VTEP: netip.MustParseAddr(addr), VXLANPort: vxlanPort,
			FwdMode: mode, VLANIf: wireIf,
		}}
	}
	e.H1, e.H2 = mk("h1", "10.254.0.1"), mk("h2", "10.254.0.2")
	if tweak != nil {
		tweak(&e.H1.Cfg)
		tweak(&e.H2.Cfg)
	}
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

// ip is the container's address as a string.
func (c *Container) ip() string { return c.EP.IP.String() }

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
	if err := h.sync(); err != nil {
		t.Fatal(err)
	}
}

// sync hands the host's State to its driver within 30 s.
func (h *Host) sync() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.Driver.Sync(ctx, h.State); err != nil {
		return fmt.Errorf("sync %s: %w", h.Name, err)
	}
	return nil
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

// vlanPair adds the VLAN network to both hosts with c1 on host 1 and c2 on host 2
// (10.36.2.1-2), each a remote endpoint of the other host, and syncs both.
func (e *Env) vlanPair(t *testing.T) (c1, c2 *Container) {
	t.Helper()
	c1 = e.AddContainerIn(t, e.VLANNet, "c1", "10.36.2.1")
	c2 = e.AddContainerIn(t, e.VLANNet, "c2", "10.36.2.2")
	e.H1.State.Networks = append(e.H1.State.Networks, e.VLANNet)
	e.H2.State.Networks = append(e.H2.State.Networks, e.VLANNet)
	e.H1.State.Endpoints = append(e.H1.State.Endpoints, c1.EP)
	e.H2.State.Endpoints = append(e.H2.State.Endpoints, c2.EP)
	e.H1.State.RemoteEndpoints = append(e.H1.State.RemoteEndpoints, e.Remote(c2, e.H2))
	e.H2.State.RemoteEndpoints = append(e.H2.State.RemoteEndpoints, e.Remote(c1, e.H1))
	e.H1.Sync(t)
	e.H2.Sync(t)
	return c1, c2
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
