package dockerplugin

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
)

// AddressFinder lists netmaster addresses, leader first (*masterclient.Client satisfies it).
type AddressFinder interface {
	Addresses(ctx context.Context) ([]string, error)
}

// MasterREST is a NetworkAPI over netmaster's REST API (/api/v1/networks/<tenant>:<name>/).
type MasterREST struct {
	Finder AddressFinder
	HTTP   *http.Client // default: 30 s timeout
}

// CreateNetwork posts the network object.
func (m MasterREST) CreateNetwork(ctx context.Context, n model.Network) error {
	body, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode network %s: %w", n.Key, err)
	}
	return m.do(ctx, http.MethodPost, "/api/v1/networks/"+model.ScopedKey(n.TenantName, n.NetworkName)+"/", body)
}

// DeleteNetwork deletes the network object; a missing network is not an error.
func (m MasterREST) DeleteNetwork(ctx context.Context, tenant, name string) error {
	err := m.do(ctx, http.MethodDelete, "/api/v1/networks/"+model.ScopedKey(tenant, name)+"/", nil)
	var he *restError
	if errors.As(err, &he) && (he.status == http.StatusNotFound || strings.Contains(strings.ToLower(he.msg), "not found")) {
		return nil
	}
	return err
}

type restError struct {
	path   string
	status int
	msg    string
}

func (e *restError) Error() string {
	return fmt.Sprintf("netmaster %s: HTTP %d: %s", e.path, e.status, e.msg)
}

func (m MasterREST) do(ctx context.Context, method, path string, body []byte) error {
	if m.Finder == nil {
		return errors.New("netmaster REST: no address finder")
	}
	cl := m.HTTP
	if cl == nil {
		cl = &http.Client{Timeout: 30 * time.Second}
	}
	addrs, err := m.Finder.Addresses(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range addrs {
		req, err := http.NewRequestWithContext(ctx, method, "http://"+a+path, bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("build %s %s: %w", method, path, err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := cl.Do(req)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s%s: %w", method, a, path, err))
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return &restError{path: method + " " + path, status: resp.StatusCode, msg: strings.TrimSpace(string(b))}
		}
		return nil
	}
	return fmt.Errorf("netmaster %s %s: every netmaster failed: %w", method, path, errors.Join(errs...))
}
