package master

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestNetworkCreateBytesDoNotGrow: a network create writes what the first one did, however
// many networks its tenant (its subnet index record) or the cluster (the VLAN index record,
// every tenant's VLAN networks) has: issue 34's "creating an object writes O(1) bytes
// regardless of how many the tenant has". The subnet index records are rewritten whole.
func TestNetworkCreateBytesDoNotGrow(t *testing.T) {
	const n, window = 120, 10
	e := newEnv(t, "bridge")
	for _, encap := range []string{"vxlan", "vlan"} {
		t.Run(encap, func(t *testing.T) {
			// VLAN networks spread over tenants: each tenant's own index stays small, the
			// VLAN index (every tenant's VLAN networks) grows.
			tenants := 1
			if encap == "vlan" {
				tenants = 12
			}
			for j := 0; j < tenants; j++ {
				tn := fmt.Sprintf("t-%s-%d", encap, j)
				e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
			}
			revs := []int64{e.rev()}
			for i := 0; i < n; i++ {
				e.net(fmt.Sprintf("t-%s-%d", encap, i%tenants), fmt.Sprintf("n%d", i), encap, fmt.Sprintf("10.%d.%d.0/24", 1+i/250, i%250), "", 0)
				revs = append(revs, e.rev())
			}
			per := putBytesPer(t, e.raw, revs)
			first, last := 0, 0
			for i, b := range per {
				if i < window {
					first += b["state/subnetidx"]
				} else if i >= n-window {
					last += b["state/subnetidx"]
				}
			}
			first, last = first/window, last/window
			t.Logf("%s: subnet index bytes per network create: first %d: %d, last %d: %d", encap, window, first, window, last)
			if last > first+64 {
				t.Errorf("%s: the %dth network create writes %d bytes of subnet index, the first %d", encap, n, last, first)
			}
		})
	}
}

// TestStoredNetprofileLinksForOldBuild: a build before 55bf8ba pushes a netprofile's new
// limits (PUT of the netprofile) only into the groups its stored link-set names
// (others.go: "for k := range p.LinkSets.EndpointGroups"). With this build beside it (a
// rolling upgrade) or after a rollback, groups this build made with the netprofile, and
// every group once stripStoredLinks ran, are missing there: the old build's update leaves
// their DSCP/bandwidth as they were.
func TestStoredNetprofileLinksForOldBuild(t *testing.T) {
	e := newEnv(t, "bridge")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	e.net("t1", "n1", "vxlan", "10.1.1.0/24", "", 0)
	e.ok("POST", "/api/v1/netprofiles/t1:np/", `{"bandwidth":"10mbps","burst":100,"profileName":"np","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/endpointGroups/t1:g1/", `{"groupName":"g1","networkName":"n1","netProfile":"np","tenantName":"t1"}`, nil)
	var stored model.Netprofile
	if err := json.Unmarshal([]byte(e.rawGet(model.ModelKey(model.TypeNetprofile, "t1:np"))), &stored); err != nil {
		t.Fatal(err)
	}
	if _, ok := stored.LinkSets.EndpointGroups["t1:g1"]; !ok {
		t.Errorf("stored netprofile %s: an old build's netprofile update would not reach group t1:g1", e.rawGet(model.ModelKey(model.TypeNetprofile, "t1:np")))
	}
}
