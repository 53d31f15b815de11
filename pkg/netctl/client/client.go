// Package client is a small typed REST client for netmaster's Contiv-compatible API
// (/api/v1/<collection>/<key>/, inspect views and /version). It owns URL building, the
// trailing-slash convention, error bodies and connection errors; it knows nothing about the
// CLI or how results are printed. netctl uses it, and so can other packages' tests.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// Client talks to one netmaster (or anything serving its API).
type Client struct {
	base   string
	http   *http.Client
	header http.Header
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient replaces the default http.Client (timeouts, custom transports).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.http = hc }
}

// WithHeader adds a header to every request (for example X-Auth-Token behind auth_proxy).
func WithHeader(name, value string) Option {
	return func(c *Client) { c.header.Add(name, value) }
}

// New returns a client for baseURL, which must begin with http:// or https://.
func New(baseURL string, opts ...Option) (*Client, error) {
	if !strings.HasPrefix(baseURL, "http://") && !strings.HasPrefix(baseURL, "https://") {
		return nil, fmt.Errorf("invalid netmaster URL %q: must begin with http:// or https://", baseURL)
	}
	if _, err := url.Parse(baseURL); err != nil {
		return nil, fmt.Errorf("invalid netmaster URL %q: %w", baseURL, err)
	}
	c := &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{}, header: http.Header{}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// APIError is a non-2xx answer. Message is the response body (netmaster sends the reason as
// text/plain), trimmed, or the HTTP status when the body is empty.
type APIError struct {
	Method     string
	URL        string
	StatusCode int
	Message    string
}

func (e *APIError) Error() string { return e.Message }

// ConnError means the request never got an HTTP answer (refused, DNS, TLS, timeout).
type ConnError struct {
	URL string
	Err error
}

func (e *ConnError) Error() string {
	hint := ""
	switch {
	case errors.Is(e.Err, syscall.ECONNREFUSED):
		hint = " (connection refused: is netmaster running and listening there? set --netmaster or NETMASTER)"
	default:
		var dnsErr *net.DNSError
		if errors.As(e.Err, &dnsErr) && dnsErr.IsNotFound {
			hint = " (unknown host: set --netmaster or NETMASTER to netmaster's address)"
		}
	}
	return fmt.Sprintf("cannot reach netmaster at %s: %v%s", e.URL, e.Err, hint)
}

func (e *ConnError) Unwrap() error { return e.Err }

const problemJSON = "application/problem+json"

// Do sends one request to path (relative to the base URL, e.g. "/api/v1/tenants/"). in, when
// non-nil, is sent as JSON; out, when non-nil, receives the decoded JSON answer.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		buf, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s %s body: %w", method, path, err)
		}
		body = bytes.NewReader(buf)
	}
	u := c.base + path
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, u, err)
	}
	for k, vs := range c.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// Real statuses with RFC 7807 bodies (without it netmaster answers errors as Contiv
	// did: 500 + text).
	req.Header.Set("Accept", "application/json, "+problemJSON)
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return &ConnError{URL: c.base, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read %s %s answer: %w", method, u, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg := strings.TrimSpace(string(data))
		var p struct {
			Detail string `json:"detail"`
		}
		if resp.Header.Get("Content-Type") == problemJSON && json.Unmarshal(data, &p) == nil && p.Detail != "" {
			msg = p.Detail
		}
		if msg == "" {
			msg = resp.Status
		}
		return &APIError{Method: method, URL: u, StatusCode: resp.StatusCode, Message: msg}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode %s %s answer: %w", method, u, err)
	}
	return nil
}

// ObjectPath is /api/v1/<collection>/<key>/ (the trailing slash is mandatory).
func ObjectPath(collection, key string) string {
	return "/api/v1/" + collection + "/" + url.PathEscape(key) + "/"
}

// CollectionPath is /api/v1/<collection>/.
func CollectionPath(collection string) string { return "/api/v1/" + collection + "/" }

// InspectPath is /api/v1/inspect/<collection>/<key>/.
func InspectPath(collection, key string) string {
	return "/api/v1/inspect/" + collection + "/" + url.PathEscape(key) + "/"
}

// List fetches a whole collection into a slice of T.
func List[T any](ctx context.Context, c *Client, collection string) ([]T, error) {
	var out []T
	if err := c.Do(ctx, http.MethodGet, CollectionPath(collection), nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// Get fetches one object.
func Get[T any](ctx context.Context, c *Client, collection, key string) (*T, error) {
	var out T
	if err := c.Do(ctx, http.MethodGet, ObjectPath(collection, key), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Inspect fetches the {"Config","Oper"} view of one object.
func Inspect[T any](ctx context.Context, c *Client, collection, key string) (*T, error) {
	var out T
	if err := c.Do(ctx, http.MethodGet, InspectPath(collection, key), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Post creates (or updates) one object under key.
func (c *Client) Post(ctx context.Context, collection, key string, obj any) error {
	return c.Do(ctx, http.MethodPost, ObjectPath(collection, key), obj, nil)
}

// Delete removes one object.
func (c *Client) Delete(ctx context.Context, collection, key string) error {
	return c.Do(ctx, http.MethodDelete, ObjectPath(collection, key), nil, nil)
}

// Version fetches netmaster's build information.
func (c *Client) Version(ctx context.Context) (*model.VersionInfo, error) {
	var v model.VersionInfo
	if err := c.Do(ctx, http.MethodGet, "/version", nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}
