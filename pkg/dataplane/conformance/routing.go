package conformance

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// RunRouting checks Contiv's routing mode on hosts of its own: containers of two networks
// of one tenant reach each other on one host and across hosts, routed (the router MAC
// answers ARP, TTL is decremented, an expired TTL is answered from the gateway), and a
// network of another tenant stays apart. Each
// check is a scenario that builds its own containers (runScenarios).
func RunRouting(t *testing.T, factory Factory) {
	newEnv := func(t *testing.T, tweak func(*dataplane.HostConfig)) *Env {
		e := newEnvWith(t, factory, dataplane.FwdRouting, tweak)
		// The scenarios bring their own networks: the baseline is the peers alone.
		e.H1.State.Networks, e.H2.State.Networks = nil, nil
		return e
	}
	runScenarios(t, newEnv, []scenario{
		{name: "same-host", run: func(t *testing.T, e *Env) {
			w := newRoutedWorld(t, e)
			routedPing(t, w.r1, w.g1.ip())
		}},
		{name: "cross-host", run: func(t *testing.T, e *Env) {
			w := newRoutedWorld(t, e)
			routedPing(t, w.r1, w.g2.ip())
			routedPing(t, w.g2, w.r1.ip())
			if err := TCPCheck(w.g2.NS, w.g2.ip(), w.r1.NS, transfer); err != nil {
				t.Error(err)
			}
		}},
		{name: "router-mac", run: func(t *testing.T, e *Env) {
			w := newRoutedWorld(t, e)
			PingOK(t, w.r1.NS, w.g1.ip(), 3) // resolves the gateway
			mac, err := neighMAC(w.r1.NS, w.red.Gateway)
			if err != nil {
				t.Fatal(err)
			}
			if mac != dataplane.RouterMAC.String() {
				t.Errorf("gateway resolved to %s, want %v", mac, dataplane.RouterMAC)
			}
		}},
		{name: "ttl-expired", run: func(t *testing.T, e *Env) {
			// A router answers a packet whose TTL runs out (RFC 1812), so traceroute
			// works: the first hop, to a container of another network of the tenant on
			// this host and on the other, is the sender's gateway.
			w := newRoutedWorld(t, e)
			PingOK(t, w.r1.NS, w.g1.ip(), 3) // (resolves the gateway)
			for _, to := range []string{w.g1.ip(), w.g2.ip()} {
				out, err := exec.Command("nsenter", "--net="+w.r1.NS, "busybox", "traceroute", "-n", "-m", "1", "-q", "2", "-w", "2", to).CombinedOutput()
				if err != nil || !strings.Contains(string(out), " "+w.red.Gateway.String()+" ") {
					t.Errorf("traceroute to %s from r1: first hop not the gateway %v (%v): %s", to, w.red.Gateway, err, out)
				}
			}
		}},
		{name: "other-tenant-isolated", run: func(t *testing.T, e *Env) {
			w := newRoutedWorld(t, e)
			PingFails(t, w.x1.NS, w.r1.ip())
			PingFails(t, w.r1.NS, w.x1.ip())
		}},
	})
}

// routedWorld is the routing scenarios' containers: r1 (red) and g1 (green) of one tenant
// and x1 (blue, another tenant) on host 1, g2 (green) on host 2.
type routedWorld struct {
	red            dataplane.Network
	r1, g1, g2, x1 *Container
}

// newRoutedWorld creates the containers of a routedWorld and programs both hosts with
// them, their networks and each other as peers.
func newRoutedWorld(t *testing.T, e *Env) *routedWorld {
	t.Helper()
	w := &routedWorld{red: dataplane.Network{ID: "red.default", Encap: dataplane.EncapVXLAN, Tag: 6001,
		Subnet: netip.MustParsePrefix("10.37.1.0/24"), Gateway: netip.MustParseAddr("10.37.1.254"), MTU: 1450}}
	green := dataplane.Network{ID: "green.default", Encap: dataplane.EncapVXLAN, Tag: 6002,
		Subnet: netip.MustParsePrefix("10.37.2.0/24"), Gateway: netip.MustParseAddr("10.37.2.254"), MTU: 1450}
	blue := dataplane.Network{ID: "blue.other", Encap: dataplane.EncapVXLAN, Tag: 6003,
		Subnet: netip.MustParsePrefix("10.37.3.0/24"), Gateway: netip.MustParseAddr("10.37.3.254"), MTU: 1450}
	w.r1 = e.AddContainerIn(t, w.red, "r1", "10.37.1.1")
	w.g1 = e.AddContainerIn(t, green, "g1", "10.37.2.1")
	w.g2 = e.AddContainerIn(t, green, "g2", "10.37.2.2")
	w.x1 = e.AddContainerIn(t, blue, "x1", "10.37.3.1")
	nets := []dataplane.Network{w.red, green, blue}
	e.H1.State = dataplane.State{Networks: nets, Peers: []dataplane.Peer{e.H2.Peer()},
		Endpoints: []dataplane.Endpoint{w.r1.EP, w.g1.EP, w.x1.EP}, RemoteEndpoints: []dataplane.RemoteEndpoint{e.Remote(w.g2, e.H2)}}
	e.H2.State = dataplane.State{Networks: nets, Peers: []dataplane.Peer{e.H1.Peer()},
		Endpoints:       []dataplane.Endpoint{w.g2.EP},
		RemoteEndpoints: []dataplane.RemoteEndpoint{e.Remote(w.r1, e.H1), e.Remote(w.g1, e.H1), e.Remote(w.x1, e.H1)}}
	e.H1.Sync(t)
	e.H2.Sync(t)
	return w
}

// routedPing pings to from the container (three tries) and wants the reply routed: its
// TTL decremented from the sender's 64.
func routedPing(t *testing.T, from *Container, to string) {
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
