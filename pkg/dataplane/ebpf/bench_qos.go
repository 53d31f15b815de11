//go:build cbbench

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// NetprofileFigures are the rate limiter's figures for `make bench`
// (ebpf.netprofile.*): TCP throughput (iperf3) of an endpoint with an egress QoS over its
// rate, and of an endpoint without QoS with another endpoint limited / none.
type NetprofileFigures struct {
	Accuracy10M, Accuracy1G float64 // achieved / configured
	// An unlimited endpoint's throughput (Gbit/s) per round while another endpoint of the
	// host has a QoS (On) and while none has (Off), in alternating rounds.
	UnlimitedOn, UnlimitedOff []float64
}

// MeasureNetprofile runs one driver in namespaces named prefix+"h" (host), prefix+"a",
// prefix+"b", prefix+"c" (endpoints), all removed at the end, and measures
// NetprofileFigures with iperf3 runs of seconds each.
func MeasureNetprofile(ctx context.Context, prefix string, seconds, rounds int) (f NetprofileFigures, err error) {
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
		if _, err := netbench.Run(name, "ip", "link", "set", "lo", "up"); err != nil {
			return "", err
		}
		return netbench.NSPath(name), nil
	}
	host, err := ns(prefix + "h")
	if err != nil {
		return f, err
	}
	pins := filepath.Join("/sys/fs/bpf", prefix)
	defer func() { _ = os.RemoveAll(pins) }()
	d, err := New(ctx, dataplane.HostConfig{Host: "h", NetNS: host, VTEP: netip.MustParseAddr("10.254.0.1")},
		Options{PinRoot: pins, VXLANIf: prefix + "vx", MapEntries: 1024})
	if err != nil {
		return f, err
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
		return d.UpsertEndpoint(ctx, *eps[name])
	}
	tput := func(from, to string) (float64, error) {
		g, err := netbench.Iperf3(ctx, prefix+to, prefix+from, eps[to].IP.String(), 5201, seconds)
		return g * 1e9, err
	}
	for _, c := range []struct {
		rate uint64
		out  *float64
	}{{10e6, &f.Accuracy10M}, {1e9, &f.Accuracy1G}} {
		if err := set("a", dataplane.QoS{EgressRate: c.rate}); err != nil {
			return f, err
		}
		got, err := tput("a", "b")
		if err != nil {
			return f, err
		}
		*c.out = got / float64(c.rate)
	}
	if err := set("a", dataplane.QoS{}); err != nil {
		return f, err
	}
	for i := 0; i < rounds; i++ {
		for _, on := range []bool{i%2 == 0, i%2 != 0} { // alternate which goes first
			q := dataplane.QoS{}
			if on {
				q = dataplane.QoS{EgressRate: 10e6, IngressRate: 10e6, DSCP: 46, SetDSCP: true}
			}
			if err := set("c", q); err != nil {
				return f, err
			}
			got, err := tput("a", "b")
			if err != nil {
				return f, err
			}
			if on {
				f.UnlimitedOn = append(f.UnlimitedOn, got/1e9)
			} else {
				f.UnlimitedOff = append(f.UnlimitedOff, got/1e9)
			}
		}
	}
	return f, nil
}
