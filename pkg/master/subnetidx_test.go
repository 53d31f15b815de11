package master

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestSubnetIndex: a network's subnets are checked against its tenant's record of the
// subnet index (and in routing mode a VLAN network's against every VLAN network), kept
// with creates and deletes; a missing record (networks of an earlier build) is rebuilt
// from the network states; a tenant's record goes with the tenant.
func TestSubnetIndex(t *testing.T) {
	e := newEnv(t, "routing")
	e.ok("POST", "/api/v1/tenants/t2/", model.Tenant{TenantName: "t2"}, nil)
	e.net("default", "n1", "vxlan", "10.1.1.0/24", "", 0)
	e.net("default", "n2", "vlan", "10.1.2.0/24", "", 0)
	e.net("t2", "m1", "vxlan", "10.1.1.0/24", "", 0) // (another tenant: may overlap)
	index := func(key string) model.SubnetIndex {
		t.Helper()
		var idx model.SubnetIndex
		raw := e.rawGet(key)
		if raw == "" {
			return idx // (not built yet)
		}
		if err := json.Unmarshal([]byte(raw), &idx); err != nil {
			t.Fatalf("index %s: %v", key, err)
		}
		return idx
	}
	if idx := index(model.SubnetIndexKey("default")); len(idx.Nets) != 2 || idx.Nets["n1.default"].SubnetIP != "10.1.1.0" {
		t.Fatalf("default's index %+v", idx)
	}
	if idx := index(model.VLANSubnetIndexKey); len(idx.Nets) != 1 || idx.Nets["n2.default"].SubnetLen != 24 {
		t.Fatalf("VLAN index %+v", idx)
	}
	refused := func(tenant, name, encap, subnet, want string) {
		t.Helper()
		code, out := e.do("POST", "/api/v1/networks/"+tenant+":"+name+"/", model.Network{TenantName: tenant,
			NetworkName: name, Encap: encap, Subnet: subnet})
		if code != http.StatusConflict || !strings.Contains(out, want) {
			t.Fatalf("%s:%s %s: %d %s, want 409 %q", tenant, name, subnet, code, out, want)
		}
	}
	refused("default", "n3", "vxlan", "10.1.0.0/16", "overlaps network n1.default (10.1.1.0/24)")
	refused("default", "n3", "vxlan", "10.1.2.128/25", "overlaps network n2.default")
	// Routing mode: VLAN networks may not overlap across tenants (not named).
	refused("t2", "m2", "vlan", "10.1.2.0/25", "overlaps a network of another tenant")
	e.net("t2", "m2", "vxlan", "10.1.2.0/25", "", 0) // (a VXLAN one may)

	// An earlier build's networks: no record; it is rebuilt on the next create.
	for _, k := range []string{model.SubnetIndexKey("default"), model.VLANSubnetIndexKey} {
		if _, err := e.raw.Delete(context.Background(), k); err != nil {
			t.Fatal(err)
		}
	}
	refused("default", "n3", "vxlan", "10.1.1.0/23", "overlaps network n1.default")
	refused("t2", "m3", "vlan", "10.1.2.128/25", "overlaps a network of another tenant")
	e.net("default", "n3", "vxlan", "10.1.3.0/24", "", 0)
	if idx := index(model.SubnetIndexKey("default")); len(idx.Nets) != 3 {
		t.Fatalf("rebuilt index %+v", idx)
	}
	// Deletes leave the index; the subnet is free again.
	e.ok("DELETE", "/api/v1/networks/default:n1/", nil, nil)
	if idx := index(model.SubnetIndexKey("default")); len(idx.Nets) != 2 {
		t.Fatalf("index after delete %+v", idx)
	}
	e.net("default", "n4", "vxlan", "10.1.1.0/25", "", 0)
	e.ok("DELETE", "/api/v1/networks/default:n2/", nil, nil)
	if idx := index(model.VLANSubnetIndexKey); len(idx.Nets) != 0 {
		t.Fatalf("VLAN index after delete %+v", idx)
	}
	e.net("t2", "m3", "vlan", "10.1.2.128/25", "", 0)
	// The tenant's record goes with the tenant.
	for _, n := range []string{"m1", "m2", "m3"} {
		e.ok("DELETE", "/api/v1/networks/t2:"+n+"/", nil, nil)
	}
	e.ok("DELETE", "/api/v1/tenants/t2/", nil, nil)
	if got := e.rawGet(model.SubnetIndexKey("t2")); got != "" {
		t.Fatalf("tenant t2's index left: %s", got)
	}
}
