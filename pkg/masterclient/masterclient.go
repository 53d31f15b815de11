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
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/retry"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Client posts plugin requests to the current netmaster leader.
type Client struct {
	store  *state.Store
	http   *http.Client
	scheme string
	token  string
}

// Option configures a Client.
type Option func(*Client)

// WithTLS makes the client speak HTTPS to netmaster with tc (CA to trust, optional
// client certificate).
func WithTLS(tc *tls.Config) Option {
	return func(c *Client) {
		c.scheme = "https"
		c.http.Transport = &http.Transport{TLSClientConfig: tc, MaxIdleConnsPerHost: 16, IdleConnTimeout: 60 * time.Second}
	}
}

// WithToken sends a bearer token (role agent) with every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// New returns a client that discovers netmaster through store.
func New(store *state.Store, opts ...Option) *Client {
	c := &Client{store: store, http: &http.Client{Timeout: 30 * time.Second}, scheme: "http"}
	for _, o := range opts {
		o(c)
	}
	return c
}

// HTTPError is a non-200 reply from netmaster; Message is its plain-text body.
type HTTPError struct {
	Addr    string
	Path    string
	Status  int
	Message string
	// Unprocessed: a 503 netmaster answered before any handler saw the request
	// (cluster.UnprocessedHeader: no leader, leadership changing); Do sends it again.
	Unprocessed bool
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
		a = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(a), "http://"), "https://")
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
	var listErrs []error
	for _, svc := range []string{cluster.ServiceNetmaster, cluster.ServiceNetmasterRPC} {
		regs, err := cluster.ListServices(ctx, c.store, svc)
		if err != nil {
			// A broken registration must not hide the others: report it only if nothing
			// else is found.
			listErrs = append(listErrs, err)
			continue
		}
		for _, si := range regs {
			if si.HostAddr == "" {
				continue
			}
			if svc == cluster.ServiceNetmasterRPC {
				// Contiv registers the RPC port (9001) here; the REST port is what we need,
				// and only its host is useful as a last resort with the default port.
				add(net.JoinHostPort(si.HostAddr, "9999"))
				continue
			}
			add(si.Addr())
		}
	}
	if len(out) == 0 {
		if len(listErrs) > 0 {
			return nil, fmt.Errorf("no netmaster found: leader lock empty and registrations unreadable: %w", errors.Join(listErrs...))
		}
		return nil, errors.New("no netmaster found: leader lock empty and no netmaster registered")
	}
	return out, nil
}

// Post sends req as JSON to path on the leader; see Do.
func (c *Client) Post(ctx context.Context, path string, req, resp any) error {
	return c.Do(ctx, http.MethodPost, path, req, resp)
}

// unprocessedWait bounds how long Do keeps sending a request netmaster answered
// "unprocessed" (an election in progress takes a lease TTL at most: 4 s by default).
const unprocessedWait = 10 * time.Second

// Do sends method path with req as its JSON body (no body when req is nil) to the
// leader, falling back to the other netmasters in Addresses order on connection errors,
// and decodes a 2xx reply into resp (unless resp is nil). A netmaster that answers with
// an error status is not retried elsewhere (followers proxy to the leader, so the answer
// is authoritative): the error is an *HTTPError. A 503 netmaster marks unprocessed (no
// leader for the moment: an etcd leader change, a netmaster failover), or a 429 (its
// budget of request bytes in memory spent: nothing read), is sent again, to the leader of
// the moment, for up to unprocessedWait within ctx: a container started meanwhile is
// attached late instead of failing.
func (c *Client) Do(ctx context.Context, method, path string, req, resp any) error {
	var body []byte
	if req != nil {
		var err error
		if body, err = json.Marshal(req); err != nil {
			return fmt.Errorf("encode %s %s request: %w", method, path, err)
		}
	}
	deadline := time.Now().Add(unprocessedWait)
	wait := retry.New(100*time.Millisecond, time.Second)
	for {
		err := c.doOnce(ctx, method, path, body, resp)
		var he *HTTPError
		if !errors.As(err, &he) || !he.Unprocessed || time.Now().After(deadline) || !wait.Wait(ctx) {
			return err
		}
	}
}

// doOnce is one round of Do: the leader, then the other netmasters on connection errors.
func (c *Client) doOnce(ctx context.Context, method, path string, body []byte, resp any) error {
	addrs, err := c.Addresses(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range addrs {
		err := c.do(ctx, a, method, path, body, resp)
		if err == nil {
			return nil
		}
		var he *HTTPError
		if errors.As(err, &he) || ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%s %s: every netmaster failed: %w", method, path, errors.Join(errs...))
}

const problemJSON = "application/problem+json"

func (c *Client) do(ctx context.Context, addr, method, path string, body []byte, resp any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, method, c.scheme+"://"+addr+path, rd)
	if err != nil {
		return fmt.Errorf("build request %s %s%s: %w", method, addr, path, err)
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	hr.Header.Set("Accept", "application/json, "+problemJSON) // real statuses on /api/v1
	if c.token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.token)
	}
	r, err := c.http.Do(hr)
	if err != nil {
		return fmt.Errorf("%s %s%s: %w", method, addr, path, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("read reply of %s %s%s: %w", method, addr, path, err)
	}
	if r.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(b))
		var p struct {
			Detail string `json:"detail"`
		}
		if r.Header.Get("Content-Type") == problemJSON && json.Unmarshal(b, &p) == nil && p.Detail != "" {
			msg = p.Detail
		}
		// Unprocessed: netmaster did nothing with the request (no leader for the moment, or
		// its budget of request bytes in memory was spent: 429, refused before the body
		// was read).
		unprocessed := (r.StatusCode == http.StatusServiceUnavailable && r.Header.Get(cluster.UnprocessedHeader) != "") ||
			r.StatusCode == http.StatusTooManyRequests
		return &HTTPError{Addr: addr, Path: path, Status: r.StatusCode, Message: msg, Unprocessed: unprocessed}
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(b, resp); err != nil {
		return fmt.Errorf("decode reply of %s %s%s: %w", method, addr, path, err)
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

// UpdateEndpoint calls /plugin/updateEndpoint (a container started or died: its name and
// labels, service providers).
func (c *Client) UpdateEndpoint(ctx context.Context, req model.UpdateEndpointRequest) error {
	var resp model.UpdateEndpointResponse
	return c.Post(ctx, "/plugin/updateEndpoint", req, &resp)
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

// RecordEndpoint writes the agent's record of an endpoint it attached
// (/contiv.io/oper/eps/<id>) through netmaster (into etcd itself when netmaster lacks the
// route: withoutRoute).
func (c *Client) RecordEndpoint(ctx context.Context, rec model.LocalEndpointRecord) error {
	var resp struct{}
	err := c.Post(ctx, "/plugin/recordEndpoint", rec, &resp)
	if withoutRoute(err) {
		return c.store.Put(ctx, model.EpOperKey(rec.ID), rec)
	}
	return err
}

// ForgetEndpoint removes the agent's record of endpoint id through netmaster.
func (c *Client) ForgetEndpoint(ctx context.Context, id string) error {
	var resp struct{}
	err := c.Post(ctx, "/plugin/forgetEndpoint", model.ForgetEndpointRequest{ID: id}, &resp)
	if withoutRoute(err) {
		_, err = c.store.Delete(ctx, model.EpOperKey(id))
	}
	return err
}

// withoutRoute: netmaster answered 404, a build before /plugin/recordEndpoint (a rolling
// upgrade whose netplugins go first). Its agents wrote their records into etcd themselves,
// and so does this one then: such a netmaster manages no etcd users, so the agent's etcd
// credentials are not confined to its host (with etcd RBAC on, etcd refuses the write).
func withoutRoute(err error) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == http.StatusNotFound
}

// EtcdAccess asks netmaster for write access to this agent's registration keys (etcd RBAC).
func (c *Client) EtcdAccess(ctx context.Context, req model.EtcdAccessRequest) (model.EtcdAccessResponse, error) {
	var resp model.EtcdAccessResponse
	err := c.Post(ctx, "/plugin/etcdAccess", req, &resp)
	return resp, err
}

// PublishWireGuard publishes this host's WireGuard public key and endpoint through
// netmaster (never into etcd itself: agents' etcd credentials may not write it).
func (c *Client) PublishWireGuard(ctx context.Context, rec model.WireGuardHost) error {
	var resp struct{}
	return c.Post(ctx, "/plugin/publishWireGuard", rec, &resp)
}

// WireGuardHosts reads every host's published WireGuard record from etcd, sorted by host
// (wireGuardHostsOf says which records are left out and counted in skipped).
func (c *Client) WireGuardHosts(ctx context.Context) (hosts []model.WireGuardHost, skipped int, err error) {
	kvs, _, err := c.store.List(ctx, model.WireGuardPrefix)
	if err != nil {
		return nil, 0, fmt.Errorf("list wireguard hosts: %w", err)
	}
	hosts, skipped = wireGuardHostsOf(kvs)
	return hosts, skipped, nil
}

// WatchWireGuardHosts calls fn with every host's published WireGuard record (as
// WireGuardHosts reads them) at once and again after each change under the records'
// prefix, until ctx ends: one etcd watch, no polling. A broken watch resumes from the
// last revision seen; one whose revision was compacted meanwhile lists again
// (state.Store.ListWatch), so no change is missed. health hears whether the watch
// delivers (state.WatchHandler.Health: an error while etcd is out of reach or does not
// answer, nil once it does again). fn and health are called from one goroutine.
func (c *Client) WatchWireGuardHosts(ctx context.Context, fn func(hosts []model.WireGuardHost, skipped int), health func(err error)) error {
	cur := map[string]state.KV{}
	report := func() {
		kvs := make([]state.KV, 0, len(cur))
		for _, kv := range cur {
			kvs = append(kvs, kv)
		}
		fn(wireGuardHostsOf(kvs))
	}
	return c.store.ListWatch(ctx, model.WireGuardPrefix, state.WatchHandler{
		Snapshot: func(kvs []state.KV, _ int64) {
			clear(cur)
			for _, kv := range kvs {
				cur[kv.Key] = kv
			}
			report()
		},
		Event: func(ev state.Event) {
			if ev.Type == state.EventDelete {
				delete(cur, ev.Key)
			} else {
				cur[ev.Key] = state.KV{Key: ev.Key, Value: ev.Value, ModRev: ev.Rev}
			}
			report()
		},
		Health: health,
	})
}

// wireGuardHostsOf are the usable records of kvs, sorted by host. A record that does not
// check (model.WireGuardHost.Check), sits under another host's key or shares its public
// key with another record (netmaster refuses that, so it was written around netmaster:
// neither host can be trusted to hold the key, and a device refuses a peer list with one
// key twice) is left out and counted in skipped.
func wireGuardHostsOf(kvs []state.KV) (hosts []model.WireGuardHost, skipped int) {
	holders := map[string]int{} // public key → records holding it
	for _, kv := range kvs {
		var h model.WireGuardHost
		if kv.Decode(&h) != nil || h.Check() != nil || kv.Key != model.WireGuardKey(h.Host) {
			skipped++
			continue
		}
		holders[h.PublicKey]++
		hosts = append(hosts, h)
	}
	hosts = slices.DeleteFunc(hosts, func(h model.WireGuardHost) bool {
		if holders[h.PublicKey] > 1 {
			skipped++
			return true
		}
		return false
	})
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Host < hosts[j].Host })
	return hosts, skipped
}
