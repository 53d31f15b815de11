package model

// Per-tenant quotas (this project's extension): what one tenant may hold, so that one
// tenant-admin cannot fill etcd for everyone. netmaster keeps each tenant's usage in one
// record, updated in the transaction of every change, and refuses a change that would take
// a tenant past a limit (docs/api.md, "Quotas").

// Quota kinds: object counts, and the bytes of the tenant's records (keys and values).
const (
	QuotaNetworks       = "networks"
	QuotaEndpointGroups = "endpointGroups"
	QuotaEPGIDs         = "endpointGroupIds" // endpoint group ids (of the 65,535 every tenant shares) its groups hold
	QuotaPolicies       = "policies"
	QuotaRules          = "rules"
	QuotaServices       = "serviceLBs"
	QuotaNodePorts      = "nodePorts" // node ports its serviceLBs and Kubernetes Services hold
	QuotaAppProfiles    = "appProfiles"
	QuotaNetprofiles    = "netprofiles"
	QuotaEndpoints      = "endpoints"
	QuotaBytes          = "bytes"
)

// QuotaKinds returns every quota kind, in display order.
func QuotaKinds() []string {
	return []string{QuotaNetworks, QuotaEndpointGroups, QuotaEPGIDs, QuotaPolicies, QuotaRules, QuotaServices, QuotaNodePorts,
		QuotaAppProfiles, QuotaNetprofiles, QuotaEndpoints, QuotaBytes}
}

// IsQuotaKind reports whether kind is one of QuotaKinds.
func IsQuotaKind(kind string) bool {
	for _, k := range QuotaKinds() {
		if k == kind {
			return true
		}
	}
	return false
}

// CollQuotas is the REST collection of tenants' quotas: /api/v1/quotas/<tenant>/.
const CollQuotas = "quotas"

// Quota records under /contiv.io/state/quota/.
const (
	QuotaUsagePrefix  = "/contiv.io/state/quota/usage/"
	QuotaLimitsPrefix = "/contiv.io/state/quota/limits/"
)

// QuotaUsageKey is the usage record of tenant.
func QuotaUsageKey(tenant string) string { return QuotaUsagePrefix + tenant }

// QuotaLimitsKey is the record of an admin's limits for tenant.
func QuotaLimitsKey(tenant string) string { return QuotaLimitsPrefix + tenant }

// TenantUsage is /contiv.io/state/quota/usage/<tenant>: what the tenant holds, by kind (a
// kind it does not name: none). Version is the UsageVersion the record was counted with.
type TenantUsage struct {
	Tenant  string           `json:"tenant"`
	Usage   map[string]int64 `json:"usage"`
	Version int              `json:"version,omitempty"`
}

// UsageVersion numbers what a usage record counts; a record of an older version is
// recounted before it is used (1: node ports counted; 2: endpoint group ids counted).
const UsageVersion = 2

// TenantQuotaLimits is /contiv.io/state/quota/limits/<tenant>: the limits an admin set for
// the tenant; a kind it does not name takes netmaster's default.
type TenantQuotaLimits struct {
	Tenant string           `json:"tenant"`
	Limits map[string]int64 `json:"limits"`
	TagRanges
}

// Tag range fields of a quota (this project's extension): the VLAN and VXLAN ids a
// tenant's networks draw from, "lo-hi" ("" none). Ranges of two tenants never overlap.
const (
	QuotaVLANs  = "vlans"
	QuotaVXLANs = "vxlans"
)

// TagRanges are a tenant's tag ranges (QuotaVLANs, QuotaVXLANs).
type TagRanges struct {
	VLANs  string `json:"vlans,omitempty"`
	VXLANs string `json:"vxlans,omitempty"`
}

// TenantQuota is GET /api/v1/quotas/<tenant>/: the limits in force (an admin's, else the
// defaults), the ones an admin set, and the usage.
type TenantQuota struct {
	Tenant    string           `json:"tenant"`
	Limits    map[string]int64 `json:"limits"`
	Overrides map[string]int64 `json:"overrides,omitempty"`
	Usage     map[string]int64 `json:"usage"`
	TagRanges
}

// QuotaUpdate is the body of POST/PUT /api/v1/quotas/<tenant>/: kind → limit (>= 0) to set
// it, kind → null to go back to the default; kinds not named keep what they have. The tag
// ranges are set in the same body as strings ({"vlans": "100-199"}, null: none):
// TagRangeUpdate.
type QuotaUpdate map[string]*int64

// TagRangeUpdate is the tag range part of a quota body: QuotaVLANs or QuotaVXLANs → "lo-hi"
// to set it, → nil to drop it; fields not named keep what they have.
type TagRangeUpdate map[string]*string
