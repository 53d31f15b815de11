// Package masterclient is netplugin's client for netmaster's /plugin/* endpoints. It finds
// the leader the way Contiv's netplugin does: the value of /contiv.io/lock/netmaster/leader
// ("<ip>:<port>") is the address to POST to; if that fails it tries every registered
// netmaster (service "netmaster", then "netmaster.rpc") in turn.
//
// It knows etcd keys and the request bodies, nothing about dataplanes.
package masterclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// serviceInfo is Contiv's objdb.ServiceInfo as stored under /contiv.io/service/.
type serviceInfo struct {
	ServiceName string
	HostAddr    string
	Port        int
}

// Client posts plugin requests to the current netmaster leader.
type Client struct {
	store *state.Store
	http  *http.Client
}

// New returns a client that discovers netmaster through store.
func New(store *state.Store) *Client {
	return &Client{store: store, http: &http.Client{Timeout: 30 * time.Second}}
}

// HTTPError is a non-200 reply from netmaster; Message is its plain-text body.
type HTTPError struct {
	Addr    string
	Path    string
	Status  int
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("netmaster %s%s: HTTP %d: %s", e.Addr, e.Path, e.Status, e.Message)
}

// Addresses returns the candidate netmaster addresses in the order they are tried:
// the leader lock holder first, then registered netmasters.
func (c *Client) Addresses(ctx context.Context) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	add := func(a string) {
		a = strings.TrimPrefix(strings.TrimSpace(a), "http://")
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	kvs, _, err := c.store.List(ctx, state.LeaderLockKey)
	if err != nil {
		return nil, fmt.Errorf("read netmaster leader: %w", err)
	}
	for _, kv := range kvs {
		if kv.Key == state.LeaderLockKey {
			add(string(kv.Value))
		}
	}
	for _, svc := range []string{"netmaster", "netmaster.rpc"} {
		regs, _, err := c.store.List(ctx, state.ServicePrefix+svc+"/")
		if err != nil {
			return nil, fmt.Errorf("list %s registrations: %w", svc, err)
		}
		for _, kv := range regs {
			var si serviceInfo
			if err := json.Unmarshal(kv.Value, &si); err != nil || si.HostAddr == "" {
				continue
			}
			if svc == "netmaster.rpc" {
				// Contiv registers the RPC port (9001) here; the REST port is what we need,
				// and only its host is useful as a last resort with the default port.
				add(fmt.Sprintf("%s:9999", si.HostAddr))
				continue
			}
			add(fmt.Sprintf("%s:%d", si.HostAddr, si.Port))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no netmaster found: leader lock empty and no netmaster registered")
	}
	return out, nil
}

// Post sends req as JSON to path on the leader (falling back to other netmasters on
// connection errors) and decodes the reply into resp. A netmaster that answers with an
// error status is not retried elsewhere: followers proxy to the leader, so the answer is
// authoritative.
func (c *Client) Post(ctx context.Context, path string, req, resp any) error {
	addrs, err := c.Addresses(ctx)
	if err != nil {
		return err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", path, err)
	}
	var errs []error
	for _, a := range addrs {
		err := c.post(ctx, a, path, body, resp)
		if err == nil {
			return nil
		}
		var he *HTTPError
		if errors.As(err, &he) || ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("post %s: every netmaster failed: %w", path, errors.Join(errs...))
}

func (c *Client) post(ctx context.Context, addr, path string, body []byte, resp any) error {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build request %s%s: %w", addr, path, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	r, err := c.http.Do(hr)
	if err != nil {
		return fmt.Errorf("post %s%s: %w", addr, path, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("read reply of %s%s: %w", addr, path, err)
	}
	if r.StatusCode != http.StatusOK {
		return &HTTPError{Addr: addr, Path: path, Status: r.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(b, resp); err != nil {
		return fmt.Errorf("decode reply of %s%s: %w", addr, path, err)
	}
	return nil
}

// CreateEndpoint calls /plugin/createEndpoint and returns the endpoint netmaster stored.
func (c *Client) CreateEndpoint(ctx context.Context, req model.CreateEndpointRequest) (model.CfgEndpointState, error) {
	var resp model.CreateEndpointResponse
	if err := c.Post(ctx, "/plugin/createEndpoint", req, &resp); err != nil {
		return model.CfgEndpointState{}, err
	}
	return resp.EndpointConfig, nil
}

// DeleteEndpoint calls /plugin/deleteEndpoint.
func (c *Client) DeleteEndpoint(ctx context.Context, req model.DeleteEndpointRequest) error {
	var resp model.DeleteEndpointResponse
	return c.Post(ctx, "/plugin/deleteEndpoint", req, &resp)
}

// AllocAddress calls /plugin/allocAddress.
func (c *Client) AllocAddress(ctx context.Context, req model.AllocAddressRequest) (model.AllocAddressResponse, error) {
	var resp model.AllocAddressResponse
	err := c.Post(ctx, "/plugin/allocAddress", req, &resp)
	return resp, err
}

// ReleaseAddress calls /plugin/releaseAddress.
func (c *Client) ReleaseAddress(ctx context.Context, req model.ReleaseAddressRequest) error {
	var resp string
	return c.Post(ctx, "/plugin/releaseAddress", req, &resp)
}
