package sim

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/agent"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestBGPWithFRR is route distribution against a real router: FRR (Debian's zebra + bgpd)
// as the top-of-rack router of two hosts, each on its own link to it. With a bgp object
// per host (Contiv's `netctl bgp create`), each netplugin peers with FRR, advertises its
// endpoints' /32s of a routing-mode VLAN network and routes natively by what it learns:
// containers on the two hosts reach each other through FRR, untagged and without VXLAN.
// Deleting a container withdraws its route; a host that hangs (its netplugin SIGSTOPped,
// its session silent) loses its routes within the hold time; a bgp object's deletion
// stops the session and removes the router-ip.
func TestBGPWithFRR(t *testing.T) {
	testroot.Need(t)
	if !FRRInstalled() {
		t.Fatalf("%s/bgpd is missing: make test installs Debian's frr (scripts/deps.sh)", FRRDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const hold = 3 * time.Second
	c := startCluster(t, ctx, Config{Hosts: 2, BGPRouter: true,
		PluginArgs: func(*Cluster, *Host) []string { return []string{"--bgp-hold-time", hold.String()} }})
	if err := c.StartFRR(ctx, hold); err != nil {
		t.Fatal(err)
	}
	h1, h2 := c.Hosts[0], c.Hosts[1]
	if err := c.CreateTaggedNetwork(ctx, "default", "bgp-net", "vlan", 200, "10.66.1.0/24", "10.66.1.1"); err != nil {
		t.Fatal(err)
	}
	for _, h := range c.Hosts {
		l := c.Router.Links[h.Name]
		out, err := c.Netctl(ctx, "bgp", "create", h.Name, "--router-ip", l.RouterIP.String(),
			"--as", fmt.Sprint(l.HostAS), "--neighbor-as", fmt.Sprint(RouterASN), "--neighbor", l.Neighbor.String())
		if err != nil {
			t.Fatalf("netctl bgp create %s: %v\n%s", h.Name, err, out)
		}
	}
	a, err := c.AddContainer(ctx, h1, "a", "default", "bgp-net")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AddContainer(ctx, h2, "b", "default", "bgp-net")
	if err != nil {
		t.Fatal(err)
	}
	host32 := func(ct *Container) string { return netip.PrefixFrom(ct.IP.Addr(), 32).String() }
	waitRoutes(ctx, t, h1, "h1 learns b", func(s agent.BGPStatus) bool {
		return s.NeighborStatus == "established" && hasRoute(s, host32(b)) && slices.Contains(s.AdvertisedRoutes, host32(a))
	})
	waitRoutes(ctx, t, h2, "h2 learns a", func(s agent.BGPStatus) bool {
		return s.NeighborStatus == "established" && hasRoute(s, host32(a))
	})

	t.Run("through-frr", func(t *testing.T) {
		if out, err := a.Ping(ctx, b.IP.Addr(), 3); err != nil {
			t.Fatalf("a → b across hosts by BGP routes: %v\n%s", err, out)
		}
		if err := a.TCPCheck(ctx, b, 5201); err != nil {
			t.Fatalf("tcp a → b: %v", err)
		}
		// FRR holds both endpoint routes (installed by zebra in the router's kernel).
		routes, err := c.Router.Routes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ct := range []*Container{a, b} {
			if !strings.Contains(routes, ct.IP.Addr().String()+" ") {
				t.Errorf("router kernel lacks %v:\n%s", ct.IP.Addr(), routes)
			}
		}
		// The packets were routed natively (no tunnel, no tag): the datapath counted them.
		m, err := h1.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for reason, want := range map[string]bool{"fwd_native": true, "fwd_tunnel": false, "fwd_uplink": false} {
			v := regexp.MustCompile(`contiv_datapath_packets_total\{drop="false",reason="` + reason + `"\} ([0-9.e+]+)`).FindStringSubmatch(m)
			got := v != nil && v[1] != "0"
			if got != want {
				t.Errorf("h1 counter %s = %v, want non-zero %v", reason, v, want)
			}
		}
		out, err := c.Netctl(ctx, "bpf", "routes", "--agent", "http://"+h1.Inspect)
		if err != nil || !strings.Contains(out, host32(b)) || !strings.Contains(out, c.Router.Links[h1.Name].Neighbor.String()) {
			t.Errorf("netctl bpf routes on %s: %v\n%s", h1.Name, err, out)
		}
		// netctl bgp inspect shows the session (Contiv's Oper fields).
		out, err = c.Netctl(ctx, "bgp", "inspect", h1.Name)
		if err != nil || !strings.Contains(out, `"neighborStatus": "established"`) || !strings.Contains(out, host32(b)) {
			t.Errorf("netctl bgp inspect %s: %v\n%s", h1.Name, err, out)
		}
	})

	t.Run("withdraw-on-endpoint-delete", func(t *testing.T) {
		b2, err := c.AddContainer(ctx, h2, "b2", "default", "bgp-net")
		if err != nil {
			t.Fatal(err)
		}
		waitRoutes(ctx, t, h1, "h1 learns b2", func(s agent.BGPStatus) bool { return hasRoute(s, host32(b2)) })
		if err := c.RemoveContainer(ctx, b2); err != nil {
			t.Fatal(err)
		}
		waitRoutes(ctx, t, h1, "h1 forgets b2", func(s agent.BGPStatus) bool { return !hasRoute(s, host32(b2)) && hasRoute(s, host32(b)) })
	})

	t.Run("hung-host-withdrawn-within-hold-time", func(t *testing.T) {
		if err := c.PausePlugin(h2); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		resumed := false
		defer func() {
			if !resumed {
				_ = c.ResumePlugin(h2)
			}
		}()
		defer func() {
			if t.Failed() {
				sum, err := c.Router.VTY(ctx, "show bgp summary")
				t.Logf("FRR: %v\n%s", err, sum)
				rt, _ := c.Router.VTY(ctx, "show ip bgp")
				t.Logf("FRR routes:\n%s", rt)
			}
		}()
		waitRoutes(ctx, t, h1, "h1 loses b", func(s agent.BGPStatus) bool { return !hasRoute(s, host32(b)) })
		took := time.Since(paused)
		t.Logf("b's route withdrawn %v after h2 hung (hold time %v)", took.Round(100*time.Millisecond), hold)
		if took > hold+7*time.Second {
			t.Errorf("withdrawal took %v, hold time is %v", took, hold)
		}
		if out, err := a.Ping(ctx, b.IP.Addr(), 1); err == nil {
			t.Errorf("a still reaches b without a route:\n%s", out)
		}
		if err := c.ResumePlugin(h2); err != nil {
			t.Fatal(err)
		}
		resumed = true
		waitRoutes(ctx, t, h1, "h1 learns b again", func(s agent.BGPStatus) bool { return hasRoute(s, host32(b)) })
		waitRoutes(ctx, t, h2, "h2 learns a again", func(s agent.BGPStatus) bool { return hasRoute(s, host32(a)) })
		if out, err := a.Ping(ctx, b.IP.Addr(), 3); err != nil {
			t.Fatalf("a → b after h2 came back: %v\n%s", err, out)
		}
	})

	for _, stop := range []string{"SIGKILL", "SIGTERM"} {
		t.Run("agent-restart-loses-nothing/"+stop, func(t *testing.T) {
			// Graceful restart: FRR keeps h1's routes while its netplugin is down (it
			// crashed, or stopped in order: no Cease either way), and the new netplugin
			// keeps the datapath's learned routes until its session is back.
			type result struct {
				out string
				err error
			}
			done := make(chan result, 1)
			go func() {
				out, err := a.Exec(ctx, "ping", "-i", "0.01", "-c", "700", "-W", "1", b.IP.Addr().String())
				done <- result{out, err}
			}()
			time.Sleep(time.Second)
			if stop == "SIGKILL" {
				c.KillPlugin(h1)
			} else if err := c.StopPlugin(h1); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
			if err := c.StartPlugin(ctx, h1); err != nil {
				t.Fatal(err)
			}
			if err := h1.WaitReady(ctx, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || !strings.Contains(r.out, " 0% packet loss") {
				t.Errorf("ping across h1's netplugin restart (%s): %v\n%s", stop, r.err, r.out)
			}
			waitRoutes(ctx, t, h1, "h1's new session", func(s agent.BGPStatus) bool {
				return s.NeighborStatus == "established" && hasRoute(s, host32(b)) && slices.Contains(s.AdvertisedRoutes, host32(a))
			})
			waitRoutes(ctx, t, h2, "h2 still has a", func(s agent.BGPStatus) bool { return hasRoute(s, host32(a)) })
		})
	}

	t.Run("bgp-delete", func(t *testing.T) {
		if out, err := c.Netctl(ctx, "bgp", "rm", h1.Name); err != nil {
			t.Fatalf("netctl bgp rm: %v\n%s", err, out)
		}
		waitRoutes(ctx, t, h2, "h2 forgets a", func(s agent.BGPStatus) bool { return !hasRoute(s, host32(a)) })
		deadline := time.Now().Add(20 * time.Second)
		for {
			out, err := Exec(ctx, h1.Name, "ip", "-4", "-o", "addr", "show", "dev", HostIf)
			if err == nil && !strings.Contains(out, c.Router.Links[h1.Name].RouterIP.Addr().String()) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("router-ip still on %s after bgp rm: %s %v", HostIf, out, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		var s agent.BGPStatus
		if err := h1.InspectGet(ctx, "/inspect/bgp", &s); err != nil || s.NeighborStatus != "" {
			t.Errorf("h1 /inspect/bgp after bgp rm: %+v %v", s, err)
		}
	})

	t.Run("bad-input", func(t *testing.T) {
		l1 := c.Router.Links[h1.Name]
		if out, err := c.Netctl(ctx, "bgp", "create", h1.Name, "--router-ip", l1.RouterIP.String(), "--as", "65x",
			"--neighbor-as", "65000", "--neighbor", l1.Neighbor.String()); err == nil || !strings.Contains(out, "as") {
			t.Errorf("bgp create with AS 65x: %v\n%s", err, out)
		}
		// A router-ip on the underlay's network: refused by the host, said in bgp inspect
		// and /healthz; the host's other traffic is untouched.
		if out, err := c.Netctl(ctx, "bgp", "create", h1.Name, "--router-ip", "192.168.100.77/24", "--as", "65001",
			"--neighbor-as", "65000", "--neighbor", "192.168.100.78"); err != nil {
			t.Fatalf("bgp create: %v\n%s", err, out)
		}
		waitRoutes(ctx, t, h1, "h1 refuses the router-ip", func(s agent.BGPStatus) bool { return strings.Contains(s.Error, "overlaps") })
		if body, err := h1.HealthBody(ctx); err == nil || !strings.Contains(body, "bgp/"+h1.Name) {
			t.Errorf("h1 /healthz with a refused bgp record: %v %s", err, body)
		}
		if out, err := c.Netctl(ctx, "bgp", "inspect", h1.Name); err != nil || !strings.Contains(out, "overlaps") {
			t.Errorf("bgp inspect: %v\n%s", err, out)
		}
		if out, err := a.Ping(ctx, netip.MustParseAddr("10.66.1.1"), 2); err != nil {
			t.Errorf("a → its gateway with h1's bgp record refused: %v\n%s", err, out)
		}
		// A neighbour nobody answers for: the session stays down, /healthz says degraded.
		if out, err := c.Netctl(ctx, "bgp", "rm", h1.Name); err != nil {
			t.Fatalf("bgp rm: %v\n%s", err, out)
		}
		if out, err := c.Netctl(ctx, "bgp", "create", h1.Name, "--router-ip", l1.RouterIP.String(), "--as", "65001",
			"--neighbor-as", "65000", "--neighbor", "172.30.1.9"); err != nil {
			t.Fatalf("bgp create: %v\n%s", err, out)
		}
		waitRoutes(ctx, t, h1, "h1 tries the silent neighbour", func(s agent.BGPStatus) bool {
			return s.NeighborStatus != "" && s.NeighborStatus != "established" && s.Error == ""
		})
		if body, err := h1.HealthBody(ctx); err != nil || !strings.Contains(body, "degraded: BGP session") {
			t.Errorf("h1 /healthz with a silent neighbour: %v %s", err, body)
		}
	})
}

func hasRoute(s agent.BGPStatus, prefix string) bool {
	for _, r := range s.Routes {
		if strings.HasPrefix(r, prefix+" ") {
			return true
		}
	}
	return false
}

// waitRoutes polls h's /inspect/bgp until ok holds (30 s).
func waitRoutes(ctx context.Context, t *testing.T, h *Host, what string, ok func(agent.BGPStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var s agent.BGPStatus
	for {
		s = agent.BGPStatus{} // omitted fields must not keep the previous answer's values
		err := h.InspectGet(ctx, "/inspect/bgp", &s)
		if err == nil && ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s; %s /inspect/bgp: %+v %v", what, h.Name, s, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
