package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

func (a *Agent) listing(w http.ResponseWriter, req *http.Request) {
	l, ok := a.cfg.Driver.(dataplane.Lister)
	if !ok {
		http.Error(w, "this dataplane has no decoded listings", http.StatusNotImplemented)
		return
	}
	limit := 0
	if s := req.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1_000_000 {
			http.Error(w, fmt.Sprintf("limit: %q is not a number of rows from 1 to 1000000", s), http.StatusBadRequest)
			return
		}
		limit = n
	}
	q := dataplane.ListQuery{Kind: mux.Vars(req)["kind"], Limit: limit}
	epg, group := req.URL.Query().Get("epg"), req.URL.Query().Get("group")
	switch {
	case (epg != "" || group != "") && q.Kind != "policy":
		http.Error(w, "epg, group: only the policy table is listed by group", http.StatusBadRequest)
		return
	case epg != "" && group != "":
		http.Error(w, "epg, group: give one of them", http.StatusBadRequest)
		return
	}
	if s := epg; s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 65535 {
			http.Error(w, fmt.Sprintf("epg: %q is not an endpoint group id from 1 to 65535", s), http.StatusBadRequest)
			return
		}
		q.EPG = uint16(n)
	}
	if s := group; s != "" {
		id, ok := a.groupID(s)
		if !ok {
			http.Error(w, fmt.Sprintf("group: no endpoint group %q (want <group>:<tenant>)", s), http.StatusNotFound)
			return
		}
		q.EPG = id
	}
	out, err := l.Listing(q)
	if err != nil {
		code := http.StatusInternalServerError
		if strings.HasPrefix(err.Error(), "unknown table") {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// groupID is the id of endpoint group key ("<group>:<tenant>") in the agent's records.
func (a *Agent) groupID(key string) (uint16, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.rec.epgs[key]
	if !ok || g.EndpointGroupID < 1 || g.EndpointGroupID > 65535 {
		return 0, false
	}
	return uint16(g.EndpointGroupID), true
}

// Handler serves netplugin's local REST API (Contiv's :9090) and /metrics:
//
//	GET /inspect/networks   networks programmed in the driver
//	GET /inspect/endpoints  {"local": [...], "remote": [...], "records": [oper records]}
//	GET /inspect/peers      VXLAN peers
//	GET /inspect/driver     the driver's Status (attachments, map/flow contents, counters)
//	GET /inspect/bpf/{kind} one datapath table decoded (endpoints, networks, peers, ct,
//	                        services, policy, counters; ?limit=N caps ct rows;
//	                        policy: ?epg=<id> or ?group=<group>:<tenant> for one group)
//	GET /inspect/agent      everything above from the agent plus errors and sync state
//	GET /inspect/verify     drift between the applied state and the live datapath
//	POST /inspect/trace     a packet run through the live datapath, nothing sent or changed
//	POST /inspect/trace-receive  a traced VXLAN frame run through this host's receive path
//	GET /monitor            dropped packets as JSON lines while connected (?endpoint=,
//	                        tenant=, reason=, policy=1), with endpoint names and the rule
//	GET /svcstats           services and the driver's counters
//	GET /healthz            200 "ok" once synced without errors, 503 otherwise: with the errors for a
//	                        caller the gate accepts, else their count by kind;
//	                        200 "degraded: ..." while etcd is unreachable (datapath still forwarding)
//	GET /livez              200 "ok" while the agent serves: the liveness probe's (a restart
//	                        fixes none of the objects /healthz reports, and a pod owner
//	                        fails one with a malformed bandwidth annotation)
//	GET /metrics            Prometheus
//	GET    /inspect/bgp                 the BGP session, routes learned and advertised
//	DELETE /debug/reclaimEndpoint/{id}  detach a local endpoint by Contiv endpoint id
//	GET /debug/pprof/...    Go's profiler (Config.Pprof)
//
// Everything but /healthz, /metrics and the debug route (its own token) is for callers
// Config.InspectAuth names admin or read-only (POST and the profiler: admin), or for
// anyone with Config.InspectOpen; with neither it answers 401 (gate.go).
//
// reg receives the agent's collector; pass a fresh registry per agent.
//
// bodyFirst (httpserve's, nil: none) reads request bodies within their caller's budget: it
// runs after the gate, so nobody's body is read before it is known whose it is.
func (a *Agent) Handler(reg *prometheus.Registry, bodyFirst func(http.Handler) http.Handler) http.Handler {
	reg.MustRegister(a.Collector())
	r := mux.NewRouter()
	a.routes(r, reg)
	if bodyFirst == nil {
		return a.gate(r)
	}
	return a.gate(bodyFirst(r))
}

// routes registers the inspect API's routes on r (/metrics serving reg).
func (a *Agent) routes(r *mux.Router, reg *prometheus.Registry) {
	r.HandleFunc("/inspect/networks", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, a.Inspect().Networks)
	}).Methods(http.MethodGet)
	r.HandleFunc("/inspect/endpoints", func(w http.ResponseWriter, _ *http.Request) {
		s := a.Inspect()
		writeJSON(w, http.StatusOK, map[string]any{"local": s.Endpoints, "remote": s.RemoteEndpoints, "records": a.LocalEndpoints()})
	}).Methods(http.MethodGet)
	r.HandleFunc("/inspect/peers", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, a.Inspect().Peers)
	}).Methods(http.MethodGet)
	r.HandleFunc("/inspect/bgp", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, a.BGP())
	}).Methods(http.MethodGet)
	r.HandleFunc("/inspect/agent", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, a.Inspect())
	}).Methods(http.MethodGet)
	r.HandleFunc("/inspect/driver", func(w http.ResponseWriter, req *http.Request) {
		st, err := a.DriverStatus(req.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, http.StatusOK, st)
	}).Methods(http.MethodGet)
	r.HandleFunc("/inspect/bpf/{kind}", a.listing).Methods(http.MethodGet)
	r.HandleFunc("/monitor", a.serveMonitor).Methods(http.MethodGet)
	r.HandleFunc("/inspect/verify", a.serveVerify).Methods(http.MethodGet)
	r.HandleFunc("/inspect/trace", a.serveTrace).Methods(http.MethodPost)
	r.HandleFunc("/inspect/trace-receive", a.serveTraceReceive).Methods(http.MethodPost)
	r.HandleFunc("/svcstats", func(w http.ResponseWriter, req *http.Request) {
		out := map[string]any{"services": a.Inspect().Services}
		if st, err := a.DriverStatus(req.Context()); err == nil {
			out["counters"] = st.Counters
		}
		writeJSON(w, http.StatusOK, out)
	}).Methods(http.MethodGet)
	r.HandleFunc("/healthz", func(w http.ResponseWriter, req *http.Request) {
		s := a.Inspect()
		if !s.Synced || len(s.Errors) > 0 {
			// The failing objects' names (tenants, networks, addresses) only for a caller
			// the gate accepted; anyone else learns how many of each kind.
			if _, ok := auth.FromContext(req.Context()); ok {
				writeJSON(w, http.StatusServiceUnavailable, map[string]any{"synced": s.Synced, "errors": s.Errors})
				return
			}
			kinds := map[string]int{}
			for k := range s.Errors {
				kind, _, _ := strings.Cut(k, "/")
				kinds[kind]++
			}
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"synced": s.Synced, "failing": kinds})
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		if a.cfg.Store != nil {
			ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
			h := a.cfg.Store.Health(ctx)
			cancel()
			if !h.Reachable {
				// Still 200: the datapath forwards its last state and restarting the
				// agent cannot bring etcd back; monitoring reads "degraded".
				_, _ = fmt.Fprintf(w, "degraded: etcd unreachable (%v); the datapath keeps forwarding its last state, new endpoints cannot be attached\n", h.Err)
				return
			}
		}
		if b := a.BGP(); b.NeighborStatus != "" && b.NeighborStatus != "established" {
			// Also 200: the host and its local traffic are fine; restarting the agent
			// cannot bring the neighbour back.
			_, _ = fmt.Fprintf(w, "degraded: BGP session %s (netctl bgp inspect shows it); natively routed traffic to other hosts has no routes until it is established\n", b.NeighborStatus)
			return
		}
		if e := a.cfg.Encryption; e != nil {
			if d := e.Degraded(); d != "" {
				// 200 too: the host forwards; only traffic to the peers named waiting is
				// dropped (fail closed) until their keys are known.
				_, _ = fmt.Fprintf(w, "degraded: %s\n", d)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	}).Methods(http.MethodGet)
	r.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	}).Methods(http.MethodGet)
	r.HandleFunc("/debug/reclaimEndpoint/{id}", a.reclaimEndpoint).Methods(http.MethodDelete)
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if a.cfg.Pprof {
		r.HandleFunc("/debug/pprof/profile", pprof.Profile)
		r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		r.HandleFunc("/debug/pprof/trace", pprof.Trace)
		r.PathPrefix("/debug/pprof/").HandlerFunc(pprof.Index)
	}
}

// reclaimEndpoint (DELETE /debug/reclaimEndpoint/{id}) detaches a local endpoint; it
// needs the --debug-token-file token and is off without one.
func (a *Agent) reclaimEndpoint(w http.ResponseWriter, req *http.Request) {
	if a.cfg.DebugToken == "" {
		http.Error(w, "forbidden: mutating debug routes are off; start netplugin with --debug-token-file to enable them", http.StatusForbidden)
		return
	}
	tok, ok := auth.BearerToken(req.Header.Get("Authorization"))
	if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(a.cfg.DebugToken)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="netplugin-debug"`)
		http.Error(w, "unauthorized: send the --debug-token-file token as \"Authorization: Bearer <token>\"", http.StatusUnauthorized)
		return
	}
	id := mux.Vars(req)["id"]
	for _, l := range a.LocalEndpoints() {
		if l.ID == id {
			if err := a.DetachEndpoint(req.Context(), DetachRequest{Tenant: l.Tenant, Network: l.Network, Group: l.Group, EndpointID: l.EndpointID}); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
	}
	writeJSON(w, http.StatusOK, "success")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
