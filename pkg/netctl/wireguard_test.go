package netctl

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestWireGuardCommand (issue 38): `netctl wireguard ls` lists each host's published key
// (its start), endpoint and rotation state; `wireguard rotate <host>` asks for a new key,
// which ls then shows pending; a host without a record is netmaster's 404 naming host,
// a missing host a usage error.
func TestWireGuardCommand(t *testing.T) {
	url := startMaster(t)
	run := func(args ...string) result {
		t.Helper()
		return runNetctl(t, url, args...)
	}
	rec, _ := json.Marshal(model.WireGuardHost{Host: "h1", PublicKey: "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=", Endpoint: "192.0.2.1:51820"})
	resp, err := http.Post(url+"/plugin/publishWireGuard", "application/json", bytes.NewReader(rec))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("publish: %v %v", resp, err)
	}
	resp.Body.Close()
	const head = "Host  Key              Endpoint         Rotation\n----  ---              --------         --------\n"
	if r := run("wireguard", "ls"); r.code != 0 || r.stdout != head+"h1    AQIDBAUGBwgJ...  192.0.2.1:51820  -\n" {
		t.Fatalf("ls: %+v", r)
	}
	if r := run("wireguard", "rotate", "h1"); r.code != 0 || r.stdout != "Key rotation 1 of host h1 requested: pending until its agent publishes a new key\n" {
		t.Fatalf("rotate: %+v", r)
	}
	if r := run("wireguard", "ls"); r.code != 0 || r.stdout != head+"h1    AQIDBAUGBwgJ...  192.0.2.1:51820  pending 1\n" {
		t.Fatalf("ls after rotate: %+v", r)
	}
	var l []model.WireGuardHost
	if r := run("wireguard", "ls", "-j"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &l) != nil || len(l) != 1 || l[0].Rotate != 1 || l[0].Rotated != 0 {
		t.Fatalf("ls -j: %+v", r)
	}
	if r := run("wireguard", "rotate", "h9"); r.code != ExitAPI || !strings.Contains(r.stderr, `host: "h9" has no WireGuard record`) {
		t.Errorf("rotate a host without a record: %+v", r)
	}
	if r := run("wireguard", "rotate"); r.code != ExitUsage {
		t.Errorf("rotate without a host: %+v", r)
	}
}

// TestGlobalEncryptionCommand (issue 38): `netctl global set --encryption` sets the
// cluster's encryption, `global info` shows it, another value is netmaster's refusal
// naming the field, and a set without the flag keeps it.
func TestGlobalEncryptionCommand(t *testing.T) {
	url := startMaster(t)
	run := func(args ...string) result {
		t.Helper()
		return runNetctl(t, url, args...)
	}
	if r := run("global", "set", "--encryption", "wireguard"); r.code != 0 {
		t.Fatalf("set: %+v", r)
	}
	if r := run("global", "set", "-v", "1-3000"); r.code != 0 {
		t.Fatalf("set -v: %+v", r)
	}
	if r := run("global", "info"); r.code != 0 || !strings.HasSuffix(r.stdout, "Vlan Range: 1-3000\nVxlan range: 1-10000\nPrivate subnet: 172.19.0.0/16\nEncryption: wireguard\n") {
		t.Fatalf("info: %+v", r)
	}
	if r := run("global", "set", "--encryption", "ipsec"); r.code != ExitAPI || !strings.Contains(r.stderr, "encryption:") {
		t.Errorf("set ipsec: %+v", r)
	}
}
