package master

import (
	"context"
	"net/http"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestSubnetIndexStale (review of the subnet index): the index is rebuilt only when its
// record is missing, so one that exists but misses a network is trusted. That is what a
// build without the index leaves behind while it runs next to one with it (a rolling
// upgrade: leader and follower of two builds) or after a rollback and upgrade: its
// creates and deletes do not touch the index. A network it created was then invisible to
// overlap checks (a second network on the same subnet in one tenant; in routing mode
// another tenant's VLAN network on a VLAN network's subnet, both routed natively), and one
// it deleted kept its subnet taken for good. The tenant's record must agree with the
// tenant's networks and the VLAN record with the VLANs in use, or be rebuilt.
func TestSubnetIndexStale(t *testing.T) {
	e := newEnv(t, "routing")
	for _, tn := range []string{"t1", "t2", "t3"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	// oldBuild runs fn as a build without the index would: the index records stay as
	// they were.
	oldBuild := func(fn func()) {
		t.Helper()
		ctx := context.Background()
		was, err := e.raw.Get(ctx, model.SubnetIndexPrefix, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		fn()
		if _, err := e.raw.Delete(ctx, model.SubnetIndexPrefix, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
		for _, kv := range was.Kvs {
			if _, err := e.raw.Put(ctx, string(kv.Key), string(kv.Value)); err != nil {
				t.Fatal(err)
			}
		}
	}
	create := func(tenant, name, encap, subnet string) (int, string) {
		return e.do("POST", "/api/v1/networks/"+tenant+":"+name+"/", model.Network{TenantName: tenant, NetworkName: name, Encap: encap, Subnet: subnet})
	}
	e.net("t1", "a", "vxlan", "10.31.1.0/24", "", 0)
	oldBuild(func() { e.net("t1", "b", "vxlan", "10.31.2.0/24", "", 0) })
	if code, msg := create("t1", "c", "vxlan", "10.31.2.0/25"); code != http.StatusConflict || !strings.Contains(msg, "overlaps network b.t1") {
		t.Errorf("a subnet overlapping a network an older build created: %d %s, want 409", code, msg)
	}
	oldBuild(func() { e.ok("DELETE", "/api/v1/networks/t1:a/", nil, nil) })
	if code, msg := create("t1", "a2", "vxlan", "10.31.1.0/24"); code != http.StatusOK {
		t.Errorf("the subnet of a network an older build deleted: %d %s, want 200", code, msg)
	}
	// Routing mode: VLAN networks of all tenants.
	e.net("t1", "v1", "vlan", "10.32.1.0/24", "", 0)
	oldBuild(func() { e.net("t2", "v2", "vlan", "10.32.2.0/24", "", 0) })
	if code, msg := create("t3", "v3", "vlan", "10.32.2.0/24"); code != http.StatusConflict || !strings.Contains(msg, "overlaps a network of another tenant") {
		t.Errorf("a VLAN subnet overlapping another tenant's VLAN network an older build created: %d %s, want 409", code, msg)
	}
	oldBuild(func() { e.ok("DELETE", "/api/v1/networks/t1:v1/", nil, nil) })
	if code, msg := create("t3", "v4", "vlan", "10.32.1.0/24"); code != http.StatusOK {
		t.Errorf("the VLAN subnet of a network an older build deleted: %d %s, want 200", code, msg)
	}
}
