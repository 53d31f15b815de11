package master

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
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

// recreateAsOldBuild does what a build without the index does when it deletes network
// name of tenant and creates it again on subnet (a /24 "a.b.c.0"): the network's model and
// state records go and come back, and a VLAN network's VLAN is given back and taken again
// (the VLANs' oper record rewritten, the same VLAN in use); the index is not touched.
func recreateAsOldBuild(t *testing.T, e *env, tenant, name, subnet string) {
	t.Helper()
	ctx := context.Background()
	var n model.Network
	var ns model.CfgNetworkState
	nKey, sKey := model.ModelKey(model.TypeNetwork, tenant+":"+name), model.NetStateKey(model.NetworkID(name, tenant))
	if err := json.Unmarshal([]byte(e.rawGet(nKey)), &n); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(e.rawGet(sKey)), &ns); err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSuffix(subnet, "0/24")
	n.Subnet, ns.SubnetIP, ns.IPAddrRange = subnet, base+"0", base+"1-"+base+"254"
	for _, k := range []string{nKey, sKey} {
		if _, err := e.raw.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if ns.PktTagType == "vlan" {
		if _, err := e.raw.Put(ctx, model.VlanResOperKey, e.rawGet(model.VlanResOperKey)); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range map[string]any{nKey: n, sKey: ns} {
		b, _ := json.Marshal(v)
		if _, err := e.raw.Put(ctx, k, string(b)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSubnetIndexStaleRecreated (review of issue 34's subnet check): a build without the
// index that deletes a network and creates one of the same name on another subnet leaves
// the tenant's records naming exactly the tenant's networks, one of them with the old
// subnet. The check trusted it by name, so a create on the new network's subnet passed:
// two networks of one tenant on one subnet. A record older than its network's model
// record (written before the network was created again) is stale.
func TestSubnetIndexStaleRecreated(t *testing.T) {
	e := newEnv(t, "routing")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	e.net("t1", "a", "vxlan", "10.33.1.0/24", "", 0)
	e.net("t1", "b", "vxlan", "10.33.2.0/24", "", 0)
	recreateAsOldBuild(t, e, "t1", "b", "10.33.3.0/24")
	code, msg := e.do("POST", "/api/v1/networks/t1:c/", model.Network{TenantName: "t1", NetworkName: "c", Encap: "vxlan", Subnet: "10.33.3.0/25"})
	if code != http.StatusConflict || !strings.Contains(msg, "overlaps network b.t1") {
		t.Fatalf("a subnet overlapping a network an older build created again on another subnet: %d %s, want 409", code, msg)
	}
	// A create that succeeds repairs the record (b's old subnet is free); the next still
	// sees b.
	e.net("t1", "e", "vxlan", "10.33.2.0/24", "", 0)
	var r model.SubnetRecord
	if err := json.Unmarshal([]byte(e.rawGet(model.SubnetIndexTenantPrefix("t1")+"b.t1")), &r); err != nil || r.SubnetIP != "10.33.3.0" {
		t.Errorf("b's record after a create: %+v (%v), want 10.33.3.0", r, err)
	}
	code, msg = e.do("POST", "/api/v1/networks/t1:d/", model.Network{TenantName: "t1", NetworkName: "d", Encap: "vxlan", Subnet: "10.33.3.128/25"})
	if code != http.StatusConflict || !strings.Contains(msg, "overlaps network b.t1") {
		t.Errorf("after the repair: %d %s, want 409", code, msg)
	}
}

// TestSubnetIndexStaleRecreatedVLAN: the same in routing mode across tenants. An older
// build that deletes a VLAN network and creates it again on the same VLAN and another
// subnet leaves the VLANs in use as they were, and the VLAN record with the old subnet:
// another tenant's VLAN network on the new subnet passed, both routed natively. The VLAN
// records are trusted only while their guard record is as new as the VLANs' oper record,
// and not while a repair of more than a batch of them is left to finish.
func TestSubnetIndexStaleRecreatedVLAN(t *testing.T) {
	e := newEnv(t, "routing")
	for _, tn := range []string{"t1", "t2"} {
		e.ok("POST", "/api/v1/tenants/"+tn+"/", `{"tenantName":"`+tn+`"}`, nil)
	}
	create := func(tenant, name, subnet string) (int, string) {
		return e.do("POST", "/api/v1/networks/"+tenant+":"+name+"/", model.Network{TenantName: tenant, NetworkName: name, Encap: "vlan", Subnet: subnet})
	}
	e.net("t1", "v1", "vlan", "10.34.1.0/24", "", 0)
	recreateAsOldBuild(t, e, "t1", "v1", "10.34.9.0/24")
	if code, msg := create("t2", "w1", "10.34.9.0/24"); code != http.StatusConflict || !strings.Contains(msg, "another tenant") {
		t.Fatalf("a VLAN subnet overlapping another tenant's VLAN network an older build created again: %d %s, want 409", code, msg)
	}
	// More stale records than one transaction repairs: the next check after a partial
	// repair still rebuilds.
	const n = subnetRepairBatch + 10
	for i := range n {
		e.net("t1", fmt.Sprintf("m%02d", i), "vlan", fmt.Sprintf("10.35.%d.0/24", i), "", 0)
	}
	for i := range n {
		recreateAsOldBuild(t, e, "t1", fmt.Sprintf("m%02d", i), fmt.Sprintf("10.36.%d.0/24", i))
	}
	e.net("t2", "w2", "vlan", "10.37.1.0/24", "", 0) // (repairs a batch)
	if code, msg := create("t2", "w3", fmt.Sprintf("10.36.%d.0/24", n-1)); code != http.StatusConflict || !strings.Contains(msg, "another tenant") {
		t.Errorf("a VLAN subnet overlapping a network whose stale record a partial repair left: %d %s, want 409", code, msg)
	}
	// A guard record that does not decode, rewritten by a delete (which does not check),
	// stays marked for a rebuild.
	if _, err := e.raw.Put(context.Background(), model.SubnetIndexVLANGuardKey, "{not json"); err != nil {
		t.Fatal(err)
	}
	e.ok("DELETE", "/api/v1/networks/t2:w2/", nil, nil)
	var g model.SubnetIndexGuard
	if err := json.Unmarshal([]byte(e.rawGet(model.SubnetIndexVLANGuardKey)), &g); err != nil || !g.Partial {
		t.Errorf("an unreadable VLAN guard after a delete: %+v (%v), want it marked Partial", g, err)
	}
	e.net("t2", "w4", "vlan", "10.37.2.0/24", "", 0) // (repairs the rest)
	var r model.SubnetRecord
	if err := json.Unmarshal([]byte(e.rawGet(model.SubnetIndexVLANPrefix+fmt.Sprintf("m%02d.t1", n-1))), &r); err != nil || r.SubnetIP != fmt.Sprintf("10.36.%d.0", n-1) {
		t.Errorf("the last stale record after two creates: %+v (%v), want repaired", r, err)
	}
}

// TestSubnetCheckOldBuildInFlight (review of issue 34's subnet check): the records are
// read unguarded, and a build without the index does not rewrite their guard record, yet
// a network it creates while a create of this build is between its reads and its commit
// is seen: every such build rewrites the tenant's model record (its link-sets) with each
// network it creates, which saveNetwork reads with a guard (requireTenant), and every
// build since the quotas rewrites the tenant's usage record, which account reads with
// one. The check below is saveNetwork's reads; the older build's create rewrites the
// tenant record and writes the network's model and state records, not the index.
func TestSubnetCheckOldBuildInFlight(t *testing.T) {
	e := newEnv(t, "routing")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	e.net("t1", "a", "vxlan", "10.38.1.0/24", "", 0)
	ctx := context.Background()
	oldCreate := func() error {
		tKey := model.ModelKey(model.TypeTenant, "t1")
		n, _ := json.Marshal(model.Network{Key: "t1:b", TenantName: "t1", NetworkName: "b", Encap: "vxlan", Subnet: "10.38.2.0/24"})
		ns, _ := json.Marshal(model.CfgNetworkState{ID: "b.t1", Tenant: "t1", NetworkName: "b", PktTagType: "vxlan", SubnetIP: "10.38.2.0", SubnetLen: 24})
		_, err := e.raw.Txn(ctx).Then(clientv3.OpPut(tKey, e.rawGet(tKey)),
			clientv3.OpPut(model.ModelKey(model.TypeNetwork, "t1:b"), string(n)), clientv3.OpPut(model.NetStateKey("b.t1"), string(ns))).Commit()
		return err
	}
	runs := 0
	var seen map[string]model.SubnetRecord
	err := e.store.Update(ctx, func(tx *state.Tx) error {
		runs++
		if err := requireTenant(tx, "t1"); err != nil {
			return err
		}
		var err error
		if seen, err = tenantSubnets(tx, "t1"); err != nil {
			return err
		}
		if runs == 1 {
			if err := oldCreate(); err != nil {
				return err
			}
		}
		return tx.Put(model.SubnetIndexPrefix+"test", model.SubnetIndexGuard{})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := seen["b.t1"]; runs != 2 || !ok {
		t.Errorf("an older build's create in flight: the check ran %d times and saw %v, want 2 runs and b.t1", runs, slices.Collect(maps.Keys(seen)))
	}
}
