package ebpf

import "github.com/contivbpf/contivbpf/pkg/dataplane"

// The driver and what the agent reaches beyond it by type assertion
// (pkg/dataplane/extensions.go), asserted here so that a signature drift fails the build
// instead of turning an agent endpoint into 501.
var (
	_ dataplane.Driver           = (*Driver)(nil)
	_ dataplane.Lister           = (*Driver)(nil)
	_ dataplane.CounterReader    = (*Driver)(nil)
	_ dataplane.MetricsCollector = (*Driver)(nil)
	_ dataplane.EventSource      = (*Driver)(nil)
	_ dataplane.Verifier         = (*Driver)(nil)
	_ dataplane.Tracer           = (*Driver)(nil)
	_ dataplane.NativeRouter     = (*Driver)(nil)
	_ dataplane.SourceDenier     = (*Driver)(nil)
)
