package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/netbench"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	cbebpf "github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ovs"
)

// netprofileStage measures dp's rate limiter (docs/netprofiles.md) with one driver in
// private namespaces (netbench.MeasureNetprofile, the same harness for both backends):
// <dp>.netprofile.accuracy_10m and accuracy_1g (iperf3 of an endpoint with an egress QoS,
// achieved / configured), accuracy_in_10m and accuracy_in_1g (the same into an endpoint
// with an ingress QoS) and unlimited_tput_ratio (an endpoint without QoS while another
// has one / while none has: the median of the ratios of rounds measured back to back,
// in ABBA order).
func netprofileStage(ctx context.Context, cfg config, dp string, w io.Writer, r *report) error {
	// Short runs, many rounds: each round's on and off runs are seconds apart, so the
	// load of other processes (two shared cores) weighs on both alike.
	const accSeconds, seconds, rounds = 5, 1, 16
	prefix := cfg.prefix + "q" + dp[:1]
	var newDriver netbench.NewDriver
	switch dp {
	case "ebpf":
		pins := filepath.Join("/sys/fs/bpf", prefix)
		defer func() { _ = os.RemoveAll(pins) }()
		newDriver = func(ctx context.Context, host dataplane.HostConfig) (dataplane.Driver, error) {
			return cbebpf.New(ctx, host, cbebpf.Options{PinRoot: pins, VXLANIf: prefix + "vx", MapEntries: 1024})
		}
	case "ovs":
		dir, err := os.MkdirTemp("", prefix+"-ovs-")
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := (ovs.Private{Dir: dir}).Stop(sctx); err != nil {
				fmt.Fprintf(w, "stop the netprofile stage's private OVS: %v\n", err)
			}
			_ = os.RemoveAll(dir)
		}()
		newDriver = func(ctx context.Context, host dataplane.HostConfig) (dataplane.Driver, error) {
			return ovs.New(ctx, host, ovs.Options{Dir: dir})
		}
	default:
		return errors.New("netprofile: unknown dataplane " + dp)
	}
	f, err := netbench.MeasureNetprofile(ctx, prefix, accSeconds, seconds, rounds, newDriver)
	if err != nil {
		return err
	}
	ratio := f.UnlimitedRatio()
	table(w, fmt.Sprintf("%s netprofile: iperf3 %d s for accuracy, %d ABBA rounds of %d s for the unlimited endpoint", dp, accSeconds, rounds, seconds),
		[]string{"figure", "value", "detail"}, [][]string{
			{"accuracy at 10 Mbit/s", fmt.Sprintf("%.3f", f.Accuracy10M), "achieved / configured"},
			{"accuracy at 1 Gbit/s", fmt.Sprintf("%.3f", f.Accuracy1G), fmt.Sprintf("achieved / configured; the path without QoS carries %.2f Gbit/s (median off)", median(f.UnlimitedOff))},
			{"ingress accuracy at 10 Mbit/s", fmt.Sprintf("%.3f", f.AccuracyIn10M), "what the limited endpoint receives, achieved / configured"},
			{"ingress accuracy at 1 Gbit/s", fmt.Sprintf("%.3f", f.AccuracyIn1G), "what the limited endpoint receives, achieved / configured"},
			{"unlimited endpoint, QoS elsewhere on / off", fmt.Sprintf("%.3f", ratio), "median of round ratios; on " + fmtList(f.UnlimitedOn) + " | off " + fmtList(f.UnlimitedOff) + " Gbit/s"},
		})
	r.add(dp+".netprofile.accuracy_10m", round3(f.Accuracy10M), "ratio")
	r.add(dp+".netprofile.accuracy_1g", round3(f.Accuracy1G), "ratio")
	r.add(dp+".netprofile.accuracy_in_10m", round3(f.AccuracyIn10M), "ratio")
	r.add(dp+".netprofile.accuracy_in_1g", round3(f.AccuracyIn1G), "ratio")
	r.add(dp+".netprofile.unlimited_tput_ratio", round3(ratio), "ratio")
	return nil
}
