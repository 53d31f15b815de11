package master

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

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
		usage:      prometheus.NewDesc("contiv_netmaster_tenant_usage", "What a tenant holds, by kind (objects; bytes: its records' keys and values).", []string{"tenant", "kind"}, nil),
		limit:      prometheus.NewDesc("contiv_netmaster_tenant_quota", "A tenant's limit, by kind (kinds without one are not reported).", []string{"tenant", "kind"}, nil),
		unreadable: prometheus.NewDesc("contiv_netmaster_quota_records_unreadable", "Usage and limits records that do not decode (their tenants' figures are left out; an admin's quota PUT repairs them).", nil, nil),
	}}
}

// quotaCollector reports the usage records and the limits in force.
type quotaCollector struct {
	store                    *state.Store
	defaults                 map[string]int64
	usage, limit, unreadable *prometheus.Desc
}

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.usage
	ch <- c.limit
	ch <- c.unreadable
}

// decodeEach reads every record under prefix, by tenant (the rest of its key), and names
// the tenants of those that do not decode or whose key is no label value (not UTF-8: a
// const metric with it panics, and the failed Gather turns every scrape into a 500).
func decodeEach[T any](ctx context.Context, s *state.Store, prefix string) (map[string]T, map[string]bool, error) {
	kvs, _, err := s.List(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	out, bad := make(map[string]T, len(kvs)), map[string]bool{}
	for _, kv := range kvs {
		tenant := strings.TrimPrefix(kv.Key, prefix)
		var v T
		if !utf8.ValidString(tenant) || kv.Decode(&v) != nil {
			bad[tenant] = true
			continue
		}
		out[tenant] = v
	}
	return out, bad, nil
}

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	// One unreadable record (anything holding an etcd certificate can write one) hides
	// that tenant's figures, never the others' (review finding): it is counted instead.
	usage, badUsage, err := decodeEach[model.TenantUsage](ctx, c.store, model.QuotaUsagePrefix)
	if err != nil {
		return
	}
	overrides, badLimits, err := decodeEach[model.TenantQuotaLimits](ctx, c.store, model.QuotaLimitsPrefix)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.unreadable, prometheus.GaugeValue, float64(len(badUsage)+len(badLimits)))
	for tenant, u := range usage {
		if badLimits[tenant] {
			continue // (its limits are not known: not the defaults)
		}
		o := overrides[tenant].Limits
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
