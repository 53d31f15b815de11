package cniapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
)

// Client talks to a netplugin over its CNI unix socket.
type Client struct {
	path string
	http *http.Client
}

// NewClient returns a client for the socket at path ("" = DefaultSocket).
func NewClient(path string) *Client {
	if path == "" {
		path = DefaultSocket
	}
	return &Client{path: path, http: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}}
}

// AddPod asks the agent to attach a pod. A failure reply comes back as an error that
// carries the agent's message; the decoded reply is returned as well.
func (c *Client) AddPod(ctx context.Context, req PodRequest) (PodResponse, error) {
	return c.do(ctx, PathAddPod, req)
}

// DelPod asks the agent to detach a pod (idempotent on the agent side).
func (c *Client) DelPod(ctx context.Context, req PodRequest) (PodResponse, error) {
	return c.do(ctx, PathDelPod, req)
}

func (c *Client) do(ctx context.Context, path string, req PodRequest) (PodResponse, error) {
	var resp PodResponse
	body, err := json.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("encode %s request: %w", path, err)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://contiv-cni"+path, bytes.NewReader(body))
	if err != nil {
		return resp, fmt.Errorf("build %s request: %w", path, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	r, err := c.http.Do(hr)
	if err != nil {
		return resp, fmt.Errorf("post %s on %s: %w", path, c.path, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return resp, fmt.Errorf("read %s reply: %w", path, err)
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return resp, fmt.Errorf("%s: HTTP %d: %s", path, r.StatusCode, bytes.TrimSpace(b))
	}
	if r.StatusCode != http.StatusOK || resp.Result != 0 {
		return resp, fmt.Errorf("%s: %s (%s)", path, resp.ErrMsg, resp.ErrInfo)
	}
	return resp, nil
}
