package dataplane

import "github.com/prometheus/client_golang/prometheus"

// QoSDropKey is a network and a direction ("egress": what its endpoints send, "ingress":
// what they receive) of the rate-limit drop metrics.
type QoSDropKey struct{ Network, Direction string }

// QoSDropCount is what the rate limits of some endpoints dropped.
type QoSDropCount struct{ Packets, Bytes uint64 }

// The rate-limit drops of both backends, per network and direction: the per-endpoint
// counts (netctl bpf qos DROPPED) summed, since an endpoint label would be unbounded.
// Gauges: the sum of what the endpoints limited now have dropped since they got their
// limit, which falls when one of them leaves.
var (
	descQoSDroppedPackets = prometheus.NewDesc("contiv_datapath_qos_dropped_packets",
		"Packets the rate limits (netprofile, pod bandwidth) of a network's endpoints on this host dropped, by direction: the sum over the endpoints limited now, since each got its limit.",
		[]string{"network", "direction"}, nil)
	descQoSDroppedBytes = prometheus.NewDesc("contiv_datapath_qos_dropped_bytes",
		"Bytes the rate limits of a network's endpoints on this host dropped, by direction (as contiv_datapath_qos_dropped_packets).",
		[]string{"network", "direction"}, nil)
)

// DescribeQoSDrops sends the descriptors CollectQoSDrops uses.
func DescribeQoSDrops(ch chan<- *prometheus.Desc) {
	ch <- descQoSDroppedPackets
	ch <- descQoSDroppedBytes
}

// CollectQoSDrops sends drops as the rate-limit drop metrics.
func CollectQoSDrops(ch chan<- prometheus.Metric, drops map[QoSDropKey]QoSDropCount) {
	for k, c := range drops {
		ch <- prometheus.MustNewConstMetric(descQoSDroppedPackets, prometheus.GaugeValue, float64(c.Packets), k.Network, k.Direction)
		ch <- prometheus.MustNewConstMetric(descQoSDroppedBytes, prometheus.GaugeValue, float64(c.Bytes), k.Network, k.Direction)
	}
}
