//go:build !cbbench

package main

import (
	"context"
	"errors"
	"io"
)

// progStage without the bench fixtures: pkg/dataplane/ebpf builds MeasurePaths and
// MeasureCTGC only with -tags cbbench (so the agent binaries never contain them); `make
// bench` sets the tag, and every other stage runs without it.
func progStage(context.Context, io.Writer, *report) error {
	return errors.New("built without -tags cbbench: run `go run -tags cbbench ./tools/bench` (as `make bench` does) for the eBPF program paths")
}

// xdpStage without the bench fixtures (MeasureXDPDrop builds only with -tags cbbench).
func xdpStage(context.Context, io.Writer, *report, string) error {
	return errors.New("built without -tags cbbench: run `go run -tags cbbench ./tools/bench` (as `make bench` does) for the XDP prefilter")
}
