package cluster

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// apiMetrics count netmaster's requests by route (a bounded label: collection names and
// plugin operations are from fixed lists, anything else is "other"), method and status.
type apiMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// bodies reports the request body bytes held in memory and the requests refused for
	// their budgets (httpserve.Server.BodyBytesHeld); set once the server exists.
	bodies func() (int64, uint64)
}

// bodyCollector exports apiMetrics.bodies.
type bodyCollector struct{ m *apiMetrics }

var (
	bodyHeldDesc = prometheus.NewDesc("contiv_netmaster_api_body_bytes_held",
		"Request body bytes read and held in memory now (authenticated callers only).", nil, nil)
	bodyRefusedDesc = prometheus.NewDesc("contiv_netmaster_api_body_refused_total",
		"Requests refused (429) because their caller's or the server's budget of body bytes in memory was spent.", nil, nil)
)

func (c bodyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bodyHeldDesc
	ch <- bodyRefusedDesc
}

func (c bodyCollector) Collect(ch chan<- prometheus.Metric) {
	if c.m.bodies == nil {
		return
	}
	held, refused := c.m.bodies()
	ch <- prometheus.MustNewConstMetric(bodyHeldDesc, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(bodyRefusedDesc, prometheus.CounterValue, float64(refused))
}

func newAPIMetrics() *apiMetrics {
	return &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "contiv_netmaster_api_requests_total",
			Help: "API requests by route template, method and status code."}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "contiv_netmaster_api_request_seconds",
			Help: "API request duration by route template and method.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9)},
			[]string{"route", "method"}),
	}
}

var (
	apiCollections = map[string]bool{model.CollTenants: true, model.CollNetworks: true, model.CollEndpointGroups: true,
		model.CollPolicies: true, model.CollRules: true, model.CollAppProfiles: true, model.CollServiceLBs: true,
		model.CollGlobals: true, model.CollNetprofiles: true, model.CollBgps: true, model.CollExtContractsGroups: true,
		model.CollAciGws: true, model.CollEndpoints: true, model.CollQuotas: true}
	pluginOps = map[string]bool{"allocAddress": true, "releaseAddress": true, "createEndpoint": true,
		"deleteEndpoint": true, "updateEndpoint": true, "recordEndpoint": true, "forgetEndpoint": true, "etcdAccess": true}
	knownMethods = map[string]bool{http.MethodGet: true, http.MethodHead: true, http.MethodPost: true,
		http.MethodPut: true, http.MethodDelete: true, http.MethodPatch: true, http.MethodOptions: true}
)

// routeOf maps a request path to its route template.
func routeOf(path string) string {
	switch {
	case path == "/info" || path == "/agents" || path == "/metrics" || path == "/version" || path == "/services" || path == "/healthz":
		return path
	case strings.HasPrefix(path, "/service/"):
		return "/service/{id}"
	case strings.HasPrefix(path, "/plugin/"):
		if op := strings.TrimPrefix(path, "/plugin/"); pluginOps[op] {
			return path
		}
	case strings.HasPrefix(path, "/api/v1/"):
		rest := strings.Trim(strings.TrimPrefix(path, "/api/v1/"), "/")
		prefix := "/api/v1/"
		if r, ok := strings.CutPrefix(rest, "inspect/"); ok {
			rest, prefix = r, "/api/v1/inspect/"
		}
		coll, key, _ := strings.Cut(rest, "/")
		if apiCollections[coll] {
			if key == "" {
				return prefix + coll + "/"
			}
			return prefix + coll + "/{key}/"
		}
	}
	return "other"
}

// wrap counts every request h serves.
func (m *apiMetrics) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r)
		route, method := routeOf(r.URL.Path), r.Method
		if !knownMethods[method] {
			method = "other"
		}
		m.requests.WithLabelValues(route, method, strconv.Itoa(sw.code)).Inc()
		m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
	})
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// stateCollector reports what netmaster's records hold: objects per kind and address use
// per network, read from etcd at scrape time (count-only reads and the network records).
type stateCollector struct {
	store              *state.Store
	objects, addresses *prometheus.Desc
	endpoints          *prometheus.Desc
}

func newStateCollector(store *state.Store) *stateCollector {
	return &stateCollector{store: store,
		objects:   prometheus.NewDesc("contiv_netmaster_objects", "Model objects by kind.", []string{"kind"}, nil),
		addresses: prometheus.NewDesc("contiv_netmaster_ipam_addresses", "IPv4 addresses per network: allocated (auto allocations) and capacity (usable addresses of its range).", []string{"network", "state"}, nil),
		endpoints: prometheus.NewDesc("contiv_netmaster_network_endpoints", "Endpoints per network.", []string{"network"}, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.objects
	ch <- c.addresses
	ch <- c.endpoints
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cli := c.store.Client()
	for _, kind := range []string{model.TypeTenant, model.TypeNetwork, model.TypeEndpointGroup, model.TypePolicy, model.TypeRule,
		model.TypeAppProfile, model.TypeServiceLB, model.TypeNetprofile, model.TypeBgp, model.TypeExtContractsGroup, model.TypeAciGw} {
		resp, err := cli.Get(ctx, model.ModelKey(kind, ""), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return
		}
		ch <- prometheus.MustNewConstMetric(c.objects, prometheus.GaugeValue, float64(resp.Count), kind)
	}
	if resp, err := cli.Get(ctx, model.EpStatePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil {
		ch <- prometheus.MustNewConstMetric(c.objects, prometheus.GaugeValue, float64(resp.Count), model.TypeEndpoint)
	}
	nets, err := state.ListJSON[model.CfgNetworkState](ctx, c.store, model.NetStatePrefix)
	if err != nil {
		return
	}
	for _, n := range nets {
		capacity := rangeSize(n)
		ch <- prometheus.MustNewConstMetric(c.addresses, prometheus.GaugeValue, float64(n.EpAddrCount), n.ID, "allocated")
		ch <- prometheus.MustNewConstMetric(c.addresses, prometheus.GaugeValue, float64(capacity), n.ID, "capacity")
		ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(n.EpCount), n.ID)
	}
}

// rangeSize is the number of usable addresses of a network: its range, less network,
// broadcast and gateway addresses inside it.
func rangeSize(n model.CfgNetworkState) int64 {
	if n.SubnetLen == 0 || n.SubnetLen > 32 {
		return 0
	}
	size := int64(1) << (32 - n.SubnetLen)
	first, last, ok := strings.Cut(n.IPAddrRange, "-")
	lo, hi := ip4val(first), ip4val(last)
	base := ip4val(n.SubnetIP)
	if !ok || lo < 0 || hi < lo {
		lo, hi = base, base+size-1
	}
	count := hi - lo + 1
	for _, reserved := range []int64{base, base + size - 1, ip4val(n.Gateway)} {
		if reserved >= lo && reserved <= hi {
			count--
		}
	}
	return max(count, 0)
}

func ip4val(s string) int64 {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return -1
	}
	var v int64
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 255 {
			return -1
		}
		v = v<<8 | int64(n)
	}
	return v
}
