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
	if l, found, err := getT[model.TenantQuotaLimits](tx, model.QuotaLimitsKey(tenant)); err != nil {
		return q, err
	} else if found {
		q.TagRanges = l.TagRanges
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

// setQuota merges an admin's limits into tenant's (model.QuotaUpdate; the tag ranges,
// strings, in the same body) and recounts its usage: setting a quota also repairs a usage
// record that went wrong.
func (m *Master) setQuota(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	if err := decodeStrict(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	upd, ranges, err := parseQuotaUpdate(body)
	if err != nil {
		writeErr(w, err)
		return
	}
	m.writeQuota(w, r, func(cur *model.TenantQuotaLimits) {
		for k, v := range upd {
			if v == nil {
				delete(cur.Limits, k)
			} else {
				cur.Limits[k] = *v
			}
		}
		for k, v := range ranges {
			*tagRangeField(&cur.TagRanges, k) = v
		}
	})
}

// parseQuotaUpdate reads a quota body: limits by kind, and tag ranges (field → range, ""
// to drop it).
func parseQuotaUpdate(body map[string]json.RawMessage) (model.QuotaUpdate, map[string]string, error) {
	upd, ranges := model.QuotaUpdate{}, map[string]string{}
	for k, raw := range body {
		if k == model.QuotaVLANs || k == model.QuotaVXLANs {
			var s *string
			if json.Unmarshal(raw, &s) != nil {
				return nil, nil, badReq("quota %q: want a range like \"100-199\", or null for none", k)
			}
			ranges[k] = ""
			if s != nil {
				r, err := checkTagRange(k, *s)
				if err != nil {
					return nil, nil, err
				}
				ranges[k] = r
			}
			continue
		}
		var v *int64
		if model.IsQuotaKind(k) && json.Unmarshal(raw, &v) != nil {
			return nil, nil, badReq("quota %q: want a whole number, or null for the default", k)
		}
		if err := checkLimit(k, v); err != nil {
			return nil, nil, err
		}
		upd[k] = v
	}
	return upd, ranges, nil
}

// tagRangeField is the field of r that holds range field k.
func tagRangeField(r *model.TagRanges, k string) *string {
	if k == model.QuotaVLANs {
		return &r.VLANs
	}
	return &r.VXLANs
}

// resetQuota drops every limit and tag range an admin set for the tenant.
func (m *Master) resetQuota(w http.ResponseWriter, r *http.Request) {
	m.writeQuota(w, r, func(cur *model.TenantQuotaLimits) { *cur = model.TenantQuotaLimits{} })
}

// writeQuota applies change to the admin's limits record of the URL's tenant, checks its
// tag ranges, recounts its usage and answers the quota view.
func (m *Master) writeQuota(w http.ResponseWriter, r *http.Request, change func(*model.TenantQuotaLimits)) {
	tenant := mux.Vars(r)["tenant"]
	if err := adminOnly(r, "quotas"); err != nil {
		writeErr(w, err)
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

// putLimits writes tenant's limits record as change leaves it (no limits and no ranges
// left: the record goes), refusing tag ranges that clash (checkTenantRanges). The tenant
// must exist.
func putLimits(tx *state.Tx, tenant string, change func(*model.TenantQuotaLimits)) error {
	if ok, err := tx.Get(model.ModelKey(model.TypeTenant, tenant), &model.Tenant{}); err != nil {
		return err
	} else if !ok {
		return notFound("tenant %q not found", tenant)
	}
	raw, found, err := tx.GetRaw(model.QuotaLimitsKey(tenant))
	if err != nil {
		return err
	}
	// A record that does not decode keeps the tenant's creates failing (limitsOf): the
	// admin's write replaces it, or nothing but etcdctl would bring the tenant back.
	var cur model.TenantQuotaLimits
	if !found || json.Unmarshal(raw, &cur) != nil {
		cur = model.TenantQuotaLimits{}
	}
	if cur.Limits == nil {
		cur.Limits = map[string]int64{}
	}
	change(&cur)
	if cur.Limits == nil {
		cur.Limits = map[string]int64{}
	}
	if len(cur.Limits) == 0 && cur.TagRanges == (model.TagRanges{}) {
		tx.Delete(model.QuotaLimitsKey(tenant))
		return nil
	}
	if err := checkTenantRanges(tx, tenant, cur.TagRanges); err != nil {
		return err
	}
	cur.Tenant = tenant
	return tx.Put(model.QuotaLimitsKey(tenant), cur)
}
