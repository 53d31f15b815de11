package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// MasterDoer sends one REST request to netmaster, leader first (*masterclient.Client
// satisfies it); an error status comes back as *masterclient.HTTPError.
type MasterDoer interface {
	Do(ctx context.Context, method, path string, req, resp any) error
}

// MasterREST is a NetworkAPI over netmaster's REST API (/api/v1/networks/<tenant>:<name>/).
type MasterREST struct {
	Master MasterDoer
}

// CreateNetwork posts the network object.
func (m MasterREST) CreateNetwork(ctx context.Context, n model.Network) error {
	if m.Master == nil {
		return errors.New("netmaster REST: no client")
	}
	if err := m.Master.Do(ctx, http.MethodPost, "/api/v1/networks/"+model.ScopedKey(n.TenantName, n.NetworkName)+"/", n, nil); err != nil {
		return fmt.Errorf("create network %s: %w", n.Key, err)
	}
	return nil
}

// DeleteNetwork deletes the network object; a missing network is not an error.
func (m MasterREST) DeleteNetwork(ctx context.Context, tenant, name string) error {
	if m.Master == nil {
		return errors.New("netmaster REST: no client")
	}
	err := m.Master.Do(ctx, http.MethodDelete, "/api/v1/networks/"+model.ScopedKey(tenant, name)+"/", nil, nil)
	var he *masterclient.HTTPError
	if errors.As(err, &he) && (he.Status == http.StatusNotFound || strings.Contains(strings.ToLower(he.Message), "not found")) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete network %s: %w", model.ScopedKey(tenant, name), err)
	}
	return nil
}
