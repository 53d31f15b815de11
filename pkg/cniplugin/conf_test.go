package cniplugin

import (
	"strings"
	"testing"
)

func TestParseConf(t *testing.T) {
	c, err := ParseConf([]byte(`{"cniVersion":"1.0.0","name":"n","type":"contivk8s","tenant":"blue","args":{"cni":{"io.contiv.network":"net1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Socket != "/run/contiv/contiv-cni.sock" || c.TimeoutSeconds != 60 || c.Tenant != "blue" {
		t.Fatalf("conf = %+v", c)
	}
	for in, want := range map[string]string{
		`{`:                                  "network config",
		`{"cniVersion":"1.0.0"}`:             `"name" is empty`,
		`{"name":"n","socket":"rel/x.sock"}`: `"socket"`,
		`{"name":"n","timeoutSeconds":-1}`:   `"timeoutSeconds"`,
		`{"name":"n","args":{"cni":{"io.contiv.tenant":3}}}`: "args.cni.io.contiv.tenant",
	} {
		if _, err := ParseConf([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseConf(%s) err = %v, want mention of %s", in, err, want)
		}
	}
}

func TestParseArgsAndPrecedence(t *testing.T) {
	a, err := ParseArgs("IgnoreUnknown=1;K8S_POD_NAME=p1;K8S_POD_NAMESPACE=ns;K8S_POD_INFRA_CONTAINER_ID=abc;io.contiv.tenant=t1;CONTIV_GROUP=web;FOO=bar")
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "p1" || a.Namespace != "ns" || a.InfraContainerID != "abc" || a.Tenant != "t1" || a.Group != "web" {
		t.Fatalf("args = %+v", a)
	}
	if _, err := ParseArgs("FOO=bar"); err == nil || !strings.Contains(err.Error(), "FOO") {
		t.Fatalf("unknown key accepted: %v", err)
	}
	if _, err := ParseArgs("novalue"); err == nil {
		t.Fatal("malformed CNI_ARGS accepted")
	}
	c, _ := ParseConf([]byte(`{"name":"n","tenant":"conf-t","network":"conf-n","group":"conf-g","args":{"cni":{"io.contiv.network":"args-n"}}}`))
	r := podRequest(c, a, "cid", "/ns", "eth0")
	if r.Tenant != "t1" || r.Network != "args-n" || r.Group != "web" || r.InfraContainerID != "abc" || r.NetNS != "/ns" {
		t.Fatalf("request = %+v", r)
	}
	r = podRequest(c, PodArgs{}, "cid", "/ns", "eth0")
	if r.Tenant != "conf-t" || r.Group != "conf-g" || r.InfraContainerID != "cid" {
		t.Fatalf("request without args = %+v", r)
	}
}
