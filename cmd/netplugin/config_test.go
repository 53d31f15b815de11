package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/testroot"

	"github.com/urfave/cli/v2"
)

func parse(t *testing.T, args ...string) (config, error) {
	t.Helper()
	var cfg config
	var cerr error
	app := &cli.App{Flags: flags(), Action: func(c *cli.Context) error {
		cfg, cerr = configFrom(c)
		return nil
	}}
	if err := app.Run(append([]string{"netplugin"}, args...)); err != nil {
		return cfg, err
	}
	return cfg, cerr
}

func TestConfig(t *testing.T) {
	cfg, err := parse(t, "--etcd", "etcd://10.0.0.1:2379,http://10.0.0.2:2379", "--host-label", "h1", "--vtep-ip", "192.168.1.1",
		"--netmode", "vxlan", "--fwdmode", "routing", "--vlan-uplinks", "eth1", "--plugin-mode", "docker")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.host != "h1" || cfg.vtep.String() != "192.168.1.1" || cfg.ctrl != cfg.vtep || len(cfg.etcd) != 2 ||
		cfg.fwdMode != "routing" || cfg.vlanIf != "eth1" || cfg.mode != "docker" || cfg.vxlanPort != 4789 ||
		cfg.dataplane != "ebpf" || cfg.bpffsRoot != "/sys/fs/bpf/contivbpf" || cfg.inspectListen != "127.0.0.1:9090" ||
		cfg.egressPorts != [2]uint16{61000, 65535} || cfg.snatIP.IsValid() || cfg.pprof {
		t.Fatalf("config = %+v", cfg)
	}
	// Encryption is off by default; on, the device is named after the host (a userspace
	// device's control socket is machine-wide: two simulated hosts must not share it).
	if cfg.encryption != "none" || cfg.wgPort != 51820 || cfg.wgDir != "/var/lib/contivbpf/h1" || !strings.HasPrefix(cfg.wgDevice, "cvwg") || len(cfg.wgDevice) != 12 {
		t.Fatalf("encryption defaults: %q port %d dir %q device %q", cfg.encryption, cfg.wgPort, cfg.wgDir, cfg.wgDevice)
	}
	if c2, err := parse(t, "--host-label", "h2", "--vtep-ip", "192.168.1.2", "--encryption", "wireguard"); err != nil || c2.encryption != "wireguard" || c2.wgDevice == cfg.wgDevice {
		t.Fatalf("--encryption wireguard on host h2: %v, device %q (h1's %q)", err, c2.wgDevice, cfg.wgDevice)
	}
	// The XDP prefilter is off by default.
	if cfg.xdp != "off" {
		t.Fatalf("xdp default %q, want off", cfg.xdp)
	}
	if c, err := parse(t, "--host-label", "h1", "--xdp", "generic"); err != nil || c.xdp != "generic" {
		t.Fatalf("--xdp generic: %v, %q", err, c.xdp)
	}
	if cfg, err := parse(t, "--host-label", "h1", "--pprof"); err != nil || !cfg.pprof {
		t.Fatalf("--pprof: %v, pprof %v", err, cfg.pprof)
	}
	// A token file group or others may read is refused (auth.LoadTokens), also by --check-config.
	loose := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(loose, []byte("reader-token-0123456789 read-only r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(good, []byte("reader-token-0123456789 read-only r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err := parse(t, "--host-label", "h1", "--inspect-token-file", good); err != nil || cfg.inspectTokens != good || cfg.inspectInsecure {
		t.Fatalf("--inspect-token-file: %v, %+v", err, cfg)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "swarm"}, "--mode"},
		{[]string{"--netmode", "vlan"}, "--vlan-if is required"},
		{[]string{"--fwdmode", "x"}, "--fwdmode"},
		{[]string{"--dataplane", "dpdk"}, "--dataplane"},
		{[]string{"--vtep-ip", "fe80::1"}, "--vtep-ip"},
		{[]string{"--vxlan-port", "70000"}, "--vxlan-port"},
		{[]string{"--etcd", " , "}, "--etcd-endpoints"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"--service-ttl", "1s"}, "--service-ttl"},
		{[]string{"--snat-ip", "fe80::1"}, "--snat-ip"},
		{[]string{"--egress-ports", "0-10"}, "--egress-ports"},
		{[]string{"--egress-ports", "70000-70001"}, "--egress-ports"},
		{[]string{"--egress-ports", "62000-61000"}, "--egress-ports"},
		{[]string{"--egress-ports", "61000"}, "--egress-ports"},
		{[]string{"--egress-ports", "4000-5000"}, "--vxlan-port 4789"},
		{[]string{"--egress-ports", "61000-65535", "--vxlan-port", "65535"}, "--vxlan-port 65535"},
		{[]string{"--vxlan-port", "31000"}, "node port range"},
		{[]string{"--vxlan-port", "30000"}, "node port range"},
		{[]string{"--dns-listen", "10.0.0.1"}, "--dns-listen"},
		{[]string{"--dns-rate", "0"}, "--dns-rate"},
		{[]string{"--dns-listen", "[::1]:53"}, "--dns-listen"},
		{[]string{"--dns-upstream", "8.8.8.8,bogus"}, "--dns-upstream"},
		{[]string{"--inspect-token-file", "/nonexistent/tokens"}, "--inspect-token-file"},
		{[]string{"--inspect-token-file", good, "--inspect-insecure"}, "exclude each other"},
		{[]string{"--inspect-token-file", loose}, "chmod 600"},
		{[]string{"--xdp", "offload"}, "--xdp"},
		{[]string{"--xdp", "native", "--dataplane", "ovs"}, "needs --dataplane ebpf"},
		{[]string{"--encryption", "ipsec"}, "--encryption"},
		{[]string{"--encryption", "wireguard", "--dataplane", "ovs"}, "needs --dataplane ebpf"},
		{[]string{"--encryption", "wireguard", "--wireguard-port", "4789"}, "is --vxlan-port"},
		{[]string{"--wireguard-port", "0"}, "--wireguard-port"},
		{[]string{"--wireguard-dir", "wg"}, "--wireguard-dir"},
		{[]string{"--wireguard-device", "a-name-far-too-long"}, "--wireguard-device"},
	} {
		_, err := parse(t, append([]string{"--host", "h", "--vtep-ip", "10.0.0.1"}, tc.args...)...)
		if tc.args[0] == "--vtep-ip" {
			_, err = parse(t, "--host", "h", "--vtep-ip", tc.args[1])
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want mention of %s", tc.args, err, tc.want)
		}
	}
	// The OVS dataplane has no egress ports: the range is not held against the VXLAN port.
	if _, err := parse(t, "--host", "h", "--vtep-ip", "10.0.0.1", "--dataplane", "ovs", "--egress-ports", "4000-5000"); err != nil {
		t.Errorf("ovs with egress ports around the vxlan port: %v", err)
	}
}

func TestPodLabeler(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	// Default path missing: not configured, no error.
	cfg, err := parse(t, "--host", "h", "--vtep-ip", "10.0.0.1", "--k8s-config", filepath.Join(dir, "none.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.k8sConfigSet = false
	if c, err := podLabeler(cfg, log); c != nil || err != nil {
		t.Fatalf("missing default config: %v %v", c, err)
	}
	// Named explicitly: must exist.
	cfg.k8sConfigSet = true
	if _, err := podLabeler(cfg, log); err == nil || !strings.Contains(err.Error(), "--k8s-config") {
		t.Fatalf("missing explicit config: %v", err)
	}
	// Empty API server: not configured.
	p := filepath.Join(dir, "contiv.json")
	if err := os.WriteFile(p, []byte(`{"K8S_API_SERVER": ""}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.k8sConfig = p
	if c, err := podLabeler(cfg, log); c != nil || err != nil {
		t.Fatalf("empty API server: %v %v", c, err)
	}
	// A configured API server that is down: the pod cache is built, and a CNI ADD's lookup
	// fails after the bounded wait saying that the API server has not answered.
	if err := os.WriteFile(p, []byte(`{"K8S_API_SERVER": "https://127.0.0.1:1"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.k8sPodWait = 700 * time.Millisecond
	c, err := podLabeler(cfg, log)
	if err != nil || c == nil {
		t.Fatalf("configured API: %v %v", c, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Run(ctx)
	_, err = c.PodLabels(ctx, "ns", "p")
	if !errors.Is(err, k8s.ErrPodNotFound) || !strings.Contains(err.Error(), "has not") {
		t.Fatalf("API down: %v", err)
	}
}

func TestDNSConfig(t *testing.T) {
	vtep := netip.MustParseAddr("10.0.0.1")
	ap, ups, err := dnsConfig("", "192.0.2.53,192.0.2.54:5353", vtep, "ebpf")
	if err != nil || ap.String() != "10.0.0.1:53" || strings.Join(ups, " ") != "192.0.2.53:53 192.0.2.54:5353" {
		t.Errorf("defaults: %v %v %v", ap, ups, err)
	}
	if ap, _, _ := dnsConfig("off", "", vtep, "ebpf"); ap.IsValid() {
		t.Error("off still listens")
	}
	if ap, _, _ := dnsConfig("", "", vtep, "ovs"); ap.IsValid() {
		t.Error("the OVS dataplane cannot steer queries: no responder")
	}
	if _, ups, _ := dnsConfig("", "none", vtep, "ebpf"); len(ups) != 0 {
		t.Errorf("none: %v", ups)
	}
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("# comment\nnameserver 127.0.0.53\nnameserver 192.0.2.1\nnameserver fe80::1\nsearch example.org\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := resolvConfServers(rc); strings.Join(got, " ") != "192.0.2.1:53" {
		t.Errorf("resolv.conf servers %v, want the non-loopback IPv4 one", got)
	}
}

// TestInspectService: the inspect API is registered for netctl --all only where others
// can reach it; an unspecified listener is advertised on the control address.
func TestInspectService(t *testing.T) {
	ctrl := netip.MustParseAddr("192.168.10.5")
	for _, tc := range []struct {
		addr string
		ctrl netip.Addr
		want string // "" = not registered
	}{
		{"127.0.0.1:9090", ctrl, ""},
		{"[::1]:9090", ctrl, ""},
		{"10.0.0.7:9091", ctrl, "10.0.0.7:9091"},
		{"0.0.0.0:9090", ctrl, "192.168.10.5:9090"},
		{"0.0.0.0:9090", netip.Addr{}, ""},
	} {
		ta, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		si, ok := inspectService(ta, tc.ctrl, "h1")
		switch {
		case tc.want == "" && ok:
			t.Errorf("%s: registered %s", tc.addr, si.Addr())
		case tc.want != "" && (!ok || si.Addr() != tc.want || si.ServiceName != "netplugin.inspect" || si.Hostname != "h1"):
			t.Errorf("%s: %+v %v, want %s", tc.addr, si, ok, tc.want)
		}
	}
}

// TestReadSecretOwner (review of 8124869): the token files netplugin reads with readSecret
// (--debug-token-file: its token detaches endpoints; --netmaster-token-file: this agent's
// token) are refused when another user owns them, as --inspect-token-file's are: their
// owner can read or rewrite them.
func TestReadSecretOwner(t *testing.T) {
	testroot.Need(t)
	p := filepath.Join(t.TempDir(), "debug.token")
	if err := os.WriteFile(p, []byte("0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := readSecret(p, "--debug-token-file"); err != nil || tok != "0123456789abcdef" {
		t.Fatalf("own file: %q %v", tok, err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := readSecret(p, "--debug-token-file"); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("a file owned by uid 65534: %v, want refused", err)
	}
}

// TestEncryptionFromCluster (issue 38): without --encryption netplugin takes the cluster's
// setting from the global config (waiting for it, as the agent does); given, the flag
// keeps its meaning; the setting wireguard on the ovs dataplane is refused at start,
// naming the cluster's setting (its traffic would go in clear).
func TestEncryptionFromCluster(t *testing.T) {
	store, _ := statetest.Store(t)
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	if err := store.Put(ctx, state.GlobalConfigKey, model.GlobConfig{ID: "global", FwdMode: "bridge", PvtSubnet: "172.19.0.0/16", Encryption: "wireguard"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
		err  string
	}{
		{nil, "wireguard", ""},
		{[]string{"--encryption", "none"}, "none", ""},
		{[]string{"--dataplane", "ovs"}, "", "the cluster's encryption setting wireguard"},
		{[]string{"--wireguard-port", "4789"}, "", "is --vxlan-port"},
	} {
		cfg, err := parse(t, append([]string{"--host-label", "h1", "--vtep-ip", "192.168.1.1"}, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		err = followedEncryption(ctx, &cfg, store, log)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: %v, want an error naming %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || cfg.encryption != c.want {
			t.Errorf("%v: encryption %q, %v; want %q", c.args, cfg.encryption, err, c.want)
		}
	}
	// A setting this build does not know (a newer netmaster's): refused at start, not
	// run as none (in clear); the flag still decides when given.
	if err := store.Put(ctx, state.GlobalConfigKey, model.GlobConfig{ID: "global", FwdMode: "bridge", PvtSubnet: "172.19.0.0/16", Encryption: "ipsec"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := parse(t, "--host-label", "h1", "--vtep-ip", "192.168.1.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := followedEncryption(ctx, &cfg, store, log); err == nil || !strings.Contains(err.Error(), `"ipsec"`) {
		t.Errorf("the cluster's setting ipsec: encryption %q, %v; want an error naming it", cfg.encryption, err)
	}
	cfg, err = parse(t, "--host-label", "h1", "--vtep-ip", "192.168.1.1", "--encryption", "none")
	if err != nil {
		t.Fatal(err)
	}
	if err := followedEncryption(ctx, &cfg, store, log); err != nil || cfg.encryption != "none" {
		t.Errorf("the cluster's setting ipsec, --encryption none: %q, %v", cfg.encryption, err)
	}
}
