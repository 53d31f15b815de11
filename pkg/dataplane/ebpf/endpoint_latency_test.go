package ebpf

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestEndpointUpsertLatency creates endpoints in fresh container namespaces one after the
// other (as CNI ADDs arrive), checks each container end is fully configured, and logs the
// per-endpoint p50/p99 of UpsertEndpoint with its per-step breakdown. CONTIVBPF_EP_N sets
// how many endpoints (default 40).
func TestEndpointUpsertLatency(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	n := 40
	if v, err := strconv.Atoi(os.Getenv("CONTIVBPF_EP_N")); err == nil && v > 1 && v < 200 {
		n = v
	}
	if err := h.d.UpsertNetwork(ctx, h.net); err != nil {
		t.Fatal(err)
	}
	steps := map[string][]time.Duration{}
	h.d.cfg.StepObserver = func(step string, d time.Duration) { steps[step] = append(steps[step], d) }
	eps := make([]dataplane.Endpoint, n)
	for i := range eps {
		eps[i] = h.endpoint(t, fmt.Sprintf("l%d", i), fmt.Sprintf("10.50.0.%d", 10+i), true)
	}
	var total []time.Duration
	for _, ep := range eps {
		start := time.Now()
		if err := h.d.UpsertEndpoint(ctx, ep); err != nil {
			t.Fatal(err)
		}
		total = append(total, time.Since(start))
	}
	h.d.cfg.StepObserver = nil
	for _, ep := range eps {
		checkContainerEnd(t, ep, h.d.eps.networks[ep.NetworkID].net)
		l, err := h.d.nl.LinkByName(ep.HostIfName)
		if err != nil || l.Attrs().Alias != h.d.endpointAlias(indexKey(ep.ID)) || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("%s: host end %v (%v), want alias %q and up", ep.ID, l, err, h.d.endpointAlias(indexKey(ep.ID)))
		}
	}
	conformance.PingOK(t, eps[0].NetNS, eps[n-1].IP.String(), 3)

	var b strings.Builder
	fmt.Fprintf(&b, "UpsertEndpoint, %d endpoints in fresh netns: total p50 %v p99 %v", n, pct(total, 50), pct(total, 99))
	for _, s := range []string{StepVeth, StepContainer, StepHostLink, StepMaps, StepTCX} {
		if len(steps[s]) != n {
			t.Errorf("step %s reported %d times, want %d", s, len(steps[s]), n)
		}
		fmt.Fprintf(&b, "\n  %-10s p50 %8v p99 %8v", s, pct(steps[s], 50), pct(steps[s], 99))
	}
	t.Log(b.String())
}

// checkContainerEnd verifies what the driver configures inside the container namespace.
func checkContainerEnd(t *testing.T, ep dataplane.Endpoint, n dataplane.Network) {
	t.Helper()
	nh := netlinkIn(t, ep.NetNS)
	defer nh.Close()
	l, err := nh.LinkByName(ep.IfName)
	if err != nil {
		t.Fatalf("%s: container end: %v", ep.ID, err)
	}
	a := l.Attrs()
	if a.HardwareAddr.String() != ep.MAC.String() || a.MTU != n.MTU || a.Flags&net.FlagUp == 0 {
		t.Errorf("%s: container end mac %v mtu %d flags %v, want %v %d up", ep.ID, a.HardwareAddr, a.MTU, a.Flags, ep.MAC, n.MTU)
	}
	addrs, err := nh.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != netip.PrefixFrom(ep.IP, n.Subnet.Bits()).String() {
		t.Errorf("%s: container addresses %v (%v)", ep.ID, addrs, err)
	}
	routes, err := nh.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	gw := false
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw.String() == n.Gateway.String() {
			gw = true
		}
	}
	if !gw {
		t.Errorf("%s: no default route via %v: %v", ep.ID, n.Gateway, routes)
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))].Round(10 * time.Microsecond)
}
