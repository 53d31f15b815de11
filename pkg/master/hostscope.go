package master

import (
	"net/http"
	"slices"
	"strings"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// The host scope routes (model.HostScope): GET /api/v1/hostScopes/ (every host's scope)
// and /api/v1/hostScopes/<host>/, PUT or POST (an admin sets a host's scope: the whole
// record) and DELETE (an admin drops it: the host serves every tenant again). Hosts'
// names are for admins, operators and agents: a tenant-admin reads none (auth.Authorize).
// Contiv has no such collection; its clients never call it.
func registerHostScopes(r *mux.Router, m *Master) {
	const base = "/api/v1/" + model.CollHostScopes + "/"
	r.HandleFunc(base, m.listHostScopes).Methods(http.MethodGet)
	r.HandleFunc(base+"{host}/", m.getHostScope).Methods(http.MethodGet)
	r.HandleFunc(base+"{host}/", m.setHostScope).Methods(http.MethodPost, http.MethodPut)
	r.HandleFunc(base+"{host}/", m.deleteHostScope).Methods(http.MethodDelete)
}

// maxScopeEntries bounds a scope's tenants and networks together.
const maxScopeEntries = 4096

// checkHostScope validates an admin's scope for host (the URL's, which the body may repeat).
func checkHostScope(host string, s *model.HostScope) error {
	// Any host an agent creates endpoints on (ConfigEP.Host: checkPluginFields) can be
	// given a scope, "node_1" too: a host whose name a scope could not hold could never be
	// confined (found by review).
	if host == "" {
		return badReq("host: required")
	}
	if err := checkPluginFields(map[string]string{"host": host}); err != nil {
		return err
	}
	if s.Host != "" && !strings.EqualFold(s.Host, host) {
		return badReq("host: %q differs from the URL's host %q", s.Host, host)
	}
	s.Host = strings.ToLower(host) // (as model.HostScopeKey spells it)
	if n := len(s.Tenants) + len(s.Networks); n > maxScopeEntries {
		return badReq("tenants, networks: %d entries, at most %d", n, maxScopeEntries)
	}
	for _, t := range s.Tenants {
		if err := checkName("tenants", t, 64); err != nil {
			return err
		}
	}
	for _, n := range s.Networks {
		t, net, ok := strings.Cut(n, ":")
		if !ok {
			return badReq("networks: %q is not <tenant>:<network>", n)
		}
		if err := checkName("networks", t, 64); err != nil {
			return err
		}
		if err := checkName("networks", net, 64); err != nil {
			return err
		}
	}
	slices.Sort(s.Tenants)
	s.Tenants = slices.Compact(s.Tenants)
	slices.Sort(s.Networks)
	s.Networks = slices.Compact(s.Networks)
	if s.Tenants == nil {
		s.Tenants = []string{}
	}
	if s.Networks == nil {
		s.Networks = []string{}
	}
	return nil
}

// adminOnly refuses a caller that is not an admin (403; a request without an identity,
// of an --insecure netmaster, is let through as every other write of it).
func adminOnly(r *http.Request, what string) error {
	if id, ok := auth.FromContext(r.Context()); ok && id.Role != auth.RoleAdmin {
		return errf(http.StatusForbidden, "%s are set by admins, not by %s %q", what, id.Role, id.Name)
	}
	return nil
}

func (m *Master) listHostScopes(w http.ResponseWriter, r *http.Request) {
	listRecords[model.HostScope](m, w, r, model.HostScopePrefix) // (by key: by host)
}

// listRecords answers every record under prefix, decoded as T, sorted by key: records of
// the hosts, which a tenant-admin never lists (auth.Authorize refuses it every one but the
// collection's list, which answers it none).
func listRecords[T any](m *Master, w http.ResponseWriter, r *http.Request, prefix string) {
	out := []T{}
	if _, scoped := auth.TenantScope(r.Context()); scoped {
		answer(w, out, nil)
		return
	}
	err := m.read(r.Context(), func(tx *state.Tx) error {
		recs, err := listT[T](tx, prefix)
		if err != nil {
			return err
		}
		out = out[:0]
		for _, v := range recs {
			out = append(out, *v)
		}
		return nil
	})
	answer(w, out, err)
}

func (m *Master) getHostScope(w http.ResponseWriter, r *http.Request) {
	host := mux.Vars(r)["host"]
	getRecord[model.HostScope](m, w, r, model.HostScopeKey(host), notFound("host %q has no scope: it serves every tenant", host))
}

// getRecord answers the record at key, decoded as T, or missing when there is none.
func getRecord[T any](m *Master, w http.ResponseWriter, r *http.Request, key string, missing error) {
	var v *T
	err := m.read(r.Context(), func(tx *state.Tx) error {
		var found bool
		var err error
		if v, found, err = getT[T](tx, key); err == nil && !found {
			err = missing
		}
		return err
	})
	answer(w, v, err)
}

func (m *Master) setHostScope(w http.ResponseWriter, r *http.Request) {
	if err := adminOnly(r, "host scopes"); err != nil {
		writeErr(w, err)
		return
	}
	host := mux.Vars(r)["host"]
	var s model.HostScope
	if err := decodeStrict(r, &s); err != nil {
		writeErr(w, err)
		return
	}
	if err := checkHostScope(host, &s); err != nil {
		writeErr(w, err)
		return
	}
	err := m.update(r.Context(), func(tx *state.Tx) error { return tx.Put(model.HostScopeKey(host), &s) })
	if err == nil {
		m.log.Info("host scope set", "host", host, "tenants", s.Tenants, "networks", s.Networks)
	}
	answer(w, s, err)
}

func (m *Master) deleteHostScope(w http.ResponseWriter, r *http.Request) {
	host := mux.Vars(r)["host"]
	if dropRecord(m, w, r, "host scopes", model.HostScopeKey(host), notFound("host %q has no scope", host)) {
		m.log.Info("host scope dropped: the host serves every tenant", "host", host)
	}
}

// dropRecord deletes the record at key for an admin (what: the records' kind, for a
// refusal) and answers; missing when there is none. It reports whether it went.
func dropRecord(m *Master, w http.ResponseWriter, r *http.Request, what, key string, missing error) bool {
	if err := adminOnly(r, what); err != nil {
		writeErr(w, err)
		return false
	}
	err := m.update(r.Context(), func(tx *state.Tx) error { return deleteExisting(tx, key, missing) })
	answer(w, "success", err)
	return err == nil
}

// deleteExisting deletes key in tx, or returns missing when there is none (whatever the
// record holds: one that does not decode goes too).
func deleteExisting(tx *state.Tx, key string, missing error) error {
	if _, ok, err := tx.GetRaw(key); err != nil {
		return err
	} else if !ok {
		return missing
	}
	tx.Delete(key)
	return nil
}

// inScope refuses (403 naming field) a caller bound to host (boundHost; "": anyone) network
// of tenant when the host's scope does not hold it. No scope record: every tenant.
func inScope(tx *state.Tx, host, field, tenant, network string) error {
	if host == "" {
		return nil
	}
	s, found, err := getT[model.HostScope](tx, model.HostScopeKey(host))
	if err != nil || !found {
		return err
	}
	if !s.Serves(tenant, network) {
		return errf(http.StatusForbidden, "%s: host %q does not serve network %q of tenant %q (its scope, /api/v1/%s/%s/, set by admins)",
			field, host, network, tenant, model.CollHostScopes, host)
	}
	return nil
}
