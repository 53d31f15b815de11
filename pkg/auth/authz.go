package auth

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// globalCollections hold objects of no tenant: tenant-admins may read, not write them
// (but for the host collection, which they may not read either).
var globalCollections = map[string]bool{"globals": true, "Bgps": true, "aciGws": true}

// hostCollection reports whether coll holds per-host objects (a host's name, its router
// address and the routes it learns and advertises: every tenant's endpoint /32s; the
// hosts' scopes and deny lists), which are for admins, operators and agents only, like
// /info and /agents.
func hostCollection(coll string) bool {
	return coll == "Bgps" || coll == hostScopeCollection || coll == prefilterCollection
}

// hostScopeCollection holds the hosts' scopes (/api/v1/hostScopes/<host>/: which tenants
// a host's agent serves): admins set them; agents, operators and peers read them.
const hostScopeCollection = "hostScopes"

// prefilterCollection holds the deny list (/api/v1/prefilters/<name>/: source prefixes the
// hosts drop at their uplinks, per host or for all): admins set it; agents, operators and
// peers read it.
const prefilterCollection = "prefilters"

// Authorize decides whether id may send method to path (netmaster's routes).
func Authorize(id Identity, method, path string) error {
	read := method == http.MethodGet || method == http.MethodHead
	deny := func(why string) error {
		return fmt.Errorf("%s %q (role %s) may not %s %s: %s", viaWord(id), id.Name, id.Role, method, path, why)
	}
	if id.Role == RoleAdmin {
		return nil
	}
	switch {
	case strings.HasPrefix(path, "/plugin/"):
		if id.Role == RoleAgent {
			return nil
		}
		return deny("plugin routes are for netplugin agents")
	case strings.HasPrefix(path, "/api/v1/"):
		coll, key := splitObject(path)
		if read {
			if tenant, ok := id.Tenant(); ok && (coll == "endpoints" || key != "" && !Visible(coll, key, tenant)) {
				return deny("the object is not in tenant " + tenant)
			}
			return nil
		}
		switch id.Role {
		case RoleAgent:
			if coll == "networks" && key != "" {
				return nil // the Docker driver creates and deletes networks
			}
			return deny("agents write only networks and plugin routes")
		case RoleReadOnly, RoleNetmaster:
			return deny("read-only")
		}
		if tenant, ok := id.Tenant(); ok {
			switch {
			case key == "":
				return deny("no object named")
			case coll == "tenants" || globalCollections[coll]:
				return deny("tenants and global objects are for admins")
			case coll == quotaCollection:
				return deny("quotas are set by admins")
			case hostCollection(coll):
				return deny("host objects are for admins")
			case tenantOf(coll, key) != tenant:
				return deny("the object is not in tenant " + tenant)
			}
			return nil
		}
		return deny("unknown role")
	default:
		if !read {
			return deny("admin only")
		}
		if tenant, ok := id.Tenant(); ok {
			if why := tenantReadable(path, tenant); why != "" {
				return deny(why)
			}
		}
		return nil
	}
}

// tenantReadable says why a tenant-admin of tenant may not read path outside /api/v1
// ("" if it may). Only /version, /services (filtered by netmaster) and the tenant's own
// /service/<name>:<tenant> are; everything else (/info and /agents name hosts and their
// addresses, /metrics every tenant's networks, a route added later) is for the other
// roles. The answer depends on the path alone, so it never tells whether an object exists.
func tenantReadable(path, tenant string) string {
	switch {
	case path == "/version" || path == "/services":
		return ""
	case strings.HasPrefix(path, "/service/"):
		if serviceTenant(strings.TrimPrefix(path, "/service/")) != tenant {
			return "the service is not in tenant " + tenant
		}
		return ""
	case path == "/metrics":
		return "metrics name every tenant's objects: scrape with a read-only token"
	}
	return "host and cluster routes are for admins, operators and agents"
}

// serviceTenant is the tenant of a service id "<service>:<tenant>" ("" without one).
func serviceTenant(id string) string {
	i := strings.LastIndexByte(id, ':')
	if i < 0 {
		return ""
	}
	return id[i+1:]
}

func viaWord(id Identity) string {
	if strings.HasPrefix(id.Via, "certificate") {
		return "certificate"
	}
	return "caller"
}

// splitObject returns the collection and key of /api/v1/<coll>/<key>/ (or of
// /api/v1/inspect/<coll>/<key>/); key is "" for a collection.
func splitObject(path string) (coll, key string) {
	rest := strings.Trim(strings.TrimPrefix(path, "/api/v1/"), "/")
	rest = strings.TrimPrefix(rest, "inspect/")
	coll, key, _ = strings.Cut(rest, "/")
	return coll, key
}

// Visible reports whether object key of collection coll may be shown to a tenant-admin
// of tenant (list filtering): its own objects and the global ones but the hosts'.
func Visible(coll, key, tenant string) bool {
	if hostCollection(coll) {
		return false
	}
	return globalCollections[coll] || tenantOf(coll, key) == tenant
}

// quotaCollection holds the tenants' quotas (/api/v1/quotas/<tenant>/): a tenant-admin
// reads its own tenant's, only admins set them.
const quotaCollection = "quotas"

// tenantOf is the tenant an object key belongs to: the key itself for tenants and their
// quotas, else the part before the first ':' ("<tenant>:<name>", "<tenant>:<policy>:<rule>").
func tenantOf(coll, key string) string {
	if coll == "tenants" || coll == quotaCollection {
		return key
	}
	t, _, ok := strings.Cut(key, ":")
	if !ok {
		return "" // never equal to a tenant-admin's tenant
	}
	return t
}

// Middleware authenticates and authorizes every request (401 without valid credentials,
// 403 for the wrong role, both with a message), puts the identity in the request context
// and writes an audit line for every write.
func Middleware(c Config, log *slog.Logger, next http.Handler) http.Handler {
	// (A budget each: a flood of 401s hides no token holder's 403s.)
	refusals := &logBudget{every: time.Second, burst: 10}
	forbidden := &logBudget{every: time.Second, burst: 10}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := c.Authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="netmaster"`)
			http.Error(w, "unauthorized: "+err.Error(), http.StatusUnauthorized)
			// Every refusal is logged, reads too, but a flood of them is not a flood of
			// lines: 10 a second, the rest counted into the next line.
			if ok, dropped := refusals.take(time.Now()); ok {
				log.Warn("audit", "who", "?", "from", r.RemoteAddr, "method", r.Method, "path", logPath(r.URL.Path),
					"status", http.StatusUnauthorized, "err", err.Error(), "unlogged_before", dropped)
			}
			return
		}
		if err := Authorize(id, r.Method, r.URL.Path); err != nil {
			http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
			if ok, dropped := forbidden.take(time.Now()); ok {
				log.Warn("audit", "who", id.Name, "role", id.Role, "via", id.Via, "method", r.Method, "path", logPath(r.URL.Path),
					"status", http.StatusForbidden, "unlogged_before", dropped)
			}
			return
		}
		r = r.WithContext(WithIdentity(r.Context(), id))
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(sw, r)
		log.Info("audit", "who", id.Name, "role", id.Role, "via", id.Via, "method", r.Method, "path", r.URL.Path, "status", sw.code)
	})
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// CallerOf names a request's caller for the body budgets: its authenticated identity and
// the host it calls from. Identities are shared (every agent holding the same unnamed
// token, every caller of an --insecure netmaster), and one host announcing bodies it
// never sends must not take the others' budget.
func CallerOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	id, ok := FromContext(r.Context())
	if !ok {
		return "@" + host
	}
	return id.Via + ":" + id.Name + "@" + host
}

// maxLogPath is how much of a refused request's path its log line keeps: the budget counts
// lines, and a path may fill the server's 64 KiB of headers.
const maxLogPath = 256

func logPath(p string) string {
	if len(p) <= maxLogPath {
		return p
	}
	return fmt.Sprintf("%s…(%d bytes)", strings.ToValidUTF8(p[:maxLogPath], ""), len(p))
}

// logBudget lets burst log lines through per period every and counts the rest, which the
// next line let through reports.
type logBudget struct {
	every   time.Duration
	burst   int
	mu      sync.Mutex
	start   time.Time
	used    int
	dropped int
}

// take says whether a line may be logged at now, and how many were not since the last one.
func (b *logBudget) take(now time.Time) (bool, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.start) >= b.every {
		b.start, b.used = now, 0
	}
	if b.used >= b.burst {
		b.dropped++
		return false, 0
	}
	b.used++
	d := b.dropped
	b.dropped = 0
	return true, d
}
