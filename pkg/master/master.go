// Package master is netmaster's heart: Contiv's REST model API (/api/v1/...), inspect views,
// the /plugin/* endpoints netplugin calls, IPv4/IPv6 address management and VLAN/VXLAN tag
// allocation. Every write runs in one state.Store transaction that also updates the derived
// /contiv.io/state records agents consume, so a failed request leaves etcd untouched and
// concurrent netmasters never hand out an address or tag twice.
//
// It does not do leader election, service registration or proxying (the HA layer wraps
// Handler), and it never touches netlink or a dataplane.
package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// Config configures a Master.
type Config struct {
	// Store is the etcd store; required.
	Store *state.Store
	// FwdMode (bridge|routing) and Infra (default|aci|aci-opflex) seed the global object.
	// An empty FwdMode leaves the stored/global value alone (new clusters then have none
	// until `netctl global set --fwd-mode`).
	FwdMode string
	Infra   string
	// NetMode (vlan|vxlan) and ClusterMode (docker|kubernetes|swarm-mode) are informational
	// (global inspect shows ClusterMode).
	NetMode     string
	ClusterMode string
	// PluginName is the docker driver/IPAM name (default "netplugin"); informational here.
	PluginName string
	// Version is served at GET /version.
	Version model.VersionInfo
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Quota holds the default per-tenant limits by kind (model.QuotaKinds; DefaultQuota is
	// netmaster's); a kind it lacks is not limited unless an admin sets a tenant's limit.
	// Usage is kept in any case.
	Quota map[string]int64
	// EtcdAccess manages agents' etcd users (pkg/etcdrbac): POST /plugin/etcdAccess
	// enrolls a bound agent's registration keys. nil: netmaster does not manage etcd's
	// users (RBAC off, or an external etcd).
	EtcdAccess EtcdAccess
}

// EtcdAccess grants a host's agent write access to its service registration keys.
// Managing is nil when it manages users now (etcdrbac.ErrNotManaged while the etcd
// another netmaster runs has its auth off).
type EtcdAccess interface {
	Managing(ctx context.Context) error
	Enroll(ctx context.Context, host string, regs []model.EtcdRegistration) error
}

// Master serves netmaster's API on top of the store.
type Master struct {
	cfg   Config
	store *state.Store
	log   *slog.Logger
	// mu serialises this process's write transactions so that local requests never fight
	// each other for etcd compare-and-swap retries; other netmasters are still excluded by
	// the transaction itself.
	mu sync.Mutex
	// refused counts the changes refused for quota, by tenant and kind.
	refused *prometheus.CounterVec
}

// New validates cfg and makes sure the default tenant, the global object and the records
// derived from it (/contiv.io/master/config/global, gstate, tag resources) exist.
func New(ctx context.Context, cfg Config) (*Master, error) {
	if cfg.Store == nil {
		return nil, errors.New("master: Config.Store is required")
	}
	if cfg.FwdMode != "" && cfg.FwdMode != "bridge" && cfg.FwdMode != "routing" {
		return nil, fmt.Errorf("master: fwd mode %q: must be bridge or routing", cfg.FwdMode)
	}
	switch cfg.Infra {
	case "":
		cfg.Infra = "default"
	case "default", "aci", "aci-opflex":
	default:
		return nil, fmt.Errorf("master: infra %q: must be default, aci or aci-opflex", cfg.Infra)
	}
	if cfg.PluginName == "" {
		cfg.PluginName = "netplugin"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := checkLimits(cfg.Quota); err != nil {
		return nil, fmt.Errorf("master: default quota: %w", err)
	}
	m := &Master{cfg: cfg, store: cfg.Store, log: cfg.Logger, refused: newRefusedCounter()}
	if err := m.bootstrap(withoutQuota(ctx)); err != nil {
		return nil, err
	}
	if err := m.stripStoredLinks(ctx); err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	if err := m.reconcileUsage(ctx); err != nil {
		return nil, fmt.Errorf("master: %w", err)
	}
	return m, nil
}

// Config returns the configuration the master runs with (defaults filled in).
func (m *Master) Config() Config { return m.cfg }

// update runs fn in one transaction whose changes are booked into the usage of the
// tenants they touch (account), within their quotas.
func (m *Master) update(ctx context.Context, fn func(tx *state.Tx) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.store.Update(ctx, func(tx *state.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		return m.account(ctx, tx)
	})
}

// read runs fn against one consistent snapshot without writing.
func (m *Master) read(ctx context.Context, fn func(tx *state.Tx) error) error {
	return m.store.Update(ctx, fn)
}

func (m *Master) bootstrap(ctx context.Context) error {
	err := m.update(ctx, func(tx *state.Tx) error {
		var g model.Global
		found, err := tx.Get(model.ModelKey(model.TypeGlobal, "global"), &g)
		if err != nil {
			return err
		}
		if !found {
			g = model.Global{Key: "global", Name: "global", NetworkInfraType: m.cfg.Infra, FwdMode: m.cfg.FwdMode,
				ArpMode: "proxy", PvtSubnet: "172.19.0.0/16", Vlans: "1-4094", Vxlans: "1-10000"}
			if err := saveGlobal(tx, &g, nil); err != nil {
				return fmt.Errorf("create global: %w", err)
			}
		} else {
			// Re-derive the records agents wait for, in case they were lost.
			var gc model.GlobConfig
			ok, err := tx.Get(model.GlobConfigKey, &gc)
			if err != nil {
				return err
			}
			if !ok {
				if err := saveGlobal(tx, &g, nil); err != nil {
					return fmt.Errorf("restore global state: %w", err)
				}
			}
		}
		var t model.Tenant
		found, err = tx.Get(model.ModelKey(model.TypeTenant, "default"), &t)
		if err != nil {
			return err
		}
		if !found {
			t = model.Tenant{Key: "default", TenantName: "default"}
			return tx.Put(model.ModelKey(model.TypeTenant, "default"), &t)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("master: bootstrap default tenant and global: %w", err)
	}
	// Flags override the stored global, as Contiv's netmaster does at start-up; a refused
	// change (e.g. fwd-mode while networks exist) is logged, not fatal.
	err = m.update(ctx, func(tx *state.Tx) error {
		var g model.Global
		if _, err := tx.Get(model.ModelKey(model.TypeGlobal, "global"), &g); err != nil {
			return err
		}
		ng := g
		if m.cfg.FwdMode != "" {
			ng.FwdMode = m.cfg.FwdMode
		}
		if m.cfg.Infra != "" {
			ng.NetworkInfraType = m.cfg.Infra
		}
		if ng == g {
			return nil
		}
		return saveGlobal(tx, &ng, &g)
	})
	if err != nil {
		m.log.Warn("global settings from flags not applied", "err", err)
	}
	return nil
}

// apiError carries the HTTP status of a refused request.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func errf(code int, format string, a ...any) error {
	return &apiError{code: code, msg: fmt.Sprintf(format, a...)}
}

// Status helpers: 400 bad input, 404 missing object at the URL, 422 a referenced object is
// missing, 409 the request conflicts with existing state.
func badReq(format string, a ...any) error   { return errf(http.StatusBadRequest, format, a...) }
func notFound(format string, a ...any) error { return errf(http.StatusNotFound, format, a...) }
func unproc(format string, a ...any) error   { return errf(http.StatusUnprocessableEntity, format, a...) }
func conflict(format string, a ...any) error { return errf(http.StatusConflict, format, a...) }

func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return http.StatusServiceUnavailable
	}
	if errors.Is(err, state.ErrTxnTooLarge) {
		return http.StatusRequestEntityTooLarge // a real limit, never a 500
	}
	return http.StatusInternalServerError
}
