package auth

import (
	"net/http/httptest"
	"testing"
)

// TestCallerOfSeparatesHosts (found by review): the body budgets' caller is the identity
// and the host: agents sharing one unnamed token, or every caller of an --insecure
// netmaster, do not share one budget, so one host announcing bodies it never sends
// cannot starve the others.
func TestCallerOfSeparatesHosts(t *testing.T) {
	req := func(remote string, id *Identity) string {
		r := httptest.NewRequest("POST", "/plugin/createEndpoint", nil)
		r.RemoteAddr = remote
		if id != nil {
			r = r.WithContext(WithIdentity(r.Context(), *id))
		}
		return CallerOf(r)
	}
	agent := &Identity{Name: "agent", Role: "agent", Via: "token"}
	if req("10.0.0.1:4000", agent) == req("10.0.0.2:4000", agent) {
		t.Error("one identity on two hosts shares a budget")
	}
	if req("10.0.0.1:4000", agent) != req("10.0.0.1:5000", agent) {
		t.Error("one identity on one host splits into a budget per connection")
	}
	if req("10.0.0.1:4000", nil) == req("10.0.0.2:4000", nil) {
		t.Error("unauthenticated (--insecure) callers of two hosts share a budget")
	}
}
