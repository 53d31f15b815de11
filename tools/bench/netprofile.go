//go:build cbbench

package main

import (
	"context"
	"fmt"
	"io"

	cbebpf "github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
)

// netprofileStage measures the eBPF backend's rate limiter (docs/ebpf.md "Rate limits and
// DSCP") on one driver in private namespaces: ebpf.netprofile.accuracy_10m and
// accuracy_1g (iperf3 of an endpoint with an egress QoS, achieved / configured) and
// unlimited_tput_ratio (an endpoint without QoS while another has one / while none has).
func netprofileStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	const seconds, rounds = 5, 4
	f, err := cbebpf.MeasureNetprofile(ctx, cfg.prefix+"q", seconds, rounds)
	if err != nil {
		return err
	}
	ratio := 0.0
	if off := median(f.UnlimitedOff); off > 0 {
		ratio = median(f.UnlimitedOn) / off
	}
	table(w, fmt.Sprintf("ebpf netprofile: iperf3 %d s, %d alternating rounds for the unlimited endpoint", seconds, rounds),
		[]string{"figure", "value", "detail"}, [][]string{
			{"accuracy at 10 Mbit/s", fmt.Sprintf("%.3f", f.Accuracy10M), "achieved / configured"},
			{"accuracy at 1 Gbit/s", fmt.Sprintf("%.3f", f.Accuracy1G), "achieved / configured"},
			{"unlimited endpoint, QoS elsewhere on / off", fmt.Sprintf("%.3f", ratio), "on " + fmtList(f.UnlimitedOn) + " | off " + fmtList(f.UnlimitedOff) + " Gbit/s"},
		})
	r.add("ebpf.netprofile.accuracy_10m", round3(f.Accuracy10M), "ratio")
	r.add("ebpf.netprofile.accuracy_1g", round3(f.Accuracy1G), "ratio")
	r.add("ebpf.netprofile.unlimited_tput_ratio", round3(ratio), "ratio")
	return nil
}
