package master

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

func newRefusedCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "contiv_netmaster_quota_refused_total",
		Help: "Changes refused because they would take a tenant past a quota (this netmaster), by tenant and kind."},
		[]string{"tenant", "kind"})
}

// Collectors are the master's metrics: every tenant's usage and limits, read from etcd at
// scrape time, and the changes refused for quota. They name tenants: /metrics is for
// admins, operators and agents (a tenant-admin gets 403 there).
func (m *Master) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.refused, &quotaCollector{store: m.store, defaults: m.cfg.Quota,
		usage: prometheus.NewDesc("contiv_netmaster_tenant_usage", "What a tenant holds, by kind (objects; bytes: its records' keys and values).", []string{"tenant", "kind"}, nil),
		limit: prometheus.NewDesc("contiv_netmaster_tenant_quota", "A tenant's limit, by kind (kinds without one are not reported).", []string{"tenant", "kind"}, nil),
	}}
}

// quotaCollector reports the usage records and the limits in force.
type quotaCollector struct {
	store        *state.Store
	defaults     map[string]int64
	usage, limit *prometheus.Desc
}

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.usage
	ch <- c.limit
}

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	usage, err := state.ListJSON[model.TenantUsage](ctx, c.store, model.QuotaUsagePrefix)
	if err != nil {
		return
	}
	overrides, err := state.ListJSON[model.TenantQuotaLimits](ctx, c.store, model.QuotaLimitsPrefix)
	if err != nil {
		return
	}
	for key, u := range usage {
		tenant := strings.TrimPrefix(key, model.QuotaUsagePrefix)
		o := overrides[model.QuotaLimitsKey(tenant)].Limits
		for _, k := range model.QuotaKinds() {
			ch <- prometheus.MustNewConstMetric(c.usage, prometheus.GaugeValue, float64(u.Usage[k]), tenant, k)
			limit, ok := o[k]
			if !ok {
				limit, ok = c.defaults[k]
			}
			if ok {
				ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(limit), tenant, k)
			}
		}
	}
}
