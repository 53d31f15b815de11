package main

import (
	"strings"
	"testing"

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
		cfg.dataplane != "ebpf" || cfg.bpffsRoot != "/sys/fs/bpf/contivbpf" || cfg.inspectListen != ":9090" {
		t.Fatalf("config = %+v", cfg)
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
	} {
		_, err := parse(t, append([]string{"--host", "h", "--vtep-ip", "10.0.0.1"}, tc.args...)...)
		if tc.args[0] == "--vtep-ip" {
			_, err = parse(t, "--host", "h", "--vtep-ip", tc.args[1])
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want mention of %s", tc.args, err, tc.want)
		}
	}
}
