package master

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/auth"
)

// TestQuotaNetprofilesCounted (review of the quota series): netprofiles link into the
// tenant object like networks and policies, so each create rewrites a tenant object that
// grows with them, yet no count bounded them, only bytes: a tenant-admin at netmaster's
// default quota made 3,000 of them (0.7 MB of records, 1% of its bytes) and took etcd's
// file from 20 KB to 247 MB; about 10,000 pass etcd's 2 GiB quota, which is issue 34's
// item 2 again. Under the defaults, the tenant-admin's netprofile past the default count
// must be refused (403 naming the kind), nothing written; deletes pass and the books hold.
func TestQuotaNetprofilesCounted(t *testing.T) {
	e := newEnv(t, "routing")
	e = newEnvOn(t, e.store, e.url, "routing", withQuota(DefaultQuota()))
	limit, ok := DefaultQuota()["netprofiles"]
	if !ok || limit <= 0 || limit > 500 {
		t.Fatalf("netmaster's default quota %v: no count of netprofiles (want one, like app profiles')", DefaultQuota())
	}
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1"}`, nil)
	bob := e.as(auth.Identity{Name: "bob", Role: "tenant-admin:t1", Via: "token"})
	profile := func(i int64) (int, string) {
		return bob.do("POST", fmt.Sprintf("/api/v1/netprofiles/t1:p%d/", i), fmt.Sprintf(`{"profileName":"p%d","tenantName":"t1","bandwidth":"10mbps"}`, i))
	}
	for i := int64(0); i < limit; i++ {
		if code, msg := profile(i); code != http.StatusOK {
			t.Fatalf("netprofile %d of %d: %d %s", i, limit, code, msg)
		}
	}
	before, rev := e.snapshot()
	if code, msg := profile(limit); code != http.StatusForbidden || !strings.Contains(msg, "netprofiles quota exceeded") {
		t.Fatalf("netprofile %d past the default limit %d: %d %s, want 403", limit+1, limit, code, msg)
	}
	if after, rev2 := e.snapshot(); after != before || rev2 != rev {
		t.Fatal("a refused netprofile changed etcd")
	}
	if u := e.checkBooks("t1"); u["netprofiles"] != limit {
		t.Errorf("netprofiles booked %d, want %d", u["netprofiles"], limit)
	}
	bob.ok("DELETE", "/api/v1/netprofiles/t1:p0/", nil, nil)
	if code, msg := profile(limit); code != http.StatusOK {
		t.Fatalf("netprofile after a delete: %d %s", code, msg)
	}
	if u := e.checkBooks("t1"); u["netprofiles"] != limit {
		t.Errorf("netprofiles booked %d after delete and create, want %d", u["netprofiles"], limit)
	}
}
