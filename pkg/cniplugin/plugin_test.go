package cniplugin

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/contivbpf/contivbpf/pkg/cniapi"
)

// TestAddReportsFailedRollback: when netplugin cannot be reached, ADD fails with "try
// again later" and its details also say that the rollback detach failed (that error
// used to be dropped).
func TestAddReportsFailedRollback(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	err := Plugin{}.Add(&skel.CmdArgs{
		ContainerID: "cbx-undo",
		Netns:       "/proc/self/ns/net",
		IfName:      "eth0",
		StdinData:   []byte(`{"cniVersion":"1.0.0","name":"n","type":"contivk8s","socket":"` + sock + `","timeoutSeconds":2}`),
	})
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("Add err = %v (%T), want a *types.Error", err, err)
	}
	if te.Code != types.ErrTryAgainLater {
		t.Errorf("code = %d, want %d (try again later)", te.Code, types.ErrTryAgainLater)
	}
	if !strings.Contains(te.Details, "rollback: detach pod cbx-undo") {
		t.Errorf("details %q do not report the failed rollback", te.Details)
	}
}

// Without nameservers in the config, the result names the host's DNS responder (the
// gateway) when netplugin reports one; a configured nameserver wins.
func TestResultDNS(t *testing.T) {
	args := &skel.CmdArgs{IfName: "eth0", Netns: "/run/netns/x"}
	resp := cniapi.PodResponse{IPAddress: "10.1.1.2/24", Gateway: "10.1.1.1", DNS: "10.1.1.1", MAC: "02:02:0a:01:01:02", MTU: 1450}
	r, err := result(&NetConf{}, args, resp)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.DNS.Nameservers) != 1 || r.DNS.Nameservers[0] != "10.1.1.1" {
		t.Errorf("nameservers %v, want the gateway", r.DNS.Nameservers)
	}
	conf := &NetConf{}
	conf.DNS.Nameservers = []string{"10.96.0.10"}
	if r, _ := result(conf, args, resp); len(r.DNS.Nameservers) != 1 || r.DNS.Nameservers[0] != "10.96.0.10" {
		t.Errorf("nameservers %v, want the configured one", r.DNS.Nameservers)
	}
	resp.DNS = ""
	if r, _ := result(&NetConf{}, args, resp); len(r.DNS.Nameservers) != 0 {
		t.Errorf("nameservers %v without a responder", r.DNS.Nameservers)
	}
}
