package netbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// Iperf3 runs an iperf3 server in serverNS (bound to serverIP) and a client in clientNS
// for the given seconds, and returns the receiver's throughput in Gbit/s.
func Iperf3(ctx context.Context, serverNS, clientNS, serverIP string, port, seconds int) (float64, error) {
	srv := exec.CommandContext(ctx, "nsenter", "--net="+NSPath(serverNS), "--",
		"iperf3", "-s", "-1", "-B", serverIP, "-p", strconv.Itoa(port))
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start iperf3 server in %s: %w", serverNS, err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var out []byte
	var err error
	for i := 0; i < 50; i++ { // the server needs a moment to listen
		cli := exec.CommandContext(ctx, "nsenter", "--net="+NSPath(clientNS), "--",
			"iperf3", "-c", serverIP, "-p", strconv.Itoa(port), "-t", strconv.Itoa(seconds), "-J")
		out, err = cli.Output()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return 0, fmt.Errorf("iperf3 client %s -> %s: %w: %s", clientNS, serverIP, err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return 0, fmt.Errorf("parse iperf3 output: %w", err)
	}
	if res.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", res.Error)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, nil
}
