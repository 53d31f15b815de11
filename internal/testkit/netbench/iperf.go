package netbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Iperf3 runs an iperf3 server in serverNS (bound to serverIP) and a client in clientNS
// for the given seconds, and returns the receiver's throughput in Gbit/s. extra is appended
// to the client's arguments (e.g. "-O", "1": the first second left out of the result).
func Iperf3(ctx context.Context, serverNS, clientNS, serverIP string, port, seconds int, extra ...string) (float64, error) {
	srv := exec.CommandContext(ctx, "nsenter", "--net="+NSPath(serverNS), "--",
		"iperf3", "-s", "-1", "-B", serverIP, "-p", strconv.Itoa(port))
	if err := srv.Start(); err != nil {
		return 0, fmt.Errorf("start iperf3 server in %s: %w", serverNS, err)
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	type result struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	var res result
	var lastErr error
	for i := 0; i < 50; i++ { // the server needs a moment to listen
		args := append([]string{"--net=" + NSPath(clientNS), "--",
			"iperf3", "-c", serverIP, "-p", strconv.Itoa(port), "-t", strconv.Itoa(seconds), "-J"}, extra...)
		cli := exec.CommandContext(ctx, "nsenter", args...)
		out, err := cli.Output()
		res = result{}
		if jerr := json.Unmarshal(out, &res); jerr != nil && err == nil {
			err = fmt.Errorf("parse iperf3 output: %w", jerr)
		}
		switch {
		case res.Error != "":
			lastErr = fmt.Errorf("iperf3 %s -> %s: %s", clientNS, serverIP, res.Error)
		case err != nil:
			lastErr = fmt.Errorf("iperf3 client %s -> %s: %w", clientNS, serverIP, err)
		default:
			lastErr = nil
		}
		if lastErr == nil || !strings.Contains(res.Error, "unable to connect") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lastErr != nil {
		return 0, lastErr
	}
	return res.End.SumReceived.BitsPerSecond / 1e9, nil
}
