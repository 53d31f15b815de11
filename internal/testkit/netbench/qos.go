package netbench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// NetprofileFigures are a backend's rate-limiter figures for `make bench`
// (<dp>.netprofile.*): TCP throughput (iperf3) of an endpoint with a QoS over its rate,
// in each direction, and of an endpoint without QoS while another endpoint of the host
// is limited and while none is.
type NetprofileFigures struct {
	// What the limited endpoint sends (its EgressRate), achieved / configured.
	Accuracy10M, Accuracy1G float64
	// What the limited endpoint receives (its IngressRate), achieved / configured.
	AccuracyIn10M, AccuracyIn1G float64
	// An unlimited endpoint's throughput (Gbit/s) per round while another endpoint of the
	// host has a QoS (On) and while none has (Off); round i measured both, in the order
	// on, off for even i and off, on for odd i (ABBA: a drift of the machine's load
	// weighs on both alike).
	UnlimitedOn, UnlimitedOff []float64
}

// UnlimitedRatio is the median over the rounds of on/off: each round's pair was measured
// back to back, so the load the two cores carried at the time cancels out of its ratio,
// and the median drops a round another process disturbed. 0 without rounds.
func (f NetprofileFigures) UnlimitedRatio() float64 {
	var r []float64
	for i := range min(len(f.UnlimitedOn), len(f.UnlimitedOff)) {
		if f.UnlimitedOff[i] > 0 {
			r = append(r, f.UnlimitedOn[i]/f.UnlimitedOff[i])
		}
	}
	if len(r) == 0 {
		return 0
	}
	slices.Sort(r)
	if len(r)%2 == 1 {
		return r[len(r)/2]
	}
	return (r[len(r)/2-1] + r[len(r)/2]) / 2
}

// NewDriver starts the backend under test for host (its namespace, and a VTEP address
// the namespace holds).
type NewDriver func(ctx context.Context, host dataplane.HostConfig) (dataplane.Driver, error)

// MeasureNetprofile runs one driver (newDriver, the backend a parameter) with namespaces
// named prefix+"h" (host), prefix+"a", prefix+"b", prefix+"c" (endpoints), all removed at
// the end with the driver's datapath (Teardown), and measures NetprofileFigures with
// iperf3: a→b for accSeconds with a's egress limited to 10 Mbit/s and to 1 Gbit/s (long
// enough that the first burst weighs little), b→a with a's ingress limited the same, then
// rounds of a→b (unlimited) for seconds each
// with c limited and not.
func MeasureNetprofile(ctx context.Context, prefix string, accSeconds, seconds, rounds int, newDriver NewDriver) (f NetprofileFigures, err error) {
	var made []string
	defer func() {
		for _, n := range made {
			_ = exec.Command("ip", "netns", "del", n).Run()
		}
	}()
	ns := func(name string) (string, error) {
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			return "", fmt.Errorf("create netns %s: %v: %s", name, err, out)
		}
		made = append(made, name)
		if _, err := Run(name, "ip", "link", "set", "lo", "up"); err != nil {
			return "", err
		}
		return NSPath(name), nil
	}
	host, err := ns(prefix + "h")
	if err != nil {
		return f, err
	}
	// The VTEP on a veth of the host namespace, its peer there too (the OVS backend
	// requires the address on an interface; this kernel has no dummy links).
	vtep := netip.MustParseAddr("10.254.0.1")
	for _, args := range [][]string{{"link", "add", "vtep0", "type", "veth", "peer", "name", "vtep1"}, {"addr", "add", vtep.String() + "/24", "dev", "vtep0"},
		{"link", "set", "vtep0", "up"}, {"link", "set", "vtep1", "up"}} {
		if _, err := Run(prefix+"h", append([]string{"ip"}, args...)...); err != nil {
			return f, err
		}
	}
	d, err := newDriver(ctx, dataplane.HostConfig{Host: "h", NetNS: host, VTEP: vtep})
	if err != nil {
		return f, fmt.Errorf("start driver: %w", err)
	}
	defer func() { err = errors.Join(err, d.Teardown(context.Background())) }()
	n := dataplane.Network{ID: "qos.bench", Encap: dataplane.EncapVXLAN, Tag: 77,
		Subnet: netip.MustParsePrefix("10.50.0.0/24"), Gateway: netip.MustParseAddr("10.50.0.1")}
	if err := d.UpsertNetwork(ctx, n); err != nil {
		return f, err
	}
	eps := map[string]*dataplane.Endpoint{}
	for i, name := range []string{"a", "b", "c"} {
		p, err := ns(prefix + name)
		if err != nil {
			return f, err
		}
		ip := netip.AddrFrom4([4]byte{10, 50, 0, byte(2 + i)})
		ep := &dataplane.Endpoint{ID: "qos-" + name, NetworkID: n.ID, IP: ip, MAC: dataplane.ContivMAC(ip),
			HostIfName: prefix + name + "h", IfName: "eth0", NetNS: p}
		if err := d.UpsertEndpoint(ctx, *ep); err != nil {
			return f, err
		}
		eps[name] = ep
	}
	set := func(name string, q dataplane.QoS) error {
		eps[name].QoS = q
		if err := d.UpsertEndpoint(ctx, *eps[name]); err != nil {
			return fmt.Errorf("endpoint %s with QoS %+v: %w", name, q, err)
		}
		return nil
	}
	tput := func(from, to string, seconds int) (float64, error) {
		g, err := Iperf3(ctx, prefix+to, prefix+from, eps[to].IP.String(), 5201, seconds)
		return g * 1e9, err
	}
	for _, c := range []struct {
		q        dataplane.QoS
		from, to string
		out      *float64
	}{
		{dataplane.QoS{EgressRate: 10e6}, "a", "b", &f.Accuracy10M},
		{dataplane.QoS{EgressRate: 1e9}, "a", "b", &f.Accuracy1G},
		{dataplane.QoS{IngressRate: 10e6}, "b", "a", &f.AccuracyIn10M},
		{dataplane.QoS{IngressRate: 1e9}, "b", "a", &f.AccuracyIn1G},
	} {
		if err := set("a", c.q); err != nil {
			return f, err
		}
		got, err := tput(c.from, c.to, accSeconds)
		if err != nil {
			return f, err
		}
		*c.out = got / float64(c.q.EgressRate+c.q.IngressRate) // one of them is set
	}
	if err := set("a", dataplane.QoS{}); err != nil {
		return f, err
	}
	f.UnlimitedOn, f.UnlimitedOff = make([]float64, rounds), make([]float64, rounds)
	for i := range rounds {
		for _, on := range []bool{i%2 == 0, i%2 != 0} { // ABBA: alternate which goes first
			q := dataplane.QoS{}
			if on {
				q = dataplane.QoS{EgressRate: 10e6, IngressRate: 10e6, DSCP: 46, SetDSCP: true}
			}
			if err := set("c", q); err != nil {
				return f, err
			}
			got, err := tput("a", "b", seconds)
			if err != nil {
				return f, err
			}
			if on {
				f.UnlimitedOn[i] = got / 1e9
			} else {
				f.UnlimitedOff[i] = got / 1e9
			}
		}
	}
	return f, nil
}
