package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRestartWhilePeerDown: host 2's netplugin dies and its registration lease (2 s here)
// runs out; then host 1's netplugin restarts. Host 1 never saw host 2 registered in this
// life, yet its first Sync must keep host 2's peer and remote endpoints (from host 2's
// durable VTEP record): traffic a→b, still forwarded by host 2's agentless datapath,
// must not lose a packet.
func TestRestartWhilePeerDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 2, PluginArgs: func(*Cluster, *Host) []string {
		return []string{"--service-ttl", "2s"}
	}})
	h1, h2 := c.Hosts[0], c.Hosts[1]
	if err := c.CreateNetwork(ctx, "default", "pd-net", "vxlan", "10.105.1.0/24", "10.105.1.1"); err != nil {
		t.Fatal(err)
	}
	a, err := c.AddContainer(ctx, h1, "a", "default", "pd-net")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AddContainer(ctx, h2, "b", "default", "pd-net")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "cross-host ping", 10*time.Second, func() error {
		out, err := a.Ping(ctx, b.IP.Addr(), 1)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	p := startPing(t, a, b)
	c.KillPlugin(h2)
	// Wait until h2's registrations are gone from etcd.
	eventually(t, "h2's netplugin.vtep registration expires", 15*time.Second, func() error {
		out, err := Exec(ctx, h1.Name, "etcdctl", "--endpoints", c.EtcdURL(), "get", "--prefix", "--keys-only", "/contiv.io/service/netplugin.vtep/")
		if err != nil {
			return fmt.Errorf("etcdctl: %v %s", err, out)
		}
		if strings.Contains(out, h2.IP.String()+":") {
			return fmt.Errorf("still registered: %s", out)
		}
		return nil
	})
	c.KillPlugin(h1)
	if err := c.StartPlugin(ctx, h1); err != nil {
		t.Fatal(err)
	}
	if err := h1.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	sent, lost, summary, err := p.stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a→b while h2's agent was down and h1's restarted: %s", summary)
	if sent < 100 || len(lost) != 0 {
		t.Fatalf("ping a→b: %d sent, lost sequence numbers %v (%s)", sent, lost, summary)
	}
	var peers []struct{ Host, VTEP string }
	if err := h1.InspectGet(ctx, "/inspect/peers", &peers); err != nil {
		t.Fatal(err)
	}
	if len(peers) != 1 || peers[0].Host != h2.Name || peers[0].VTEP != h2.IP.String() {
		t.Errorf("h1 peers after restart = %+v, want %s at %s", peers, h2.Name, h2.IP)
	}
	var eps endpoints
	if err := h1.InspectGet(ctx, "/inspect/endpoints", &eps); err != nil {
		t.Fatal(err)
	}
	if len(eps.Remote) != 1 || eps.Remote[0].VTEP != h2.IP.String() {
		t.Errorf("h1 remote endpoints after restart = %+v", eps.Remote)
	}
	if err := a.TCPCheck(ctx, b, 5011); err != nil {
		t.Fatal(err)
	}
}
