package ebpf

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// egressWorld is a host namespace joined by a veth wire ("up0") to an external namespace
// standing in for the router and the Internet: the host is 192.168.77.1/24 with a default
// route via the external end 192.168.77.2, which also holds 203.0.113.9 (on its loopback).
// Neither namespace forwards.
type egressWorld struct {
	prefix string
	host   string // netns paths
	ext    string
}

const (
	ewHostIP = "192.168.77.1"
	ewExtIP  = "192.168.77.2"
	ewWorld  = "203.0.113.9"
)

func nsRun(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("nsenter", append([]string{"--net=" + ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("%s in %s: %v: %s", strings.Join(args, " "), filepath.Base(ns), err, out)
	}
}

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	testroot.Need(t)
	p := conformance.Prefix()
	w := &egressWorld{prefix: p, host: conformance.NewNetNS(t, p+"-h"), ext: conformance.NewNetNS(t, p+"-x")}
	if out, err := exec.Command("ip", "link", "add", p+"u", "netns", p+"-h", "type", "veth", "peer", "name", p+"x", "netns", p+"-x").CombinedOutput(); err != nil {
		t.Fatalf("create wire: %v: %s", err, out)
	}
	nsRun(t, w.host, "ip", "link", "set", p+"u", "name", "up0")
	nsRun(t, w.ext, "ip", "link", "set", p+"x", "name", "up0")
	nsRun(t, w.host, "ip", "addr", "add", ewHostIP+"/24", "dev", "up0")
	nsRun(t, w.host, "ip", "link", "set", "up0", "up")
	nsRun(t, w.host, "ip", "route", "add", "default", "via", ewExtIP)
	nsRun(t, w.ext, "ip", "addr", "add", ewExtIP+"/24", "dev", "up0")
	nsRun(t, w.ext, "ip", "addr", "add", ewWorld+"/32", "dev", "lo")
	nsRun(t, w.ext, "ip", "link", "set", "up0", "up")
	return w
}

func (w *egressWorld) driver(t *testing.T) *Driver {
	t.Helper()
	pinBase := filepath.Join("/sys/fs/bpf", w.prefix)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	d, err := New(context.Background(), dataplane.HostConfig{Host: "h", NetNS: w.host, VTEP: netip.MustParseAddr(ewHostIP)},
		Options{PinRoot: filepath.Join(pinBase, "h"), VXLANIf: "cbevx0", MapEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Teardown(context.Background()) })
	return d
}

func (w *egressWorld) endpoint(t *testing.T, n dataplane.Network, name, ip string) dataplane.Endpoint {
	a := netip.MustParseAddr(ip)
	return dataplane.Endpoint{ID: n.ID + "-" + name, NetworkID: n.ID, IP: a, MAC: dataplane.ContivMAC(a),
		HostIfName: w.prefix + name, IfName: "eth0", NetNS: conformance.NewNetNS(t, w.prefix+"-"+name)}
}

// acceptFrom listens on addr inside ns, accepts one connection and reports its peer.
func acceptFrom(t *testing.T, ns, addr string) (<-chan string, func()) {
	t.Helper()
	var ln net.Listener
	if err := nsexec.Run(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	peers := make(chan string, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			peers <- c.RemoteAddr().String()
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				_, _ = c.Write(buf[:n])
			}()
		}
	}()
	return peers, func() { ln.Close() }
}

// dialFrom connects from ns (bound to local port lport, 0 = any) and exchanges one message.
func dialFrom(ns string, lport int, addr string) error {
	return nsexec.Run(ns, func() error {
		dl := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: lport}}
		c, err := dl.Dial("tcp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("hello")); err != nil {
			return err
		}
		buf := make([]byte, 5)
		_, err = c.Read(buf)
		return err
	})
}

func TestHostPathAndEgress(t *testing.T) {
	w := newEgressWorld(t)
	d := w.driver(t)
	ctx := context.Background()
	red := dataplane.Network{ID: "red.t", Encap: dataplane.EncapVXLAN, Tag: 77,
		Subnet: netip.MustParsePrefix("10.50.0.0/24"), Gateway: netip.MustParseAddr("10.50.0.1")}
	blue := dataplane.Network{ID: "blue.u", Encap: dataplane.EncapVXLAN, Tag: 78, // another tenant, same subnet
		Subnet: netip.MustParsePrefix("10.50.0.0/24"), Gateway: netip.MustParseAddr("10.50.0.1")}
	a := w.endpoint(t, red, "a", "10.50.0.2")
	b := w.endpoint(t, red, "b", "10.50.0.3")
	c := w.endpoint(t, blue, "c", "10.50.0.2") // a's address, in tenant u
	state := dataplane.State{Networks: []dataplane.Network{red, blue}, Endpoints: []dataplane.Endpoint{a, b, c}}
	if err := d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}

	t.Run("host-to-endpoint", func(t *testing.T) {
		conformance.PingOK(t, w.host, "10.50.0.3", 3)
		if err := conformance.TCPCheck(b.NetNS, "10.50.0.3", w.host, 20000); err != nil {
			t.Error(err)
		}
		// The overlapping address is routed to one endpoint only: the first one.
		if err := conformance.TCPCheck(a.NetNS, "10.50.0.2", w.host, 100); err != nil {
			t.Error(err)
		}
	})
	t.Run("endpoint-to-host", func(t *testing.T) {
		peers, stop := acceptFrom(t, w.host, ewHostIP+":18080")
		defer stop()
		if err := dialFrom(a.NetNS, 0, ewHostIP+":18080"); err != nil {
			t.Fatal(err)
		}
		if p := <-peers; !strings.HasPrefix(p, "10.50.0.2:") {
			t.Errorf("host saw %s, want the endpoint's own address", p)
		}
		// c holds a's address in another tenant: the host's reply would go to a.
		if err := dialFrom(c.NetNS, 0, ewHostIP+":18080"); err == nil {
			t.Error("an endpoint of another tenant with the same address reached the host")
		}
	})
	t.Run("gateway-ping", func(t *testing.T) {
		conformance.PingOK(t, a.NetNS, "10.50.0.1", 3)
	})
	t.Run("egress", func(t *testing.T) {
		conformance.PingOK(t, a.NetNS, ewWorld, 3)
		conformance.PingOK(t, c.NetNS, ewWorld, 3)
		peers, stop := acceptFrom(t, w.ext, ewWorld+":443")
		defer stop()
		// a and c (same address, two tenants) and b, all from source port 40000 at once.
		errs := make(chan error, 3)
		for _, ep := range []dataplane.Endpoint{a, b, c} {
			go func() { errs <- dialFrom(ep.NetNS, 40000, ewWorld+":443") }()
		}
		seen := map[string]bool{}
		for range 3 {
			if err := <-errs; err != nil {
				t.Error(err)
				continue
			}
			p := <-peers
			if !strings.HasPrefix(p, ewHostIP+":") {
				t.Errorf("outside saw %s, want the host address", p)
			}
			seen[p] = true
		}
		if len(seen) != 3 {
			t.Errorf("three flows from one source port got NAT ports %v, want three different", seen)
		}
		srv, err := conformance.StartUDPEcho(w.ext, ewWorld, 5353)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		if _, err := conformance.UDPExchange(b.NetNS, ewWorld+":5353", []byte("udp-egress"), time.Second); err != nil {
			t.Error(err)
		}
		l, err := d.Listing(dataplane.ListQuery{Kind: "nat"})
		if err != nil {
			t.Fatal(err)
		}
		tcp := 0
		for _, r := range l.Rows {
			if r[1] == "tcp" && r[3] == ewWorld+":443" && strings.HasPrefix(r[4], ewHostIP+":") {
				tcp++
			}
		}
		if tcp != 3 {
			t.Errorf("nat listing shows %d TCP flows to %s:443, want 3:\n%v", tcp, ewWorld, l.Rows)
		}
	})
	t.Run("trace-changes-nothing", func(t *testing.T) {
		// A traced new egress flow (and ping) takes no NAT port, no quota count and no
		// budget of the live host (found by review: the trace programs shared the live
		// egress NAT maps and counters).
		live := func() map[string]string {
			out := map[string]string{}
			for _, m := range []*ebpf.Map{d.objs.CbSnat, d.objs.CbSnatRev, d.objs.CbPeerFlows, d.objs.CbCtOwned, d.objs.CbCtOwnedIn, d.objs.CbCtGens} {
				k := make([]byte, m.KeySize())
				v := make([]byte, m.ValueSize())
				it := m.Iterate()
				for it.Next(&k, &v) {
					out[fmt.Sprintf("%v/%x", m, k)] = fmt.Sprintf("%x", v)
				}
				if err := it.Err(); err != nil {
					t.Fatal(err)
				}
			}
			return out
		}
		before := live()
		for _, req := range []dataplane.TraceRequest{
			{From: a.ID, Dst: netip.MustParseAddr(ewWorld), Proto: 6, DstPort: 8443},
			{From: b.ID, Dst: netip.MustParseAddr(ewWorld), Proto: 17, DstPort: 5354},
			{From: a.ID, Dst: netip.MustParseAddr(ewWorld), Proto: 1},
		} {
			r, err := d.Trace(req)
			if err != nil {
				t.Fatalf("trace %+v: %v", req, err)
			}
			if r.Reason != "fwd_egress" {
				t.Errorf("trace %+v: %s %s, want fwd_egress", req, r.Reason, r.Verdict)
			}
		}
		if after := live(); !reflect.DeepEqual(after, before) {
			t.Errorf("traces changed the live NAT, quota or memo maps: %d entries before, %d after", len(before), len(after))
		}
	})
	t.Run("nodeport", func(t *testing.T) {
		svc := dataplane.Service{ID: "web:t", VIP: netip.MustParseAddr("10.50.0.100"), Backends: []netip.Addr{b.IP},
			Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080, NodePort: 30080}, {Proto: 17, Port: 53, TargetPort: 5353, NodePort: 30053}}}
		if err := d.UpsertService(ctx, svc); err != nil {
			t.Fatal(err)
		}
		peers, stop := acceptFrom(t, b.NetNS, "10.50.0.3:8080")
		defer stop()
		// From outside, to the host's address: the backend sees the client's own address.
		if err := dialFrom(w.ext, 0, ewHostIP+":30080"); err != nil {
			t.Fatal(err)
		}
		if p := <-peers; !strings.HasPrefix(p, ewExtIP+":") {
			t.Errorf("backend saw %s, want the outside client %s", p, ewExtIP)
		}
		srv, err := conformance.StartUDPEcho(b.NetNS, "10.50.0.3", 5353)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		if from, err := conformance.UDPExchange(w.ext, ewHostIP+":30053", []byte("np"), time.Second); err != nil || from != ewHostIP+":30053" {
			t.Errorf("udp node port: answer from %q, %v; want it from %s:30053", from, err, ewHostIP)
		}
		// A port nobody serves is the host's (refused by its stack).
		if err := dialFrom(w.ext, 0, ewHostIP+":30081"); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("unserved node port: %v, want connection refused", err)
		}
		// The host's own processes: the VIP and the node port (socket LB, local backend).
		for _, addr := range []string{"10.50.0.100:80", ewHostIP + ":30080"} {
			if err := dialFrom(w.host, 0, addr); err != nil {
				t.Errorf("from the host to %s: %v", addr, err)
				continue
			}
			if p := <-peers; !strings.HasPrefix(p, ewHostIP+":") {
				t.Errorf("from the host to %s: backend saw %s", addr, p)
			}
		}
		// Processes of other namespaces are not this host's: the program leaves them alone.
		if err := dialFrom(w.ext, 0, "10.50.0.100:80"); err == nil {
			t.Error("a namespace that is not the host's reached the VIP")
		}
	})
	t.Run("underlay-cannot-reach-endpoints", func(t *testing.T) {
		// Even with forwarding on in the host, a packet from the wire for an endpoint
		// address is not routed to it around policy.
		nsRun(t, w.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		defer nsRun(t, w.host, "sysctl", "-qw", "net.ipv4.ip_forward=0")
		nsRun(t, w.ext, "ip", "route", "add", "10.50.0.0/24", "via", ewHostIP)
		before, _ := d.ReasonCounters()
		conformance.PingFails(t, w.ext, "10.50.0.3")
		after, _ := d.ReasonCounters()
		if after[DropUplinkToEndpoint].Packets == before[DropUplinkToEndpoint].Packets {
			t.Error("drop_uplink_to_endpoint did not count the attempt")
		}
	})
	t.Run("counters", func(t *testing.T) {
		rc, err := d.ReasonCounters()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []Reason{FwdHost, FwdEgress, FwdEgressReply, ICMPGatewayReply, DropHostNoRoute, FwdNodePort, FwdNodePortReply} {
			if rc[r].Packets == 0 {
				t.Errorf("%v never counted (%v)", r, rc)
			}
		}
	})
	t.Run("host-address-changes", func(t *testing.T) {
		nsRun(t, w.host, "ip", "addr", "add", "192.168.78.1/24", "dev", "up0")
		deadline := time.Now().Add(5 * time.Second)
		for {
			var v contivbpfCbHostIp
			unlock := d.lock(cEps, 0)
			err := d.objs.CbHostIps.Lookup(ip4(netip.MustParseAddr("192.168.78.1")), &v)
			unlock()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("new host address not in cb_host_ips after 5 s")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := dialFrom(b.NetNS, 0, "192.168.78.1:1"); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("dial to the new host address: %v, want connection refused (the host answered)", err)
		}
	})
	t.Run("tenant-subnet-on-the-underlay", func(t *testing.T) {
		// A tenant may choose any subnet: an endpoint on the host's own underlay network
		// gets no host route (the host's traffic to that address keeps its way).
		evil := dataplane.Network{ID: "evil.v", Encap: dataplane.EncapVXLAN, Tag: 79,
			Subnet: netip.MustParsePrefix("192.168.77.0/24"), Gateway: netip.MustParseAddr("192.168.77.254")}
		e := w.endpoint(t, evil, "e", ewExtIP) // the external router's address
		if err := d.UpsertNetwork(ctx, evil); err != nil {
			t.Fatal(err)
		}
		if err := d.UpsertEndpoint(ctx, e); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = d.DeleteEndpoint(ctx, e.ID) }()
		var v contivbpfCbHostRoute
		if err := d.objs.CbHostRoutes.Lookup(ip4(e.IP), &v); err == nil {
			t.Error("host route installed for an address on the underlay")
		}
		conformance.PingOK(t, w.host, ewExtIP, 3) // still the real router
	})
	t.Run("delete-endpoint", func(t *testing.T) {
		if err := d.DeleteEndpoint(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		var v contivbpfCbHostRoute
		if err := d.objs.CbHostRoutes.Lookup(ip4(a.IP), &v); err == nil {
			t.Error("host route entry of a deleted endpoint left behind")
		}
		// The next sync hands the address to the endpoint that still holds it.
		state.Endpoints = []dataplane.Endpoint{b, c}
		if err := d.Sync(ctx, state); err != nil {
			t.Fatal(err)
		}
		if err := dialFrom(c.NetNS, 0, ewHostIP+":1"); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("c to the host after a left: %v, want connection refused (the host answered)", err)
		}
	})
}

// TestEgressPortsAvoidOverlay: with egress NAT on, an egress port range holding the
// overlay's UDP port is refused (cb_overlay_in hands every UDP packet to that port to the
// vxlan device, so an egress flow on it would never see its replies); with egress off
// (no device holds the VTEP) the range does not matter.
func TestEgressPortsAvoidOverlay(t *testing.T) {
	w := newEgressWorld(t)
	pinBase := filepath.Join("/sys/fs/bpf", w.prefix)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	for _, tc := range []struct {
		ns       string
		min, max uint16
		bad      bool
	}{
		{w.host, 4000, 5000, true},
		{w.host, 4789, 4789, true},
		{w.host, 4790, 5000, false},
		{w.ext, 4000, 5000, false}, // egress off there: the VTEP is not its address
	} {
		d, err := New(context.Background(), dataplane.HostConfig{Host: "h", NetNS: tc.ns, VTEP: netip.MustParseAddr(ewHostIP)},
			Options{PinRoot: filepath.Join(pinBase, "h"), VXLANIf: "cbevx0", MapEntries: 1024, EgressPortMin: tc.min, EgressPortMax: tc.max})
		if err == nil {
			_ = d.Teardown(context.Background())
		}
		if tc.bad != (err != nil && strings.Contains(err.Error(), "vxlan port 4789")) {
			t.Errorf("ports %d-%d in %s: err %v", tc.min, tc.max, tc.ns, err)
		}
	}
}
