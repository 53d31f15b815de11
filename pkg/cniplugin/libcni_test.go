package cniplugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/internal/testkit/dockertest"
	"github.com/contivbpf/contivbpf/pkg/cniplugin"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/testroot"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// buildAll provides netmaster, netplugin, netctl and contivk8s (prebuilt ones from
// $CONTIVBPF_TEST_BIN, which `make test` sets, else compiled here) plus cnitool and the
// bandwidth and portmap plugins, which are not project binaries and are always compiled
// from the pinned CNI modules, in a temp dir.
func buildAll(t *testing.T, ctx context.Context) string {
	t.Helper()
	root, err := sim.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	pkgs := map[string]string{
		"cnitool": "github.com/containernetworking/cni/cnitool",
		// Chained after contivk8s in the "chained" case (go.mod's tool directives pin them).
		"bandwidth": "github.com/containernetworking/plugins/plugins/meta/bandwidth",
		"portmap":   "github.com/containernetworking/plugins/plugins/meta/portmap",
	}
	if pre := os.Getenv("CONTIVBPF_TEST_BIN"); pre != "" {
		for _, name := range []string{"netmaster", "netplugin", "netctl", "contivk8s"} {
			if err := os.Symlink(filepath.Join(pre, name), filepath.Join(bin, name)); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		if err := sim.Build(ctx, root, bin); err != nil {
			t.Fatal(err)
		}
		pkgs["contivk8s"] = "./cmd/contivk8s"
	}
	for name, pkg := range pkgs {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(bin, name), pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, out)
		}
	}
	return bin
}

func confList(t *testing.T, version, socket, network string) *libcni.NetworkConfigList {
	t.Helper()
	b := fmt.Sprintf(`{"cniVersion":%q,"name":"contiv","plugins":[{"type":"contivk8s","socket":%q,"network":%q,"dns":{"nameservers":["10.96.0.10"]}}]}`, version, socket, network)
	l, err := libcni.ConfListFromBytes([]byte(b))
	if err != nil {
		t.Fatalf("conf list: %v", err)
	}
	return l
}

func cniCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// linkIn returns the named link inside namespace path, or nil.
func linkIn(t *testing.T, path, name string) (netlink.Link, []netlink.Addr) {
	t.Helper()
	var l netlink.Link
	var addrs []netlink.Addr
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		var err error
		l, err = netlink.LinkByName(name)
		if err != nil {
			l = nil
			return nil
		}
		addrs, err = netlink.AddrList(l, netlink.FAMILY_V4)
		return err
	})
	if err != nil {
		t.Fatalf("look in %s: %v", path, err)
	}
	return l, addrs
}

func numEndpoints(t *testing.T, ctx context.Context, c *sim.Cluster, network string) int {
	t.Helper()
	var insp struct {
		Oper model.NetworkOper `json:"Oper"`
	}
	if err := c.MasterDo(ctx, "GET", "/api/v1/inspect/networks/default:"+network+"/", nil, &insp); err != nil {
		t.Fatalf("inspect network: %v", err)
	}
	return insp.Oper.NumEndpoints
}

// TestLibcniSpecVersions drives the contivk8s binary through libcni (what container
// runtimes use) against a real netmaster + netplugin on a simulated host, for every
// supported spec version, plus bad input.
func TestLibcniSpecVersions(t *testing.T) {
	testroot.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := buildAll(t, ctx)
	c, err := sim.Start(ctx, sim.Config{Prefix: "cbr" + dockertest.RandHex(2), Hosts: 1, BinDir: bin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.CreateNetwork(ctx, "default", "cni-net", "vxlan", "10.77.0.0/24", "10.77.0.1"); err != nil {
		t.Fatal(err)
	}
	h := c.Hosts[0]
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, t.TempDir(), nil)

	for _, v := range cniplugin.Versions.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			nsName := "cbr-p" + dockertest.RandHex(3)
			dockertest.NetNS(t, nsName)
			nsPath := "/run/netns/" + nsName
			list := confList(t, v, h.CNISocket, "cni-net")
			rt := &libcni.RuntimeConf{ContainerID: "cid-" + nsName, NetNS: nsPath, IfName: "eth0",
				Args: [][2]string{{"K8S_POD_NAME", "pod-" + v}, {"K8S_POD_NAMESPACE", "default"}, {"IgnoreUnknown", "1"}}}
			res, err := cni.AddNetworkList(ctx, list, rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.IPs) != 1 || r.IPs[0].Address.String() != "10.77.0.2/24" || r.IPs[0].Gateway.String() != "10.77.0.1" {
				t.Fatalf("ips = %v", r.IPs)
			}
			// The host side of the veth first (no sandbox, as bridge/ptp list it), then the
			// pod's interface, which the address names.
			if len(r.Interfaces) != 2 || !strings.HasPrefix(r.Interfaces[0].Name, "cbv") || r.Interfaces[0].Sandbox != "" || r.Interfaces[0].Mac == "" ||
				r.Interfaces[1].Name != "eth0" || r.Interfaces[1].Mac != "02:02:0a:4d:00:02" || r.Interfaces[1].Sandbox != nsPath {
				t.Fatalf("interfaces = %v", r.Interfaces)
			}
			if r.IPs[0].Interface == nil || *r.IPs[0].Interface != 1 {
				t.Fatalf("address names interface %v, want 1 (eth0)", r.IPs[0].Interface)
			}
			if len(r.DNS.Nameservers) != 1 || len(r.Routes) != 1 {
				t.Fatalf("dns %v routes %v", r.DNS, r.Routes)
			}
			l, addrs := linkIn(t, nsPath, "eth0")
			if l == nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.77.0.2/24" || l.Attrs().MTU != 1450 {
				t.Fatalf("eth0 in pod: link %v addrs %v", l, addrs)
			}
			if v != "0.3.1" { // CHECK exists from 0.4.0 on
				if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if v == "1.0.0" {
				// CHECK notices an interface that lost its address.
				err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
					l, err := netlink.LinkByName("eth0")
					if err != nil {
						return err
					}
					return netlink.AddrDel(l, &addrs[0])
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := cni.CheckNetworkList(ctx, list, rt); err == nil || !strings.Contains(err.Error(), "lacks address") {
					t.Fatalf("CHECK after address removal: %v", err)
				}
			}
			if v == "1.1.0" {
				if err := cni.GetStatusNetworkList(ctx, list); err != nil {
					t.Fatalf("STATUS: %v", err)
				}
			}
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := cni.DelNetworkList(ctx, list, rt); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			if l, _ := linkIn(t, nsPath, "eth0"); l != nil {
				t.Fatalf("eth0 still in pod after DEL")
			}
			if n := numEndpoints(t, ctx, c, "cni-net"); n != 0 {
				t.Fatalf("%d endpoints left after DEL", n)
			}
		})
	}

	t.Run("cnitool", func(t *testing.T) {
		nsName := "cbr-p" + dockertest.RandHex(3)
		dockertest.NetNS(t, nsName)
		nsPath := "/run/netns/" + nsName
		confDir := t.TempDir()
		// cnitool caches results under /var/lib/cni: a unique network name lets the
		// clean-up remove exactly ours.
		netName := "cbr-contiv-" + dockertest.RandHex(3)
		t.Cleanup(func() {
			m, _ := filepath.Glob("/var/lib/cni/results/" + netName + "-*")
			for _, f := range m {
				os.Remove(f)
			}
			// Only succeeds when empty, so nobody else's results go.
			os.Remove("/var/lib/cni/results")
			os.Remove("/var/lib/cni")
		})
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"contivk8s","socket":%q,"network":"cni-net"}]}`, netName, h.CNISocket)
		if err := os.WriteFile(filepath.Join(confDir, "10-contiv.conflist"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		tool := func(args ...string) string {
			t.Helper()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, "cnitool"), args...)
			cmd.Env = append(os.Environ(), "CNI_PATH="+bin, "NETCONFPATH="+confDir, "CNI_ARGS=K8S_POD_NAME=tool;K8S_POD_NAMESPACE=default")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("cnitool %v: %v\n%s", args, err, out)
			}
			return string(out)
		}
		t.Cleanup(func() { // detach even when a step below fails
			cmd := exec.Command(filepath.Join(bin, "cnitool"), "del", netName, nsPath)
			cmd.Env = append(os.Environ(), "CNI_PATH="+bin, "NETCONFPATH="+confDir)
			_ = cmd.Run()
		})
		out := tool("add", netName, nsPath)
		var r current.Result
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.IPs) != 1 || r.IPs[0].Address.String() != "10.77.0.2/24" {
			t.Fatalf("cnitool add output %s (%v)", out, err)
		}
		tool("check", netName, nsPath)
		tool("status", netName, nsPath)
		tool("del", netName, nsPath)
		tool("del", netName, nsPath)
		if l, _ := linkIn(t, nsPath, "eth0"); l != nil {
			t.Fatal("eth0 still in pod after cnitool del")
		}
	})

	// Chaining as a Kubernetes runtime does it: contivk8s, then containernetworking's
	// bandwidth and portmap plugins, run (like the runtime) in the host's namespace, where
	// the agent's veths are. bandwidth finds the host side of the veth in contivk8s'
	// result; portmap's host port reaches the pod from the host.
	t.Run("chained", func(t *testing.T) {
		if _, err := exec.LookPath("iptables"); err != nil {
			t.Fatalf("portmap needs iptables: %v", err)
		}
		podNS := "cbr-p" + dockertest.RandHex(3)
		dockertest.NetNS(t, podNS)
		nsPath := "/run/netns/" + podNS
		hostNS := sim.NetNSPath(h.Name)
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"cbr-chain","plugins":[
			{"type":"contivk8s","socket":%q,"network":"cni-net"},
			{"type":"bandwidth","capabilities":{"bandwidth":true}},
			{"type":"portmap","backend":"iptables","capabilities":{"portMappings":true}}]}`, h.CNISocket)
		list, err := libcni.ConfListFromBytes([]byte(conf))
		if err != nil {
			t.Fatal(err)
		}
		rt := &libcni.RuntimeConf{ContainerID: "cid-" + podNS, NetNS: nsPath, IfName: "eth0",
			Args: [][2]string{{"K8S_POD_NAME", "chained"}, {"K8S_POD_NAMESPACE", "default"}, {"IgnoreUnknown", "1"}},
			CapabilityArgs: map[string]any{
				"bandwidth":    map[string]any{"ingressRate": 80_000_000, "ingressBurst": 1_000_000, "egressRate": 80_000_000, "egressBurst": 1_000_000},
				"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}},
			}}
		inHost := func(fn func() error) {
			t.Helper()
			if err := ns.WithNetNSPath(hostNS, func(ns.NetNS) error { return fn() }); err != nil {
				t.Fatal(err)
			}
		}
		var res types.Result
		inHost(func() error {
			var err error
			res, err = cni.AddNetworkList(ctx, list, rt)
			return err
		})
		t.Cleanup(func() {
			_ = ns.WithNetNSPath(hostNS, func(ns.NetNS) error { return cni.DelNetworkList(ctx, list, rt) })
		})
		r, err := current.NewResultFromResult(res)
		if err != nil {
			t.Fatal(err)
		}
		hostIf := r.Interfaces[0].Name
		tcOut, err := sim.Exec(ctx, h.Name, "tc", "qdisc", "show", "dev", hostIf)
		if err != nil || !strings.Contains(tcOut, "tbf") {
			t.Fatalf("bandwidth: no tbf qdisc on %s: %s %v", hostIf, tcOut, err)
		}
		nat, err := sim.Exec(ctx, h.Name, "iptables", "-t", "nat", "-S")
		if err != nil || !strings.Contains(nat, "18080") {
			t.Fatalf("portmap: no DNAT rule for 18080: %s %v", nat, err)
		}
		inHost(func() error { return cni.CheckNetworkList(ctx, list, rt) })

		// The host port reaches the pod's listener from the host (portmap's OUTPUT DNAT,
		// then the agent's host route into the pod).
		l, err := sim.Listen(podNS, "tcp", ":8080")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = c.Write([]byte("pod"))
		}()
		dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
		defer dcancel()
		c, err := sim.DialContext(dctx, h.Name, "tcp", netip.AddrPortFrom(h.IP, 18080).String())
		if err != nil {
			t.Fatalf("dial host port: %v", err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 8)
		n, err := c.Read(buf)
		c.Close()
		if err != nil || string(buf[:n]) != "pod" {
			t.Fatalf("host port answer %q, %v", buf[:n], err)
		}

		inHost(func() error { return cni.DelNetworkList(ctx, list, rt) })
		if tcOut, _ := sim.Exec(ctx, h.Name, "tc", "qdisc", "show", "dev", hostIf); strings.Contains(tcOut, "tbf") {
			t.Fatalf("tbf qdisc left after DEL: %s", tcOut)
		}
		if nat, _ := sim.Exec(ctx, h.Name, "iptables", "-t", "nat", "-S"); strings.Contains(nat, "18080") {
			t.Fatalf("DNAT rule left after DEL: %s", nat)
		}
		if links, _ := sim.Exec(ctx, h.Name, "ip", "-o", "link"); strings.Contains(links, "bwp") {
			t.Fatalf("bandwidth's ifb left after DEL: %s", links)
		}
	})

	t.Run("bad-input", func(t *testing.T) {
		nsName := "cbr-p" + dockertest.RandHex(3)
		dockertest.NetNS(t, nsName)
		rt := &libcni.RuntimeConf{ContainerID: "cid-bad", NetNS: "/run/netns/" + nsName, IfName: "eth0"}

		// Unknown network: netplugin refuses, nothing is left behind.
		_, err := cni.AddNetworkList(ctx, confList(t, "1.0.0", h.CNISocket, "no-such-net"), rt)
		if cniCode(err) != cniplugin.ErrAgent || !strings.Contains(err.Error(), "Contiv:") {
			t.Fatalf("ADD on unknown network: %v (code %d)", err, cniCode(err))
		}
		if l, _ := linkIn(t, rt.NetNS, "eth0"); l != nil {
			t.Fatal("failed ADD left eth0 in the pod")
		}
		if n := numEndpoints(t, ctx, c, "cni-net"); n != 0 {
			t.Fatalf("failed ADD left %d endpoints", n)
		}
		// netplugin not listening.
		_, err = cni.AddNetworkList(ctx, confList(t, "1.0.0", "/nonexistent/cni.sock", "cni-net"), rt)
		if cniCode(err) != types.ErrTryAgainLater {
			t.Fatalf("ADD with no netplugin: %v (code %d)", err, cniCode(err))
		}
		if err := cni.GetStatusNetworkList(ctx, confList(t, "1.1.0", "/nonexistent/cni.sock", "cni-net")); cniCode(err) != types.ErrPluginNotAvailable {
			t.Fatalf("STATUS with no netplugin: %v", err)
		}
		// Unknown CNI_ARGS key without IgnoreUnknown.
		rt2 := *rt
		rt2.Args = [][2]string{{"BOGUS", "1"}}
		_, err = cni.AddNetworkList(ctx, confList(t, "1.0.0", h.CNISocket, "cni-net"), &rt2)
		if cniCode(err) != types.ErrInvalidEnvironmentVariables || !strings.Contains(err.Error(), "BOGUS") {
			t.Fatalf("ADD with bad CNI_ARGS: %v", err)
		}
		// Malformed config: relative socket path.
		_, err = cni.AddNetworkList(ctx, confList(t, "1.0.0", "relative.sock", "cni-net"), rt)
		if cniCode(err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "socket") {
			t.Fatalf("ADD with bad config: %v", err)
		}
		// DEL of something never added succeeds.
		if err := cni.DelNetworkList(ctx, confList(t, "1.0.0", h.CNISocket, "cni-net"), rt); err != nil {
			t.Fatalf("DEL of unknown pod: %v", err)
		}
	})
}
