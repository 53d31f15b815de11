package ebpf

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestNodePortTwoHosts: two hosts and the external namespace on one bridge; a service
// whose only backend is on host 2 is reached from outside at host 1's node port (through
// the overlay, the backend sees host 1's address) and at host 2's (locally, the backend
// sees the client).
func TestNodePortTwoHosts(t *testing.T) {
	testroot.Need(t)
	p := conformance.Prefix()
	br := conformance.NewNetNS(t, p+"-br")
	ext := conformance.NewNetNS(t, p+"-x")
	h1 := conformance.NewNetNS(t, p+"-h1")
	h2 := conformance.NewNetNS(t, p+"-h2")
	nsRun(t, br, "ip", "link", "add", "br0", "type", "bridge")
	nsRun(t, br, "ip", "link", "set", "br0", "up")
	addrs := map[string]string{h1: "192.168.78.1", h2: "192.168.78.3", ext: "192.168.78.2"}
	for i, ns := range []string{h1, h2, ext} {
		port := p + string(rune('a'+i))
		if out, err := exec.Command("ip", "link", "add", port+"u", "netns", filepath.Base(ns), "type", "veth", "peer", "name", port, "netns", p+"-br").CombinedOutput(); err != nil {
			t.Fatalf("wire: %v: %s", err, out)
		}
		nsRun(t, br, "ip", "link", "set", port, "master", "br0", "up")
		nsRun(t, ns, "ip", "link", "set", port+"u", "name", "up0")
		nsRun(t, ns, "ip", "addr", "add", addrs[ns]+"/24", "dev", "up0")
		nsRun(t, ns, "ip", "link", "set", "up0", "up")
	}
	pinBase := filepath.Join("/sys/fs/bpf", p)
	t.Cleanup(func() { _ = os.RemoveAll(pinBase) })
	ctx := context.Background()
	drv := map[string]*Driver{}
	for name, ns := range map[string]string{"h1": h1, "h2": h2} {
		d, err := New(ctx, dataplane.HostConfig{Host: name, NetNS: ns, VTEP: netip.MustParseAddr(addrs[ns])},
			Options{PinRoot: filepath.Join(pinBase, name), VXLANIf: "cbevx0", MapEntries: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Teardown(context.Background()) })
		drv[name] = d
	}
	red := dataplane.Network{ID: "red.t", Encap: dataplane.EncapVXLAN, Tag: 77,
		Subnet: netip.MustParsePrefix("10.50.0.0/24"), Gateway: netip.MustParseAddr("10.50.0.1")}
	ba := netip.MustParseAddr("10.50.0.3")
	b := dataplane.Endpoint{ID: "red.t-b", NetworkID: red.ID, IP: ba, MAC: dataplane.ContivMAC(ba),
		HostIfName: p + "b", IfName: "eth0", NetNS: conformance.NewNetNS(t, p+"-b")}
	svc := dataplane.Service{ID: "web:t", VIP: netip.MustParseAddr("10.50.0.100"), Backends: []netip.Addr{ba},
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080, NodePort: 30080}, {Proto: 17, Port: 53, TargetPort: 5353, NodePort: 30053},
			{Proto: 17, Port: 54, TargetPort: 5354, NodePort: 30054}}}
	empty := dataplane.Service{ID: "empty:t", VIP: netip.MustParseAddr("10.50.0.101"),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080, NodePort: 30081}}}
	if err := drv["h1"].Sync(ctx, dataplane.State{Networks: []dataplane.Network{red},
		RemoteEndpoints: []dataplane.RemoteEndpoint{{ID: b.ID, NetworkID: red.ID, IP: ba, MAC: b.MAC, VTEP: netip.MustParseAddr(addrs[h2]), Host: "h2"}},
		Peers:           []dataplane.Peer{{Host: "h2", VTEP: netip.MustParseAddr(addrs[h2])}}, Services: []dataplane.Service{svc, empty}}); err != nil {
		t.Fatal(err)
	}
	if err := drv["h2"].Sync(ctx, dataplane.State{Networks: []dataplane.Network{red}, Endpoints: []dataplane.Endpoint{b},
		Peers: []dataplane.Peer{{Host: "h1", VTEP: netip.MustParseAddr(addrs[h1])}}, Services: []dataplane.Service{svc, empty}}); err != nil {
		t.Fatal(err)
	}
	peers, stop := acceptFrom(t, b.NetNS, "10.50.0.3:8080")
	defer stop()
	for _, tc := range []struct{ host, wantPeer string }{
		{addrs[h1], addrs[h1]},  // remote backend: from host 1's address
		{addrs[h2], addrs[ext]}, // local backend: the client itself
	} {
		if err := dialFrom(ext, 0, tc.host+":30080"); err != nil {
			t.Fatalf("node port on %s: %v", tc.host, err)
		}
		if got := <-peers; !strings.HasPrefix(got, tc.wantPeer+":") {
			t.Errorf("node port on %s: backend saw %s, want %s", tc.host, got, tc.wantPeer)
		}
	}
	// Nothing listens on the backend's UDP 5353: its port unreachable reaches the client
	// as the node port's (from host 2's address, quoting what the client sent).
	if err := conformance.RefusedUDP(ext, addrs[h2]+":30053"); err != nil {
		t.Errorf("UDP node port without a listener: %v", err)
	}
	// A datagram larger than the MTU both ways through a node port with a local backend:
	// the later fragments follow the first ones.
	echo, err := conformance.StartUDPEcho(b.NetNS, ba.String(), 5354)
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	if from, err := conformance.UDPExchange(ext, addrs[h2]+":30054", bytes.Repeat([]byte("node-port-fragments-"), 200), 2*time.Second); err != nil {
		t.Errorf("4,000-byte datagram through the node port: %v", err)
	} else if from != addrs[h2]+":30054" {
		t.Errorf("large datagram's echo from %s, want the node port", from)
	}
	// Host 1's own processes: the service has no backend on host 1, so the connect fails
	// at once (EPERM) instead of going anywhere else.
	if err := dialFrom(h1, 0, "10.50.0.100:80"); err == nil || !strings.Contains(err.Error(), "not permitted") {
		t.Errorf("from host 1 to the VIP: %v, want operation not permitted", err)
	}
	if err := dialFrom(h2, 0, "10.50.0.100:80"); err != nil {
		t.Errorf("from host 2 to the VIP: %v", err)
	} else if got := <-peers; !strings.HasPrefix(got, addrs[h2]+":") {
		t.Errorf("from host 2: backend saw %s", got)
	}
	// A node port of a service without backends refuses at once: ICMP port unreachable
	// from host 1's address (counted as reject_no_backend, not the host stack's RST).
	start := time.Now()
	if err := dialFrom(ext, 0, addrs[h1]+":30081"); err == nil || !strings.Contains(err.Error(), "refused") || time.Since(start) > 900*time.Millisecond {
		t.Errorf("node port without backends: %v after %v, want connection refused at once", err, time.Since(start))
	}
	rc, err := drv["h1"].ReasonCounters()
	if err != nil {
		t.Fatal(err)
	}
	if rc[RejectNoBackend].Packets != 1 {
		t.Errorf("host 1 counters %v: want one reject_no_backend", rc)
	}
	if rc[FwdNodePortReply].Packets == 0 || rc[FwdTunnel].Packets == 0 {
		t.Errorf("host 1 counters %v: want node port replies back through the tunnel", rc)
	}
}
