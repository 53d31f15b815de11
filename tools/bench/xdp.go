//go:build cbbench

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	cbebpf "github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
)

// xdpStage measures the uplink's XDP prefilter against the tc path it spares
// (cbebpf.MeasureXDPDrop): one flood of clear overlay packets (encryption on) into a veth
// of a namespace of its own, dropped at XDP by cb_xdp_uplink, then at tc by
// cb_from_uplink after the kernel built each packet's skb, one core, same run.
// xdp.drop_ratio = frames per second dropped at XDP / at tc (issue 36: >= 3).
func xdpStage(ctx context.Context, w io.Writer, r *report, prefix string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	topo, err := netbench.VethPair(prefix, 1500)
	if err != nil {
		return err
	}
	defer topo.Close()
	const frames, rounds = 2_000_000, 5
	c, err := cbebpf.MeasureXDPDrop("/run/netns/"+prefix+"b", "eth0", frames, rounds)
	if err != nil {
		return err
	}
	ratio := c.XDPPerSec / c.TCPerSec
	fmt.Fprintf(w, "xdp prefilter: a clear overlay flood dropped on one core: %.2f Mpps at XDP, %.2f Mpps at tc (best of %d rounds of %d frames): %.2fx (goal >= 3)\n",
		c.XDPPerSec/1e6, c.TCPerSec/1e6, rounds, frames, ratio)
	r.add("xdp.drop_mpps_xdp", round2(c.XDPPerSec/1e6), "Mpps")
	r.add("xdp.drop_mpps_tc", round2(c.TCPerSec/1e6), "Mpps")
	r.add("xdp.drop_ratio", round2(ratio), "ratio")
	return nil
}
