package ovs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/nsexec"
	"github.com/contivbpf/contivbpf/pkg/testroot"
	"github.com/prometheus/client_golang/prometheus"
)

// needOVS skips the test when not root (network namespaces, a private OVS) and fails it
// when OVS is not installed.
func needOVS(t testing.TB) {
	t.Helper()
	testroot.Need(t)
	if _, err := exec.LookPath("ovs-vswitchd"); err != nil {
		// As root (CI) a missing OVS is a broken install, not a reason to skip.
		t.Fatal("ovs-vswitchd not installed (make test installs openvswitch-switch)")
	}
}

func sh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newNS creates a named network namespace cbo-<id>-<name>, removed at cleanup.
func newNS(t testing.TB, id, name string) string {
	t.Helper()
	n := "cbo-" + id + "-" + name
	sh(t, "ip", "netns", "add", n)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	sh(t, "ip", "-n", n, "link", "set", "lo", "up")
	return n
}

func nsPath(n string) string { return "/run/netns/" + n }

func testID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func ping(ns, ip string) error {
	out, err := exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1", ip).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ping %s from %s: %v: %s", ip, ns, err, out)
	}
	return nil
}

// eventually retries fn for up to d.
func eventually(t *testing.T, d time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tcpEcho listens on addr inside srvNS and checks that a client in cliNS gets its bytes back.
func tcpEcho(t *testing.T, srvNS, cliNS, ip string) error {
	t.Helper()
	var ln net.Listener
	if err := nsexec.Run(nsPath(srvNS), func() (err error) { ln, err = net.Listen("tcp4", ip+":0"); return }); err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	payload := strings.Repeat("contivbpf-ovs ", 20000) // several MSS: checksums must be right
	return nsexec.Run(nsPath(cliNS), func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 2*time.Second)
		if err != nil {
			return fmt.Errorf("dial %s: %w", ln.Addr(), err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		go func() { _, _ = c.Write([]byte(payload)) }()
		buf := make([]byte, len(payload))
		if _, err := io.ReadFull(c, buf); err != nil {
			return fmt.Errorf("echo from %s: %w", ln.Addr(), err)
		}
		if string(buf) != payload {
			return fmt.Errorf("echo from %s: payload differs", ln.Addr())
		}
		return nil
	})
}

type testHost struct {
	ns  string
	cfg dataplane.HostConfig
	dir string
}

// twoHosts builds two host namespaces joined by a veth wire with VTEPs 192.168.77.1/2.
func twoHosts(t *testing.T, id string) (h1, h2 testHost) {
	n1, n2 := newNS(t, id, "h1"), newNS(t, id, "h2")
	sh(t, "ip", "link", "add", "cbo-w"+id, "netns", n1, "type", "veth", "peer", "name", "cbo-w"+id, "netns", n2)
	sh(t, "ip", "-n", n1, "addr", "add", "192.168.77.1/24", "dev", "cbo-w"+id)
	sh(t, "ip", "-n", n2, "addr", "add", "192.168.77.2/24", "dev", "cbo-w"+id)
	sh(t, "ip", "-n", n1, "link", "set", "cbo-w"+id, "up")
	sh(t, "ip", "-n", n2, "link", "set", "cbo-w"+id, "up")
	mk := func(ns, host, vtep string) testHost {
		dir, err := os.MkdirTemp("", "cbo-ovs-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_ = Private{Dir: dir}.Stop(ctx)
			os.RemoveAll(dir)
		})
		return testHost{ns: ns, dir: dir, cfg: dataplane.HostConfig{Host: host, NetNS: nsPath(ns), VTEP: netip.MustParseAddr(vtep)}}
	}
	return mk(n1, "h1", "192.168.77.1"), mk(n2, "h2", "192.168.77.2")
}

// oneHost is host namespace cbo-<id>-h1 ("h1", no VTEP) with a private OVS directory; the
// instance is stopped and the directory removed at cleanup.
func oneHost(t *testing.T, id string) testHost {
	t.Helper()
	h := testHost{ns: newNS(t, id, "h1")}
	h.cfg = dataplane.HostConfig{Host: "h1", NetNS: nsPath(h.ns)}
	dir, err := os.MkdirTemp("", "cbo-ovs-")
	if err != nil {
		t.Fatal(err)
	}
	h.dir = dir
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = Private{Dir: dir}.Stop(ctx)
		os.RemoveAll(dir)
	})
	return h
}

func newDriver(t *testing.T, h testHost) *Driver {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := New(ctx, h.cfg, Options{Dir: h.dir})
	if err != nil {
		t.Fatalf("new driver for %s: %v", h.cfg.Host, err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

var vxNet = dataplane.Network{ID: "blue.default", Encap: dataplane.EncapVXLAN, Tag: 5000,
	Subnet: netip.MustParsePrefix("10.1.0.0/24"), Gateway: netip.MustParseAddr("10.1.0.254"), MTU: 1450}

func ep(id, ip, ns, hostIf string) dataplane.Endpoint {
	a := netip.MustParseAddr(ip)
	return dataplane.Endpoint{ID: id, NetworkID: vxNet.ID, IP: a, MAC: dataplane.ContivMAC(a),
		HostIfName: hostIf, NetNS: nsPath(ns), IfName: "eth0"}
}

func remote(e dataplane.Endpoint, h testHost) dataplane.RemoteEndpoint {
	return dataplane.RemoteEndpoint{ID: e.ID, NetworkID: e.NetworkID, IP: e.IP, MAC: e.MAC, EPGID: e.EPGID,
		Host: h.cfg.Host, VTEP: h.cfg.VTEP}
}

// TestSameHostAndVXLAN: two containers on h1, one on h2; ping and TCP within a host and
// across the VXLAN tunnel; then vswitchd restart is repaired and a driver restart keeps
// flows.
func TestSameHostAndVXLAN(t *testing.T) {
	needOVS(t)
	id := testID()
	h1, h2 := twoHosts(t, id)
	c1, c2, c3 := newNS(t, id, "c1"), newNS(t, id, "c2"), newNS(t, id, "c3")
	start := time.Now()
	d1, d2 := newDriver(t, h1), newDriver(t, h2)
	t.Logf("two drivers with private OVS up in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	e1, e2, e3 := ep("e1", "10.1.0.1", c1, "cbo1"+id), ep("e2", "10.1.0.2", c2, "cbo2"+id), ep("e3", "10.1.0.3", c3, "cbo3"+id)
	s1 := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e1, e2},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e3, h2)}, Peers: []dataplane.Peer{{Host: "h2", VTEP: h2.cfg.VTEP}}}
	s2 := dataplane.State{Networks: []dataplane.Network{vxNet}, Endpoints: []dataplane.Endpoint{e3},
		RemoteEndpoints: []dataplane.RemoteEndpoint{remote(e1, h1), remote(e2, h1)}, Peers: []dataplane.Peer{{Host: "h1", VTEP: h1.cfg.VTEP}}}
	// A remote endpoint without a VTEP on a VXLAN network is refused by name; the rest
	// of the state is applied (e3 is reachable below).
	bad := remote(ep("bad", "10.1.0.66", c3, "cbo6"+id), h2)
	bad.VTEP = netip.Addr{}
	withBad := s1
	withBad.RemoteEndpoints = append([]dataplane.RemoteEndpoint{bad}, s1.RemoteEndpoints...)
	start = time.Now()
	if err := d1.Sync(ctx, withBad); err == nil || !strings.Contains(err.Error(), "remote endpoint bad") {
		t.Fatalf("sync h1 with a bad remote: err = %v, want one naming remote endpoint bad", err)
	}
	if err := d1.UpsertRemoteEndpoint(ctx, bad); err == nil {
		t.Fatal("upsert of a vxlan remote without vtep accepted")
	}
	if err := d2.Sync(ctx, s2); err != nil {
		t.Fatalf("sync h2: %v", err)
	}
	t.Logf("both syncs in %v", time.Since(start))

	if err := ping(c1, "10.1.0.2"); err != nil {
		t.Fatalf("same host: %v", err)
	}
	if err := tcpEcho(t, c2, c1, "10.1.0.2"); err != nil {
		t.Fatalf("same host tcp: %v", err)
	}
	eventually(t, 3*time.Second, func() error { return ping(c1, "10.1.0.3") })
	if err := tcpEcho(t, c3, c1, "10.1.0.3"); err != nil {
		t.Fatalf("vxlan tcp: %v", err)
	}
	if err := tcpEcho(t, c1, c3, "10.1.0.1"); err != nil {
		t.Fatalf("vxlan tcp reverse: %v", err)
	}
	// Proxy ARP: the container learned the peer's Contiv MAC without any ARP on the wire.
	neigh := sh(t, "ip", "-n", c1, "neigh", "show", "10.1.0.3")
	if !strings.Contains(neigh, e3.MAC.String()) {
		t.Fatalf("neighbour of 10.1.0.3 in c1 = %q, want %s", neigh, e3.MAC)
	}

	// Conntrack metrics (the eBPF backend's names): the connections above are tracked.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(d1.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if got["contiv_datapath_ct_entries"] < 1 || got["contiv_datapath_ct_capacity"] < 1000 || got["contiv_datapath_scrape_errors"] != 0 {
		t.Fatalf("conntrack metrics %v", got)
	}

	st, err := d1.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	flows := st.Tables["flows"].(map[string]int)
	if flows["classifier"] == 0 || flows["output"] == 0 {
		t.Fatalf("status flows = %v", flows)
	}
	t.Logf("h1 flows per table: %v", flows)

	// vswitchd restart: flows vanish; the driver notices and reinstalls.
	priv := Private{Dir: h1.dir, NetNS: h1.cfg.NetNS}
	if err := priv.StopVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := priv.StartVswitchd(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	want := len(d1.comp.flows)
	eventually(t, 2*time.Second, func() error {
		c, err := dialOF(ctx, filepath.Join(h1.dir, "contivbr.mgmt"), nil)
		if err != nil {
			return err
		}
		defer c.Close()
		stats, err := c.flowStats(ctx, cookieOwner, cookieOwnerMask)
		if err != nil {
			return err
		}
		if len(stats) < want {
			return fmt.Errorf("%d of %d flows back after vswitchd restart", len(stats), want)
		}
		return nil
	})
	t.Logf("all %d flows reinstalled %v after vswitchd restart", want, time.Since(restarted))
	eventually(t, 5*time.Second, func() error { return ping(c1, "10.1.0.3") })
	t.Logf("cross-host ping back %v after vswitchd restart", time.Since(restarted))
	if err := tcpEcho(t, c3, c1, "10.1.0.3"); err != nil {
		t.Fatalf("vxlan tcp after vswitchd restart: %v", err)
	}

	// Driver restart: Close leaves flows; a new driver + Sync keeps traffic flowing and
	// sweeps only the old generation.
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ping(c1, "10.1.0.2"); err != nil {
		t.Fatalf("no driver running: %v", err)
	}
	d1 = newDriver(t, h1)
	if err := ping(c1, "10.1.0.3"); err != nil {
		t.Fatalf("after new driver, before sync: %v", err)
	}
	if err := d1.Sync(ctx, s1); err != nil {
		t.Fatalf("resync: %v", err)
	}
	if err := ping(c1, "10.1.0.3"); err != nil {
		t.Fatalf("after resync: %v", err)
	}
	stats, err := d1.conn.flowStats(ctx, cookieOwner, cookieOwnerMask)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if s.Cookie != cookieFor(d1.gen) {
			t.Fatalf("stale cookie %#x survived resync (generation %d)", s.Cookie, d1.gen)
		}
	}

	// Incremental delete: e2 goes, its veth and flows with it.
	if err := d1.DeleteEndpoint(ctx, "e2"); err != nil {
		t.Fatal(err)
	}
	if err := ping(c1, "10.1.0.2"); err == nil {
		t.Fatal("ping to deleted endpoint still works")
	}
	start = time.Now()
	if err := d1.Teardown(ctx); err != nil {
		t.Fatalf("teardown h1: %v", err)
	}
	if err := d2.Teardown(ctx); err != nil {
		t.Fatalf("teardown h2: %v", err)
	}
	t.Logf("both teardowns in %v", time.Since(start))
	if out := sh(t, "ip", "-n", h1.ns, "addr", "show", "cbo-w"+id); !strings.Contains(out, "192.168.77.1/24") {
		t.Fatalf("VTEP address not restored on the wire: %s", out)
	}
}
