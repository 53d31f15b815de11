package ebpf

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descVerdictPackets = prometheus.NewDesc("contiv_datapath_packets_total",
		"Packets by datapath verdict or drop reason (docs/drop-reasons.md), summed over CPUs.",
		[]string{"reason", "drop"}, nil)
	descVerdictBytes = prometheus.NewDesc("contiv_datapath_bytes_total",
		"Bytes by datapath verdict or drop reason, summed over CPUs.",
		[]string{"reason", "drop"}, nil)
	descMapFull = prometheus.NewDesc("contiv_datapath_map_full_total",
		"Map inserts the driver could not make because the map was full, by map.",
		[]string{"map"}, nil)
	descScrapeErr = prometheus.NewDesc("contiv_datapath_scrape_errors",
		"1 when the datapath counters could not be read on this scrape.", nil, nil)
)

// Collector exports the datapath's own counters to Prometheus: every verdict and drop
// reason (all reasons are always present, zero or not, so alerts can rate() them), and
// failed inserts into full maps. It reads the per-CPU counter map directly on each scrape
// and does not dump any table.
func (d *Driver) Collector() prometheus.Collector { return collector{d: d} }

type collector struct{ d *Driver }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descVerdictPackets
	ch <- descVerdictBytes
	ch <- descMapFull
	ch <- descScrapeErr
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.d.ReasonCounters()
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, failed)
	if err == nil {
		for _, r := range Reasons() {
			drop := "false"
			if r.IsDrop() {
				drop = "true"
			}
			v := counts[r]
			ch <- prometheus.MustNewConstMetric(descVerdictPackets, prometheus.CounterValue, float64(v.Packets), r.String(), drop)
			ch <- prometheus.MustNewConstMetric(descVerdictBytes, prometheus.CounterValue, float64(v.Bytes), r.String(), drop)
		}
	}
	for name, n := range c.d.MapFullCount() {
		ch <- prometheus.MustNewConstMetric(descMapFull, prometheus.CounterValue, float64(n), name)
	}
}
