package master

import (
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// The quota routes: GET /api/v1/quotas/ (every tenant's, a tenant-admin's own only), GET
// /api/v1/quotas/<tenant>/, POST or PUT (an admin sets limits: model.QuotaUpdate) and
// DELETE (an admin drops every limit it set: the defaults apply again). Contiv has no such
// collection; its clients never call it.
func registerQuotas(r *mux.Router, m *Master) {
	const base = "/api/v1/" + model.CollQuotas + "/"
	r.HandleFunc(base, m.listQuotas).Methods(http.MethodGet)
	r.HandleFunc(base+"{tenant}/", m.getQuota).Methods(http.MethodGet)
	r.HandleFunc(base+"{tenant}/", m.setQuota).Methods(http.MethodPost, http.MethodPut)
	r.HandleFunc(base+"{tenant}/", m.resetQuota).Methods(http.MethodDelete)
}

// checkLimits refuses an unknown kind or a negative limit.
func checkLimits(limits map[string]int64) error {
	for k, v := range limits {
		if err := checkLimit(k, &v); err != nil {
			return err
		}
	}
	return nil
}

// checkLimit refuses an unknown kind or a negative limit (nil: the default, fine).
func checkLimit(kind string, limit *int64) error {
	if !model.IsQuotaKind(kind) {
		return badReq("quota %q: unknown kind (one of %v)", kind, model.QuotaKinds())
	}
	if limit != nil && *limit < 0 {
		return badReq("quota %q: limit %d is negative", kind, *limit)
	}
	return nil
}

// tenantQuota is tenant's quota view as tx sees it (404 for a tenant that does not exist).
func (m *Master) tenantQuota(tx *state.Tx, tenant string) (model.TenantQuota, error) {
	q := model.TenantQuota{Tenant: tenant}
	if ok, err := tx.Get(model.ModelKey(model.TypeTenant, tenant), &model.Tenant{}); err != nil {
		return q, err
	} else if !ok {
		return q, notFound("tenant %q not found", tenant)
	}
	var err error
	if q.Limits, q.Overrides, err = m.limitsOf(tx, tenant); err != nil {
		return q, err
	}
	u, found, err := getT[model.TenantUsage](tx, model.QuotaUsageKey(tenant))
	if err != nil {
		return q, err
	}
	if !found || u.Version != model.UsageVersion {
		if u, err = recountTenant(tx, tenant); err != nil {
			return q, err
		}
	}
	q.Usage = addUsage(u.Usage, nil)
	return q, nil
}

func (m *Master) listQuotas(w http.ResponseWriter, r *http.Request) {
	own, scoped := auth.TenantScope(r.Context())
	out := []model.TenantQuota{}
	err := m.read(r.Context(), func(tx *state.Tx) error {
		out = out[:0]
		kvs, err := tx.List(model.ModelKey(model.TypeTenant, ""))
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			tenant := kv.Key[len(model.ModelKey(model.TypeTenant, "")):]
			if scoped && tenant != own {
				continue
			}
			q, err := m.tenantQuota(tx, tenant)
			if err != nil {
				return err
			}
			out = append(out, q)
		}
		return nil
	})
	answer(w, out, err)
}

func (m *Master) getQuota(w http.ResponseWriter, r *http.Request) {
	tenant := mux.Vars(r)["tenant"]
	if own, scoped := auth.TenantScope(r.Context()); scoped && own != tenant {
		writeErr(w, errf(http.StatusForbidden, "the quota of tenant %q is not tenant %q's to read", tenant, own))
		return
	}
	var q model.TenantQuota
	err := m.read(r.Context(), func(tx *state.Tx) error {
		var err error
		q, err = m.tenantQuota(tx, tenant)
		return err
	})
	answer(w, q, err)
}

// setQuota merges an admin's limits into tenant's (model.QuotaUpdate) and recounts its
// usage: setting a quota also repairs a usage record that went wrong.
func (m *Master) setQuota(w http.ResponseWriter, r *http.Request) {
	var upd model.QuotaUpdate
	if err := decodeStrict(r, &upd); err != nil {
		writeErr(w, err)
		return
	}
	for k, v := range upd {
		if err := checkLimit(k, v); err != nil {
			writeErr(w, err)
			return
		}
	}
	m.writeQuota(w, r, func(cur map[string]int64) map[string]int64 {
		for k, v := range upd {
			if v == nil {
				delete(cur, k)
			} else {
				cur[k] = *v
			}
		}
		return cur
	})
}

// resetQuota drops every limit an admin set for the tenant.
func (m *Master) resetQuota(w http.ResponseWriter, r *http.Request) {
	m.writeQuota(w, r, func(map[string]int64) map[string]int64 { return nil })
}

// writeQuota replaces the admin's limits of the URL's tenant by change(current ones),
// recounts its usage and answers the quota view.
func (m *Master) writeQuota(w http.ResponseWriter, r *http.Request, change func(map[string]int64) map[string]int64) {
	tenant := mux.Vars(r)["tenant"]
	if id, ok := auth.FromContext(r.Context()); ok && id.Role != auth.RoleAdmin {
		writeErr(w, errf(http.StatusForbidden, "quotas are set by admins, not by %s %q", id.Role, id.Name))
		return
	}
	var q model.TenantQuota
	err := m.update(withoutQuota(r.Context()), func(tx *state.Tx) error {
		if err := putLimits(tx, tenant, change); err != nil {
			return err
		}
		// The record the recount replaces, read for its guard (recountTenant).
		if _, _, err := tx.GetRaw(model.QuotaUsageKey(tenant)); err != nil {
			return err
		}
		u, err := recountTenant(tx, tenant)
		if err != nil {
			return err
		}
		if err := putUsage(tx, u); err != nil {
			return err
		}
		q, err = m.tenantQuota(tx, tenant)
		return err
	})
	if err == nil {
		m.log.Info("quota set", "tenant", tenant, "limits", q.Overrides)
	}
	answer(w, q, err)
}

// answer writes v as the JSON answer, or err.
func answer(w http.ResponseWriter, v any, err error) {
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, v)
}

// putLimits writes change(tenant's current limits) as its limits record (none left: the
// record goes). The tenant must exist.
func putLimits(tx *state.Tx, tenant string, change func(map[string]int64) map[string]int64) error {
	if ok, err := tx.Get(model.ModelKey(model.TypeTenant, tenant), &model.Tenant{}); err != nil {
		return err
	} else if !ok {
		return notFound("tenant %q not found", tenant)
	}
	cur := map[string]int64{}
	raw, found, err := tx.GetRaw(model.QuotaLimitsKey(tenant))
	if err != nil {
		return err
	}
	// A record that does not decode keeps the tenant's creates failing (limitsOf): the
	// admin's write replaces it, or nothing but etcdctl would bring the tenant back.
	var o model.TenantQuotaLimits
	if found && json.Unmarshal(raw, &o) == nil {
		for k, v := range o.Limits {
			cur[k] = v
		}
	}
	next := change(cur)
	if len(next) == 0 {
		tx.Delete(model.QuotaLimitsKey(tenant))
		return nil
	}
	return tx.Put(model.QuotaLimitsKey(tenant), model.TenantQuotaLimits{Tenant: tenant, Limits: next})
}
