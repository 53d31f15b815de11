package netbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == WireGuardChildArg {
		os.Exit(WireGuardChild(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func prefix() string { return fmt.Sprintf("cbb%d", os.Getpid()%100000) }

// The probes must measure a real path: echo round trips, connections and bulk data.
func TestProbesOverVethPair(t *testing.T) {
	testroot.Need(t)
	topo, err := VethPair(prefix()+"v", 1500)
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	a, b := topo.Namespaces[0], topo.Namespaces[1]
	srv, err := StartServer(NSPath(b), "10.199.0.2:5201")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	d := NewDialer(NSPath(a))
	c, err := d.Dial("10.199.0.2:5201")
	if err != nil {
		t.Fatal(err)
	}
	samples, err := RR(c, 200, 64)
	c.Close()
	if err != nil || len(samples) != 200 {
		t.Fatalf("rr: %d samples, %v", len(samples), err)
	}
	if p50 := Percentile(samples, 50); p50 <= 0 || p50 > time.Second {
		t.Fatalf("p50 = %v", p50)
	}
	rate, err := CRR(context.Background(), d, "10.199.0.2:5201", 300*time.Millisecond)
	if err != nil || rate <= 0 {
		t.Fatalf("crr = %v, %v", rate, err)
	}
	gbps, err := Iperf3(context.Background(), b, a, "10.199.0.2", 5299, 1)
	if err != nil || gbps <= 0 {
		t.Fatalf("iperf3 = %v, %v", gbps, err)
	}
	t.Logf("veth pair: rr p50 %v, crr %.0f/s, iperf3 %.2f Gbit/s", Percentile(samples, 50), rate, gbps)
}

// A dial to an address nobody serves must fail rather than report a rate.
func TestCRRFailsWithoutServer(t *testing.T) {
	testroot.Need(t)
	topo, err := VethPair(prefix()+"f", 1500)
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	if _, err := CRR(context.Background(), NewDialer(NSPath(topo.Namespaces[0])), "10.199.0.2:1", 100*time.Millisecond); err == nil {
		t.Fatal("crr against a closed port succeeded")
	}
}

func TestBridgeVXLANBaseline(t *testing.T) {
	testroot.Need(t)
	topo, err := BridgeVXLAN(prefix() + "x")
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	out, err := Run(topo.Namespaces[2], "ping", "-c", "2", "-W", "2", "10.197.0.2")
	if err != nil {
		t.Fatalf("ping across kernel vxlan: %v\n%s", err, out)
	}
}

func TestMasqueradeBaseline(t *testing.T) {
	testroot.Need(t)
	topo, err := Masquerade(prefix()+"m", 1450)
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	srv, err := StartServer(NSPath(topo.Namespaces[3]), MasqServerIP+":7071")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := NewDialer(NSPath(topo.Namespaces[0])).Dial(MasqServerIP + ":7071")
	if err != nil {
		t.Fatalf("through the kernel MASQUERADE router: %v", err)
	}
	defer conn.Close()
	if _, err := RR(conn, 3, 64); err != nil {
		t.Fatal(err)
	}
}

// TestKubeProxyBaseline: the kube-proxy-style router DNATs each installed VIP to the
// server, and a VIP it does not hold (after the rule set shrank) reaches nothing.
func TestKubeProxyBaseline(t *testing.T) {
	testroot.Need(t)
	kp, err := NewKubeProxy(prefix()+"k", 1450, 80, 7072)
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Close()
	srv, err := StartServer(NSPath(kp.Namespaces[3]), MasqServerIP+":7072")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := kp.SetServices(300); err != nil {
		t.Fatal(err)
	}
	d := NewDialer(NSPath(kp.Namespaces[0]))
	for _, i := range []int{0, 150, 299} {
		if n, err := CRR(context.Background(), d, KubeProxyVIP(i)+":80", 100*time.Millisecond); err != nil || n == 0 {
			t.Fatalf("service %d (%s): %v conn/s, %v", i, KubeProxyVIP(i), n, err)
		}
	}
	if err := kp.SetServices(100); err != nil {
		t.Fatal(err)
	}
	if c, err := d.Dial(KubeProxyVIP(150) + ":80"); err == nil {
		c.Close()
		t.Fatalf("service 150 answered after the rule set shrank to 100")
	}
}

// TestWireGuardBaseline: the tunnel addresses reach each other through the WireGuard
// devices (their tx counters carry the pings), and nothing is left behind.
func TestWireGuardBaseline(t *testing.T) {
	testroot.Need(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wg, err := WireGuardPair(context.Background(), prefix()+"g", self)
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	ns1, dev1 := wg.Namespaces[0], wg.Devices[0]
	before, err := TxBytes(ns1, dev1)
	if err != nil {
		t.Fatal(err)
	}
	// The first ping waits for the handshake.
	if out, err := Run(ns1, "ping", "-c", "3", "-i", "0.2", "-W", "5", WGTunnel2); err != nil {
		t.Fatalf("ping across the WireGuard pair: %v\n%s", err, out)
	}
	after, err := TxBytes(ns1, dev1)
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 3*84 {
		t.Fatalf("%s sent %d bytes for 3 pings: the pings did not go through WireGuard", dev1, after-before)
	}
	wg.Close()
	if _, err := os.Stat("/var/run/wireguard/" + dev1 + ".sock"); !os.IsNotExist(err) {
		t.Errorf("control socket of %s left behind: %v", dev1, err)
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil || strings.Contains(string(out), ns1) {
		t.Errorf("namespace %s left behind: %v\n%s", ns1, err, out)
	}
}
