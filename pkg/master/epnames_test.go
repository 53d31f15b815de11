package master

import (
	"context"
	"net/http"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestEndpointNameIndexBuilt: endpoints a build without the name index created (no records,
// no built marker) still hold their names: the next create is checked against them (409
// naming the field), their records are written and the index is marked built; a stale
// record (its endpoint gone) does not block the name.
func TestEndpointNameIndexBuilt(t *testing.T) {
	e := newEnv(t, "bridge")
	e.ok("POST", "/api/v1/tenants/t1/", model.Tenant{TenantName: "t1"}, nil)
	e.net("t1", "n1", "vxlan", "10.5.1.0/24", "", 0)
	old := e.createEP("t1", "n1", "", "a1", "")
	ctx := context.Background()
	if _, err := e.raw.Delete(ctx, model.EpNamePrefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.raw.Delete(ctx, model.EpNameIndexBuiltKey); err != nil {
		t.Fatal(err)
	}
	st, body := e.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "t1", NetworkName: "n1",
		EndpointID: "b1", EPCommonName: old.EPCommonName, ConfigEP: model.ConfigEP{Container: "b1", Host: "host2"}})
	if st != http.StatusConflict || !strings.Contains(body, "EPCommonName: name") {
		t.Fatalf("a name an unindexed endpoint holds: %d %s, want 409", st, body)
	}
	e.createEP("t1", "n1", "", "b2", "")
	if got := e.rawGet(model.EpNameKey("t1", old.EPCommonName)); !strings.Contains(got, old.ID) {
		t.Errorf("the unindexed endpoint's record: %q, want %s", got, old.ID)
	}
	if e.rawGet(model.EpNameIndexBuiltKey) == "" {
		t.Errorf("the index is not marked built")
	}
	// A stale record: its endpoint is gone without its records.
	if _, err := e.raw.Put(ctx, model.EpNameKey("t1", "ghost"), `"n1.t1-gone"`); err != nil {
		t.Fatal(err)
	}
	st, body = e.do("POST", "/plugin/createEndpoint", model.CreateEndpointRequest{TenantName: "t1", NetworkName: "n1",
		EndpointID: "b3", EPCommonName: "ghost", ConfigEP: model.ConfigEP{Container: "b3", Host: "host2"}})
	if st != http.StatusOK {
		t.Errorf("a name held by a stale record: %d %s, want 200", st, body)
	}
}
