package bgp

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

func TestConfigValidate(t *testing.T) {
	good := Config{RouterIP: netip.MustParsePrefix("10.0.0.2/24"), ASN: 65001, Neighbor: netip.MustParseAddr("10.0.0.1"), NeighborAS: 65000}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"no router-ip":    func(c *Config) { c.RouterIP = netip.Prefix{} },
		"ipv6 router-ip":  func(c *Config) { c.RouterIP = netip.MustParsePrefix("fd00::2/64") },
		"as 0":            func(c *Config) { c.ASN = 0 },
		"neighbor-as 0":   func(c *Config) { c.NeighborAS = 0 },
		"no neighbor":     func(c *Config) { c.Neighbor = netip.Addr{} },
		"neighbor itself": func(c *Config) { c.Neighbor = c.RouterIP.Addr() },
	} {
		c := good
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	ctx := context.Background()
	if _, err := Start(ctx, Config{}); err == nil {
		t.Error("Start with an empty config succeeded")
	}
	bad := good
	bad.HoldTime = time.Second
	if _, err := Start(ctx, bad); err == nil || !strings.Contains(err.Error(), "hold time") {
		t.Errorf("hold time 1s: %v", err)
	}
}

// TestTwoSpeakers runs two speakers against each other over loopback (127.0.0.2 and
// 127.0.0.3; one listens on a random high port, the other only connects): each learns the
// other's prefixes with the other's address as next hop, a withdrawn prefix disappears,
// and a stopped speaker's routes go at once (Cease, no hold-time wait).
func TestTwoSpeakers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := uint16(20000 + rand.IntN(30000))
	a, err := Start(ctx, Config{RouterIP: netip.MustParsePrefix("127.0.0.2/8"), ASN: 65001,
		Neighbor: netip.MustParseAddr("127.0.0.3"), NeighborAS: 65002, ListenPort: -1, NeighborPort: port})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop(ctx)
	b, err := Start(ctx, Config{RouterIP: netip.MustParsePrefix("127.0.0.3/8"), ASN: 65002,
		Neighbor: netip.MustParseAddr("127.0.0.2"), NeighborAS: 65001, ListenPort: int32(port), NeighborPort: 1})
	if err != nil {
		t.Fatal(err)
	}
	bStopped := false
	defer func() {
		if !bStopped {
			b.Stop(ctx)
		}
	}()
	pa, pa2, pb := netip.MustParsePrefix("10.9.0.2/32"), netip.MustParsePrefix("10.9.1.0/24"), netip.MustParsePrefix("10.9.0.3/32")
	if err := a.Advertise(ctx, []netip.Prefix{pa, pa2}); err != nil {
		t.Fatal(err)
	}
	if err := b.Advertise(ctx, []netip.Prefix{pb}); err != nil {
		t.Fatal(err)
	}
	if err := a.Advertise(ctx, []netip.Prefix{pb.Masked(), netip.MustParsePrefix("fd00::/64")}); err == nil {
		t.Error("advertising IPv6 succeeded")
	}
	if err := a.Advertise(ctx, []netip.Prefix{pa, pa2}); err != nil {
		t.Fatal(err)
	}
	wait := func(sp *Speaker, what string, ok func(Status) bool) Status {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := sp.Status(ctx)
			if err == nil && ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v %v", what, st, err)
			}
			select {
			case <-sp.Changed():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	via := func(p netip.Prefix, nh string) dataplane.Route {
		return dataplane.Route{Prefix: p, NextHop: netip.MustParseAddr(nh)}
	}
	st := wait(b, "b learns a's prefixes", func(s Status) bool { return s.Established && len(s.Learned) == 2 })
	if want := []dataplane.Route{via(pa, "127.0.0.2"), via(pa2, "127.0.0.2")}; !slices.Equal(st.Learned, want) {
		t.Errorf("b learned %v, want %v", st.Learned, want)
	}
	if st.AdminStatus != "up" || st.NeighborStatus != "established" {
		t.Errorf("b status %+v", st)
	}
	st = wait(a, "a learns b's prefix", func(s Status) bool { return s.Established && len(s.Learned) == 1 })
	if !slices.Equal(st.Learned, []dataplane.Route{via(pb, "127.0.0.3")}) || !slices.Equal(st.Advertised, []netip.Prefix{pa, pa2}) {
		t.Errorf("a: learned %v advertised %v", st.Learned, st.Advertised)
	}
	if err := a.Advertise(ctx, []netip.Prefix{pa2}); err != nil {
		t.Fatal(err)
	}
	wait(b, "b forgets the withdrawn prefix", func(s Status) bool {
		return len(s.Learned) == 1 && s.Learned[0].Prefix == pa2
	})
	b.Stop(ctx)
	bStopped = true
	start := time.Now()
	wait(a, "a forgets the stopped speaker's routes", func(s Status) bool { return !s.Established && len(s.Learned) == 0 })
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("routes of a stopped speaker went after %v (a Cease should end the session at once)", took)
	}
}
