package ovs

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Conntrack metrics of the OVS backend, under the eBPF backend's names where they mean the
// same (dashboards and alerts work on both).
var (
	descCTEntries = prometheus.NewDesc("contiv_datapath_ct_entries",
		"Conntrack entries of this host's vswitchd (all zones) on this scrape.", nil, nil)
	descCTCapacity = prometheus.NewDesc("contiv_datapath_ct_capacity",
		"Conntrack table size of this host's vswitchd (dpctl/ct-get-maxconns); new connections are refused when it is full.", nil, nil)
	descRejudgeRuns = prometheus.NewDesc("contiv_datapath_ct_rejudge_runs_total",
		"Policy changes after which the established connections were judged again.", nil, nil)
	descRejudgeCut = prometheus.NewDesc("contiv_datapath_ct_rejudge_cut_total",
		"Established connections flushed because a policy change denies them.", nil, nil)
	descRejudgeErrors = prometheus.NewDesc("contiv_datapath_ct_rejudge_errors_total",
		"Re-judge passes that failed (conntrack not readable, or a flush refused).", nil, nil)
	descCTZoneEntries = prometheus.NewDesc("contiv_datapath_ct_zone_entries",
		"Connections a tenant's conntrack zone holds against its limit (dpctl/ct-get-limits; counted from when the limit was set); opener: local for the connections its endpoints on this host open, remote for those other hosts open toward them.", []string{"tenant", "opener"}, nil)
	descCTZoneLimit = prometheus.NewDesc("contiv_datapath_ct_zone_limit",
		"Conntrack limit of a tenant's zone: --ct-quota-per-endpoint times its endpoints on this host (an inbound zone, opener remote, at most half the table); new connections past it are dropped (drop_ct_quota).", []string{"tenant", "opener"}, nil)
	descScrapeErr = prometheus.NewDesc("contiv_datapath_scrape_errors",
		"1 when the datapath counters could not be read on this scrape.", nil, nil)
)

// ctCounters are the re-judge counters (rejudge.go).
type ctCounters struct {
	runs, cut, errors atomic.Int64
}

// Collector exports the backend's conntrack figures to Prometheus (netplugin registers it
// when the driver has one).
func (d *Driver) Collector() prometheus.Collector { return ovsCollector{d: d} }

type ovsCollector struct{ d *Driver }

func (c ovsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCTEntries, descCTCapacity, descCTZoneEntries, descCTZoneLimit, descRejudgeRuns, descRejudgeCut, descRejudgeErrors, descScrapeErr} {
		ch <- d
	}
	dataplane.DescribeQoSDrops(ch)
}

func (c ovsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failed := 0.0
	for _, m := range []struct {
		desc *prometheus.Desc
		cmd  string
	}{{descCTEntries, "dpctl/ct-get-nconns"}, {descCTCapacity, "dpctl/ct-get-maxconns"}} {
		out, err := c.d.appctl(ctx, m.cmd)
		n, perr := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil || perr != nil {
			failed = 1
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.GaugeValue, n)
	}
	if zones := c.d.limitedZones(); len(zones) > 0 {
		ids := make([]string, 0, len(zones))
		for z := range zones {
			ids = append(ids, strconv.Itoa(int(z)))
		}
		out, err := c.d.appctl(ctx, "dpctl/ct-get-limits", "zone="+strings.Join(ids, ","))
		if err != nil {
			failed = 1
		}
		for z, l := range parseCTLimits(out) {
			if o, ok := zones[z]; ok {
				ch <- prometheus.MustNewConstMetric(descCTZoneEntries, prometheus.GaugeValue, float64(l.count), o.tenant, o.opener)
				ch <- prometheus.MustNewConstMetric(descCTZoneLimit, prometheus.GaugeValue, float64(l.limit), o.tenant, o.opener)
			}
		}
	}
	if drops, err := c.d.qosDrops(ctx); err != nil {
		failed = 1
	} else {
		dataplane.CollectQoSDrops(ch, drops)
	}
	ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, failed)
	ch <- prometheus.MustNewConstMetric(descRejudgeRuns, prometheus.CounterValue, float64(c.d.ct.runs.Load()))
	ch <- prometheus.MustNewConstMetric(descRejudgeCut, prometheus.CounterValue, float64(c.d.ct.cut.Load()))
	ch <- prometheus.MustNewConstMetric(descRejudgeErrors, prometheus.CounterValue, float64(c.d.ct.errors.Load()))
}
