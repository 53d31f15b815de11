package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/contivbpf/contivbpf/pkg/state"
)

// warnFraction of the etcd quota makes /healthz warn before writes start failing.
const warnFraction = 0.8

// healthHandler serves GET /healthz: 200 "ok"; 200 "warning: ..." when etcd's database
// passed 80% of quota; 503 with the reason when etcd is unreachable or raised an alarm
// (NOSPACE: every write fails until an operator compacts and defragments). Each non-empty
// answer of warnings is a "warning: ..." line too.
func healthHandler(store *state.Store, quota int64, warnings []func() string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		h := store.Health(ctx)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		switch {
		case !h.Reachable:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "etcd unreachable: %v\n", h.Err)
		case len(h.Alarms) > 0:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "etcd alarm: %s\n", strings.Join(h.Alarms, "; "))
		case quota > 0 && float64(h.DBSize) > warnFraction*float64(quota):
			fmt.Fprintf(w, "warning: etcd database %d bytes is %.0f%% of its %d-byte quota (compact and defragment)\n",
				h.DBSize, 100*float64(h.DBSize)/float64(quota), quota)
		default:
			if !printWarnings(w, warnings) {
				fmt.Fprintln(w, "ok")
			}
			return
		}
		printWarnings(w, warnings)
	}
}

// etcdCollector exports etcd's health on every scrape.
type etcdCollector struct {
	store                          *state.Store
	quota                          int64
	reachable, size, inUse, quotaD *prometheus.Desc
	alarms, leader                 *prometheus.Desc
	isLeader                       func() bool
}

func newEtcdCollector(store *state.Store, quota int64, isLeader func() bool) *etcdCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("contiv_netmaster_"+name, help, nil, nil)
	}
	return &etcdCollector{store: store, quota: quota, isLeader: isLeader,
		reachable: d("etcd_reachable", "1 when an etcd endpoint answered"),
		size:      d("etcd_db_size_bytes", "etcd backend database size (largest member)"),
		inUse:     d("etcd_db_size_in_use_bytes", "etcd backend bytes in use (largest member)"),
		quotaD:    d("etcd_quota_bytes", "etcd backend quota netmaster assumes (--etcd-quota-bytes)"),
		alarms:    d("etcd_alarms", "active etcd alarms (NOSPACE, CORRUPT)"),
		leader:    d("leader", "1 while this netmaster leads"),
	}
}

func (c *etcdCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.reachable, c.size, c.inUse, c.quotaD, c.alarms, c.leader} {
		ch <- d
	}
}

func (c *etcdCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	h := c.store.Health(ctx)
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	ch <- prometheus.MustNewConstMetric(c.reachable, prometheus.GaugeValue, b(h.Reachable))
	ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(h.DBSize))
	ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, float64(h.DBSizeInUse))
	ch <- prometheus.MustNewConstMetric(c.quotaD, prometheus.GaugeValue, float64(c.quota))
	ch <- prometheus.MustNewConstMetric(c.alarms, prometheus.GaugeValue, float64(len(h.Alarms)))
	ch <- prometheus.MustNewConstMetric(c.leader, prometheus.GaugeValue, b(c.isLeader()))
}

// metricsHandler serves GET /metrics from a registry of this node's own.
func metricsHandler(store *state.Store, quota int64, isLeader func() bool, api *apiMetrics, extra []prometheus.Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newEtcdCollector(store, quota, isLeader), newStateCollector(store), api.requests, api.duration,
		bodyCollector{api})
	reg.MustRegister(extra...)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// printWarnings writes each non-empty warning as a "warning: " line and reports whether
// there was one.
func printWarnings(w io.Writer, warnings []func() string) bool {
	any := false
	for _, f := range warnings {
		if msg := f(); msg != "" {
			fmt.Fprintf(w, "warning: %s\n", msg)
			any = true
		}
	}
	return any
}
