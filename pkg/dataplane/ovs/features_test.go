package ovs

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
)

// listen starts an echo server on ip:port inside ns.
func listen(t *testing.T, ns, addr string) {
	t.Helper()
	var ln net.Listener
	if err := nsexec.Run(nsPath(ns), func() (err error) { ln, err = net.Listen("tcp4", addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

// dial connects from ns to addr, sends a line and reads it back; it returns the local
// address of the connection's peer as seen by the client.
func dial(t *testing.T, ns, addr string) error {
	t.Helper()
	return nsexec.Run(nsPath(ns), func() error {
		c, err := net.DialTimeout("tcp4", addr, time.Second)
		if err != nil {
			return fmt.Errorf("dial %s from %s: %w", addr, ns, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return err
		}
		buf := make([]byte, 6)
		if _, err := io.ReadFull(c, buf); err != nil {
			return fmt.Errorf("read from %s: %w", addr, err)
		}
		return nil
	})
}

// TestVLANPolicyService: a VLAN network across two hosts over an uplink, an ingress
// policy (deny TCP setup, allow one port) and a service VIP balanced over a local and a
// remote backend.
func TestVLANPolicyService(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, h2 := twoHosts(t, id)
	up := "cbo-v" + id
	sh(t, "ip", "link", "add", up, "netns", h1.ns, "type", "veth", "peer", "name", up, "netns", h2.ns)
	h1.cfg.VLANIf, h2.cfg.VLANIf = up, up
	c1, c2, c3 := newNS(t, id, "c1"), newNS(t, id, "c2"), newNS(t, id, "c3")
	d1, d2 := newDriver(t, h1), newDriver(t, h2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	red := dataplane.Network{ID: "red.t1", Encap: dataplane.EncapVLAN, Tag: 100,
		Subnet: netip.MustParsePrefix("10.2.0.0/24"), Gateway: netip.MustParseAddr("10.2.0.254"), MTU: 1500}
	mk := func(id, ip, ns, hostIf string, epg uint16) dataplane.Endpoint {
		a := netip.MustParseAddr(ip)
		return dataplane.Endpoint{ID: id, NetworkID: red.ID, IP: a, MAC: dataplane.ContivMAC(a), EPGID: epg,
			HostIfName: hostIf, NetNS: nsPath(ns), IfName: "eth0"}
	}
	e1, e2, e3 := mk("r1", "10.2.0.1", c1, "cbr1"+id, 10), mk("r2", "10.2.0.2", c2, "cbr2"+id, 20), mk("r3", "10.2.0.3", c3, "cbr3"+id, 20)
	pol := dataplane.PolicySet{EPGID: 20, Rules: []dataplane.PolicyRule{
		{ID: "deny-tcp", Priority: 1, Ingress: true, Proto: 6, SynOnly: true, Action: dataplane.ActionDeny},
		{ID: "allow-8080", Priority: 5, Ingress: true, RemoteEPG: 10, Proto: 6, Port: 8080, Action: dataplane.ActionAllow},
	}}
	svc := dataplane.Service{ID: "web:t1", VIP: netip.MustParseAddr("10.2.0.100"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}, Backends: []netip.Addr{e2.IP, e3.IP}}
	rem := func(e dataplane.Endpoint, host string) dataplane.RemoteEndpoint {
		return dataplane.RemoteEndpoint{ID: e.ID, NetworkID: e.NetworkID, IP: e.IP, MAC: e.MAC, EPGID: e.EPGID, Host: host}
	}
	if err := d1.Sync(ctx, dataplane.State{Networks: []dataplane.Network{red}, Endpoints: []dataplane.Endpoint{e1, e2},
		RemoteEndpoints: []dataplane.RemoteEndpoint{rem(e3, "h2")}, Policies: []dataplane.PolicySet{pol},
		Services: []dataplane.Service{svc}}); err != nil {
		t.Fatalf("sync h1: %v", err)
	}
	if err := d2.Sync(ctx, dataplane.State{Networks: []dataplane.Network{red}, Endpoints: []dataplane.Endpoint{e3},
		RemoteEndpoints: []dataplane.RemoteEndpoint{rem(e1, "h1"), rem(e2, "h1")}, Policies: []dataplane.PolicySet{pol},
		Services: []dataplane.Service{svc}}); err != nil {
		t.Fatalf("sync h2: %v", err)
	}
	// Tagged frames on the uplink.
	eventually(t, 3*time.Second, func() error { return ping(c1, "10.2.0.3") })
	if err := ping(c1, "10.2.0.2"); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{c2, c3} {
		listen(t, ns, "0.0.0.0:8080")
		listen(t, ns, "0.0.0.0:9090")
	}
	if err := dial(t, c1, "10.2.0.3:8080"); err != nil {
		t.Fatalf("allowed port across VLAN: %v", err)
	}
	if err := dial(t, c1, "10.2.0.2:8080"); err != nil {
		t.Fatalf("allowed port same host: %v", err)
	}
	if err := dial(t, c1, "10.2.0.2:9090"); err == nil {
		t.Fatal("denied port 9090 same host: connected")
	}
	if err := dial(t, c1, "10.2.0.3:9090"); err == nil {
		t.Fatal("denied port 9090 across hosts: connected")
	}
	// Service: every connection to the VIP reaches a backend.
	for i := 0; i < 6; i++ {
		if err := dial(t, c1, "10.2.0.100:80"); err != nil {
			t.Fatalf("service connection %d: %v", i, err)
		}
	}
	_ = ping(c1, "10.2.0.254") // nothing answers ICMP for the gateway, but ARP must resolve
	if neigh := sh(t, "ip", "-n", c1, "neigh", "show", "10.2.0.254"); !strings.Contains(neigh, dataplane.RouterMAC.String()) {
		t.Fatalf("gateway neighbour = %q, want router MAC", neigh)
	}
	if neigh := sh(t, "ip", "-n", c1, "neigh", "show", "10.2.0.100"); !strings.Contains(neigh, dataplane.ContivMAC(svc.VIP).String()) {
		t.Fatalf("VIP neighbour = %q, want %s", neigh, dataplane.ContivMAC(svc.VIP))
	}
	// Deleting the policy opens 9090.
	if err := d1.DeletePolicy(ctx, 20); err != nil {
		t.Fatal(err)
	}
	delStart := time.Now()
	eventually(t, 3*time.Second, func() error { return dial(t, c1, "10.2.0.2:9090") })
	t.Logf("port open %v after policy delete", time.Since(delStart))
	if err := dial(t, c1, "10.2.0.2:9090"); err != nil {
		out, _ := exec.Command("ovs-appctl", "-t", h1.dir+"/ovs-vswitchd.ctl", "dpctl/dump-conntrack").CombinedOutput()
		o2, _ := exec.Command("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "unix:"+h1.dir+"/contivbr.mgmt", "table=50").CombinedOutput()
		out = append(out, o2...)
		t.Fatalf("after policy delete: %v\n%s", err, out)
	}
	st, err := d1.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("h1 flows: %v, groups %v", st.Tables["flows"], st.Counters["groups"])
}
