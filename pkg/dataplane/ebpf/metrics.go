package ebpf

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

var (
	descVerdictPackets = prometheus.NewDesc("contiv_datapath_packets_total",
		"Packets by datapath verdict or drop reason (docs/drop-reasons.md), summed over CPUs; drop is true, false, or not_handled (drop_not_ipv4: IPv6 and other non-IPv4 frames, not an error).",
		[]string{"reason", "drop"}, nil)
	descVerdictBytes = prometheus.NewDesc("contiv_datapath_bytes_total",
		"Bytes by datapath verdict or drop reason, summed over CPUs.",
		[]string{"reason", "drop"}, nil)
	descMapFull = prometheus.NewDesc("contiv_datapath_map_full_total",
		"Map inserts the driver could not make because the map was full, by map (cb_iface_direct: a host veth that got no ifindex inside the interface array, whose packets take the full stage).",
		[]string{"map"}, nil)
	descScrapeErr = prometheus.NewDesc("contiv_datapath_scrape_errors",
		"1 when the datapath counters could not be read on this scrape.", nil, nil)
	descCTEntries = prometheus.NewDesc("contiv_datapath_ct_entries",
		"Conntrack entries after the last collector pass.", nil, nil)
	descCTCapacity = prometheus.NewDesc("contiv_datapath_ct_capacity",
		"Conntrack table size; new flows are refused (drop_ct_full) when it is full.", nil, nil)
	descCTGCRuns = prometheus.NewDesc("contiv_datapath_ct_gc_runs_total",
		"Conntrack collector passes.", nil, nil)
	descCTGCDeleted = prometheus.NewDesc("contiv_datapath_ct_gc_deleted_total",
		"Conntrack entries deleted by the collector (expired, or of a deleted endpoint).", nil, nil)
	descCTGCErrors = prometheus.NewDesc("contiv_datapath_ct_gc_errors_total",
		"Conntrack collector passes that failed.", nil, nil)
	descCTGCSeconds = prometheus.NewDesc("contiv_datapath_ct_gc_seconds",
		"Duration of the last conntrack collector pass.", nil, nil)
	descNATFlows = prometheus.NewDesc("contiv_datapath_nat_flows",
		"Egress NAT (and node port) flows with a live reply mapping after the last collector pass.", nil, nil)
	descNATCapacity = prometheus.NewDesc("contiv_datapath_nat_capacity",
		"Egress NAT table size; new flows are refused (drop_egress_no_port) when it is full.", nil, nil)
	descNATDeleted = prometheus.NewDesc("contiv_datapath_nat_gc_deleted_total",
		"Egress NAT flows deleted by the collector (expired, or of a deleted endpoint).", nil, nil)
	descXDPMode = prometheus.NewDesc("contiv_datapath_xdp_mode",
		"1 for the mode the uplink's XDP prefilter runs in (off, native, generic: netplugin --xdp) and the device it is on.",
		[]string{"mode", "device"}, nil)
	descPolicyFailed = prometheus.NewDesc("contiv_datapath_policy_failed_closed",
		"1 for an endpoint group whose rule set could not be installed and that denies all traffic.",
		[]string{"epg"}, nil)
)

// Collector exports the datapath's own counters to Prometheus: every verdict and drop
// reason (all reasons are always present, zero or not, so alerts can rate() them), and
// failed inserts into full maps, and what the rate limits dropped per network and
// direction. It reads the per-CPU counter map directly on each scrape, and the limited
// endpoints' interface entries and buckets; it dumps no other table.
func (d *Driver) Collector() prometheus.Collector { return collector{d: d} }

type collector struct{ d *Driver }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descVerdictPackets
	ch <- descVerdictBytes
	ch <- descMapFull
	ch <- descScrapeErr
	ch <- descCTEntries
	ch <- descCTCapacity
	ch <- descCTGCRuns
	ch <- descCTGCDeleted
	ch <- descCTGCErrors
	ch <- descCTGCSeconds
	ch <- descNATFlows
	ch <- descNATCapacity
	ch <- descNATDeleted
	ch <- descPolicyFailed
	ch <- descXDPMode
	dataplane.DescribeQoSDrops(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.d.ReasonCounters()
	failed := 0.0
	if err != nil {
		failed = 1
	}
	if drops, err := c.d.qosDrops(); err != nil {
		failed = 1
	} else {
		dataplane.CollectQoSDrops(ch, drops)
	}
	ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, failed)
	if err == nil {
		for _, r := range Reasons() {
			drop := "false"
			switch {
			case r == DropNotIPv4:
				// IPv6 (and other non-IPv4) frames of containers: not handled by this
				// datapath yet, not an error; alerts on drop="true" must not fire for
				// a healthy dual-stack container.
				drop = "not_handled"
			case r.IsDrop():
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
	ct := c.d.CTStats()
	ch <- prometheus.MustNewConstMetric(descCTEntries, prometheus.GaugeValue, float64(ct.Entries))
	ch <- prometheus.MustNewConstMetric(descCTCapacity, prometheus.GaugeValue, float64(ct.Capacity))
	ch <- prometheus.MustNewConstMetric(descCTGCRuns, prometheus.CounterValue, float64(ct.Runs))
	ch <- prometheus.MustNewConstMetric(descCTGCDeleted, prometheus.CounterValue, float64(ct.Deleted))
	ch <- prometheus.MustNewConstMetric(descCTGCErrors, prometheus.CounterValue, float64(ct.Errors))
	ch <- prometheus.MustNewConstMetric(descCTGCSeconds, prometheus.GaugeValue, ct.LastPass.Seconds())
	ch <- prometheus.MustNewConstMetric(descNATFlows, prometheus.GaugeValue, float64(ct.NATFlows))
	ch <- prometheus.MustNewConstMetric(descNATCapacity, prometheus.GaugeValue, float64(ct.NATCapacity))
	ch <- prometheus.MustNewConstMetric(descNATDeleted, prometheus.CounterValue, float64(ct.NATDeleted))
	mode, dev := c.d.XDPMode()
	ch <- prometheus.MustNewConstMetric(descXDPMode, prometheus.GaugeValue, 1, mode, dev)
	for g := range c.d.FailedPolicies() {
		ch <- prometheus.MustNewConstMetric(descPolicyFailed, prometheus.GaugeValue, 1, fmt.Sprint(g))
	}
}
