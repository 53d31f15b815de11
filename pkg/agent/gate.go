package agent

import (
	"errors"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/auth"
)

// InspectAuthenticator names the caller of a request to the inspect API (pkg/auth.Config
// does: bearer tokens of a token file in netmaster's format).
type InspectAuthenticator interface {
	Authenticate(r *http.Request) (auth.Identity, error)
}

// openPaths are the inspect API's routes served to anyone: health and liveness for probes,
// counters for Prometheus (no tenant's names or addresses in any: /healthz names the
// failing objects only to a caller the gate accepts). Exact paths only: any other spelling
// of them goes through the gate.
var openPaths = map[string]bool{"/healthz": true, "/livez": true, "/metrics": true}

// errInspectOff is the answer of the gated routes when netplugin was started with neither
// a token file nor --inspect-insecure.
var errInspectOff = errors.New("the inspect API needs credentials: start netplugin with --inspect-token-file (tokens in netmaster's token file format, role admin or read-only) or, where every local process may read every tenant's flows, --inspect-insecure")

// inspectAllowed says whether id may send method to the gated routes: they show every
// tenant's endpoints, flows and rules, so reading them is for admin and read-only
// identities; running a trace (POST) and the profiler for admin.
func inspectAllowed(id auth.Identity, method, p string) error {
	read := method == http.MethodGet || method == http.MethodHead
	switch {
	case strings.HasPrefix(id.Via, "peer:"):
		// A netmaster token's forwarded caller: netmaster forwards to netmasters only.
		return fmt.Errorf("identities forwarded by a netmaster (%s) may not use the inspect API", id.Via)
	case id.Role == auth.RoleAdmin:
		return nil
	case id.Role == auth.RoleReadOnly && read && !strings.HasPrefix(p, "/debug/"):
		return nil
	case id.Role == auth.RoleReadOnly:
		return fmt.Errorf("role %s may only read the inspect API (GET)", id.Role)
	}
	return fmt.Errorf("role %s may not use the inspect API (it shows every tenant's flows): admin or read-only only", id.Role)
}

// gate serves openPaths and the debug routes (which check their own token) as they are and
// everything else only to callers Config.InspectAuth accepts (401 without valid
// credentials, 403 for another role), or to anyone with Config.InspectOpen; the caller's
// identity goes into the request's context (auth.CallerOf: the body budgets are charged
// to it, and no body is read before the gate).
func (a *Agent) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if a.cfg.InspectOpen {
			next.ServeHTTP(w, r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{Name: "anonymous", Role: auth.RoleAdmin, Via: "insecure"})))
			return
		}
		if openPaths[p] || (strings.HasPrefix(p, "/debug/reclaimEndpoint/") && path.Clean(p) == p) {
			// (With credentials the gate accepts, the caller is named all the same.)
			if a.cfg.InspectAuth != nil && !strings.HasPrefix(p, "/debug/") {
				if id, err := a.cfg.InspectAuth.Authenticate(r); err == nil && inspectAllowed(id, r.Method, p) == nil {
					r = r.WithContext(auth.WithIdentity(r.Context(), id))
				}
			}
			next.ServeHTTP(w, r)
			return
		}
		if a.cfg.InspectAuth == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="netplugin"`)
			http.Error(w, "unauthorized: "+errInspectOff.Error(), http.StatusUnauthorized)
			return
		}
		id, err := a.cfg.InspectAuth.Authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="netplugin"`)
			http.Error(w, "unauthorized: "+err.Error(), http.StatusUnauthorized)
			return
		}
		if err := inspectAllowed(id, r.Method, p); err != nil {
			a.log.Warn("inspect API refused", "who", id.Name, "role", id.Role, "method", r.Method, "path", p)
			http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r.WithContext(auth.WithIdentity(r.Context(), id)))
	})
}
