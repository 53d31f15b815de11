package ovs

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// unixctl runs one command on an OVS daemon's control socket, as ovs-appctl does, but
// without a process per call: a JSON-RPC 1.0 request on the unix socket and its reply.
func unixctl(ctx context.Context, socket, method string, params ...string) (string, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", socket)
	if err != nil {
		return "", fmt.Errorf("unixctl %s: %w", method, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if params == nil {
		params = []string{}
	}
	req := struct {
		ID     int      `json:"id"`
		Method string   `json:"method"`
		Params []string `json:"params"`
	}{0, method, params}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return "", fmt.Errorf("unixctl %s: send: %w", method, err)
	}
	var resp struct {
		Result *string `json:"result"`
		Error  any     `json:"error"`
	}
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		return "", fmt.Errorf("unixctl %s: reply: %w", method, err)
	}
	if resp.Error != nil {
		return "", fmt.Errorf("unixctl %s: %v", method, resp.Error)
	}
	if resp.Result == nil {
		return "", nil
	}
	return *resp.Result, nil
}
