package agent

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// metrics are the agent's own counters; the gauges are read from the agent on scrape.
type metrics struct {
	syncs      prometheus.Counter
	syncErrors prometheus.Counter
	opErrors   prometheus.Counter
	syncTime   prometheus.Histogram
	attachStep *prometheus.HistogramVec
	callTime   *prometheus.HistogramVec
}

func newMetrics() *metrics {
	return &metrics{
		syncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "contiv_netplugin_syncs_total",
			Help: "Reconcile passes that called the driver."}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "contiv_netplugin_sync_errors_total",
			Help: "Reconcile passes that ended with at least one driver error."}),
		opErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "contiv_netplugin_driver_call_errors_total",
			Help: "Failed incremental driver calls (each is retried with backoff)."}),
		syncTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "contiv_netplugin_full_sync_seconds",
			Help: "Duration of full driver Syncs.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)}),
		attachStep: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "contiv_netplugin_attach_step_seconds",
			Help:    "Duration of the steps of successful attaches: netmaster (createEndpoint round trip), record (oper record write), program (driver: veth, namespace, maps).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12)}, []string{"step"}),
		callTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "contiv_netplugin_driver_call_seconds",
			Help:    "Duration of incremental driver calls by verb (upsert, delete) and object kind (network, endpoint, remote-endpoint, peer, policy, service, pod-policy), failed ones included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)}, []string{"verb", "object"}),
	}
}

// observeCall records the duration of one incremental driver call.
func (m *metrics) observeCall(o op, took time.Duration) {
	kind, _, _ := strings.Cut(o.key, "/")
	m.callTime.WithLabelValues(o.verb, kind).Observe(took.Seconds())
}

func (m *metrics) observeSync(err error, full time.Duration) {
	m.syncs.Inc()
	if err != nil {
		m.syncErrors.Inc()
	}
	if full > 0 {
		m.syncTime.Observe(full.Seconds())
	}
}

// Collector exposes the agent's metrics (and the driver's numeric counters, if its Status
// reports any) for a prometheus.Registry.
func (a *Agent) Collector() prometheus.Collector { return &collector{a: a} }

// counts are the sizes of the applied state and what the metrics read with them.
type counts struct {
	nets, eps, reps, peers, svcs int
	synced                       bool
	LastSync                     time.Time
	Errors                       map[string]string
}

func (a *Agent) appliedCounts() counts {
	a.applyMu.Lock()
	c := counts{nets: len(a.applied.Networks), eps: len(a.applied.Endpoints), reps: len(a.applied.RemoteEndpoints),
		peers: len(a.applied.Peers), svcs: len(a.applied.Services), synced: a.synced}
	a.applyMu.Unlock()
	a.mu.Lock()
	c.LastSync = a.lastSync
	a.mu.Unlock()
	c.Errors = a.Errors()
	return c
}

type collector struct{ a *Agent }

var (
	descEndpoints = prometheus.NewDesc("contiv_netplugin_endpoints", "Endpoints programmed in the driver.", []string{"kind"}, nil)
	descPeers     = prometheus.NewDesc("contiv_netplugin_peers", "VXLAN peers programmed in the driver.", nil, nil)
	descNetworks  = prometheus.NewDesc("contiv_netplugin_networks", "Networks programmed in the driver.", nil, nil)
	descServices  = prometheus.NewDesc("contiv_netplugin_services", "Services programmed in the driver.", nil, nil)
	descErrors    = prometheus.NewDesc("contiv_netplugin_failing_objects", "Objects whose last driver call or record decode failed.", nil, nil)
	descLastSync  = prometheus.NewDesc("contiv_netplugin_last_sync_timestamp_seconds", "Unix time of the last reconcile pass without errors.", nil, nil)
	descSynced    = prometheus.NewDesc("contiv_netplugin_synced", "1 once the first full Sync succeeded.", nil, nil)
	descPolicyErr = prometheus.NewDesc("contiv_netplugin_policy_rule_errors", "state/policyRule records pkg/policy refused to compile (listed under errors as policy-rule/<id>).", nil, nil)
	descObjErrors = prometheus.NewDesc("contiv_netplugin_object_errors", "Failing objects by kind (the part of the error key before '/': endpoint, remote-endpoint, network, endpoint-group, ...).", []string{"kind"}, nil)
	descDriver    = prometheus.NewDesc("contiv_netplugin_driver_counter", "Numeric counters reported by the driver's Status.", []string{"dataplane", "name"}, nil)
	descDrift     = prometheus.NewDesc("contiv_netplugin_datapath_drift", "Differences found by the last drift check between the applied state and the live datapath, agent errors included (-1: not checked yet).", nil, nil)
	descVerified  = prometheus.NewDesc("contiv_netplugin_last_verify_timestamp_seconds", "Unix time of the last drift check (0: never).", nil, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	m := c.a.metrics
	m.syncs.Describe(ch)
	m.syncErrors.Describe(ch)
	m.opErrors.Describe(ch)
	m.syncTime.Describe(ch)
	m.attachStep.Describe(ch)
	m.callTime.Describe(ch)
	for _, d := range []*prometheus.Desc{descEndpoints, descPeers, descNetworks, descServices, descErrors, descPolicyErr, descLastSync, descSynced, descObjErrors, descDriver, descDrift, descVerified} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.a.metrics
	m.syncs.Collect(ch)
	m.syncErrors.Collect(ch)
	m.opErrors.Collect(ch)
	m.syncTime.Collect(ch)
	m.attachStep.Collect(ch)
	m.callTime.Collect(ch)
	// Sizes only: a scrape copies nothing of the applied state (it holds the apply lock).
	s := c.a.appliedCounts()
	ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(s.eps), "local")
	ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(s.reps), "remote")
	ch <- prometheus.MustNewConstMetric(descPeers, prometheus.GaugeValue, float64(s.peers))
	ch <- prometheus.MustNewConstMetric(descNetworks, prometheus.GaugeValue, float64(s.nets))
	ch <- prometheus.MustNewConstMetric(descServices, prometheus.GaugeValue, float64(s.svcs))
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.GaugeValue, float64(len(s.Errors)))
	kinds := map[string]int{}
	for k := range s.Errors {
		kind, _, _ := strings.Cut(k, "/")
		kinds[kind]++
	}
	for kind, n := range kinds {
		ch <- prometheus.MustNewConstMetric(descObjErrors, prometheus.GaugeValue, float64(n), kind)
	}
	polErrs := 0
	for k := range s.Errors {
		if strings.HasPrefix(k, "policy-rule/") || k == "policy" {
			polErrs++
		}
	}
	ch <- prometheus.MustNewConstMetric(descPolicyErr, prometheus.GaugeValue, float64(polErrs))
	var last float64
	if !s.LastSync.IsZero() {
		last = float64(s.LastSync.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(descLastSync, prometheus.GaugeValue, last)
	synced := 0.0
	if s.synced {
		synced = 1
	}
	ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, synced)
	c.a.mu.Lock()
	drift, verified := float64(c.a.lastDrift), 0.0
	if c.a.lastVerify.IsZero() {
		drift = -1
	} else {
		verified = float64(c.a.lastVerify.UnixNano()) / 1e9
	}
	c.a.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descDrift, prometheus.GaugeValue, drift)
	ch <- prometheus.MustNewConstMetric(descVerified, prometheus.GaugeValue, verified)
	// Driver counters without the apply lock and without reading state tables: a scrape
	// never stalls an attach.
	if dc, ok := c.a.cfg.Driver.(dataplane.CounterReader); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		counters, err := dc.Counters(ctx)
		if err != nil {
			return
		}
		for name, v := range counters {
			ch <- prometheus.MustNewConstMetric(descDriver, prometheus.CounterValue, v, c.a.cfg.Driver.Name(), name)
		}
	}
}
