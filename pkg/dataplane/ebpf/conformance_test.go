package ebpf

import (
	"context"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

func factory(t *testing.T, cfg dataplane.HostConfig) dataplane.Driver {
	t.Helper()
	d, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new ebpf driver for %s: %v", cfg.Host, err)
	}
	return d
}

func TestConformance(t *testing.T) {
	conformance.Run(t, factory)
}

func TestConformanceRouting(t *testing.T) {
	conformance.RunRouting(t, factory)
}

func TestConformanceAdversarial(t *testing.T) {
	conformance.RunAdversarial(t, factory)
}
