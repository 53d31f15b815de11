package dataplane

import (
	"context"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
)

// What the agent uses of a backend beyond Driver. Each interface is small and is reached
// by a type assertion on the Driver; an endpoint whose interface the backend lacks
// answers 501 (or, for metrics, exports nothing more). Because an assertion fails quietly
// when a method's signature drifts, every backend asserts each interface it implements
// at compile time (var _ dataplane.Lister = (*Driver)(nil)), and the agent asserts by
// these names only.

// Lister decodes the backend's tables for operators: netplugin's /inspect/bpf/<kind> and
// `netctl bpf <kind>` (both backends).
type Lister interface {
	Listing(q ListQuery) (Listing, error)
}

// CounterReader reads the backend's cheap numeric counters by name, for the agent's
// /metrics (both backends). It must not dump tables or take the lock of a slow change.
type CounterReader interface {
	Counters(ctx context.Context) (map[string]float64, error)
}

// MetricsCollector exports the backend's own Prometheus metrics (per-reason verdicts,
// full-map inserts, conntrack figures), registered by netplugin on its /metrics (both
// backends).
type MetricsCollector interface {
	Collector() prometheus.Collector
}

// EventSource streams the packets the datapath drops, for netplugin's /monitor and
// `netctl monitor` (both backends). It emits nothing while no stream is open, so the
// monitor costs nothing unless watched.
type EventSource interface {
	MonitorEvents(ctx context.Context) (<-chan MonitorEvent, error)
	// SetAllowEvents adds (or stops) events for new flows a rule allowed.
	SetAllowEvents(on bool) error
}

// Verifier compares the backend's live tables (eBPF maps, OVS flows) with a state, for
// /inspect/verify and the agent's drift metric (both backends).
type Verifier interface {
	Verify(s State) ([]Drift, error)
}

// Tracer runs a packet through the live tables without sending it and without changing
// any state: /inspect/trace from a local endpoint, /inspect/trace-receive for the inner
// frame another host's trace sent over the overlay (both backends).
type Tracer interface {
	Trace(req TraceRequest) (TraceResult, error)
	TraceReceive(t TraceTunnel) (TraceResult, error)
}

// NativeRouter routes natively for BGP (docs/bgp.md): the agent hands it the routes its
// speaker learned and reads back the ones in the datapath after a restart (the eBPF
// backend). Without it a bgp object for the host is reported, not acted on.
type NativeRouter interface {
	SetNativeRouting(ctx context.Context, nr NativeRouting) error
	NativeRoutes() ([]Route, error)
}

// SourceDenier applies the operator's deny list (netctl prefilter: the cluster-wide
// entries and this host's): IPv4 packets from those prefixes that arrive from the underlay
// are dropped where they enter (the eBPF backend: drop_denied_source, by the XDP prefilter
// or cb_from_uplink). The list survives a restart in the datapath until the next call.
// The OVS backend has none: the agent reports a list it cannot apply.
type SourceDenier interface {
	SetDenySources(ctx context.Context, prefixes []netip.Prefix) error
}
