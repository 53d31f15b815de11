package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// Typed helpers, one group per Contiv object. Keys follow contiv.md 2.1: <tenant>:<name>,
// <tenant>:<policy>:<ruleId>, and plain names for tenants, Bgp hosts, global and aciGw.

// TenantList returns every tenant.
func (c *Client) TenantList(ctx context.Context) ([]model.Tenant, error) {
	return List[model.Tenant](ctx, c, model.CollTenants)
}

// TenantGet returns one tenant.
func (c *Client) TenantGet(ctx context.Context, tenant string) (*model.Tenant, error) {
	return Get[model.Tenant](ctx, c, model.CollTenants, tenant)
}

// TenantPost creates a tenant.
func (c *Client) TenantPost(ctx context.Context, o *model.Tenant) error {
	return c.Post(ctx, model.CollTenants, o.TenantName, o)
}

// TenantDelete deletes a tenant.
func (c *Client) TenantDelete(ctx context.Context, tenant string) error {
	return c.Delete(ctx, model.CollTenants, tenant)
}

// TenantInspect returns a tenant's inspect view.
func (c *Client) TenantInspect(ctx context.Context, tenant string) (*model.TenantInspect, error) {
	return Inspect[model.TenantInspect](ctx, c, model.CollTenants, tenant)
}

// NetworkList returns every network of every tenant.
func (c *Client) NetworkList(ctx context.Context) ([]model.Network, error) {
	return List[model.Network](ctx, c, model.CollNetworks)
}

// NetworkPost creates a network.
func (c *Client) NetworkPost(ctx context.Context, o *model.Network) error {
	return c.Post(ctx, model.CollNetworks, model.ScopedKey(o.TenantName, o.NetworkName), o)
}

// NetworkDelete deletes a network.
func (c *Client) NetworkDelete(ctx context.Context, tenant, network string) error {
	return c.Delete(ctx, model.CollNetworks, model.ScopedKey(tenant, network))
}

// NetworkInspect returns a network's inspect view.
func (c *Client) NetworkInspect(ctx context.Context, tenant, network string) (*model.NetworkInspect, error) {
	return Inspect[model.NetworkInspect](ctx, c, model.CollNetworks, model.ScopedKey(tenant, network))
}

// EndpointGroupList returns every endpoint group.
func (c *Client) EndpointGroupList(ctx context.Context) ([]model.EndpointGroup, error) {
	return List[model.EndpointGroup](ctx, c, model.CollEndpointGroups)
}

// EndpointGroupPost creates or updates an endpoint group.
func (c *Client) EndpointGroupPost(ctx context.Context, o *model.EndpointGroup) error {
	return c.Post(ctx, model.CollEndpointGroups, model.ScopedKey(o.TenantName, o.GroupName), o)
}

// EndpointGroupDelete deletes an endpoint group.
func (c *Client) EndpointGroupDelete(ctx context.Context, tenant, group string) error {
	return c.Delete(ctx, model.CollEndpointGroups, model.ScopedKey(tenant, group))
}

// EndpointGroupInspect returns an endpoint group's inspect view.
func (c *Client) EndpointGroupInspect(ctx context.Context, tenant, group string) (*model.EndpointGroupInspect, error) {
	return Inspect[model.EndpointGroupInspect](ctx, c, model.CollEndpointGroups, model.ScopedKey(tenant, group))
}

// EndpointInspect returns the first endpoint whose id, container id or name contains id.
func (c *Client) EndpointInspect(ctx context.Context, id string) (*model.EndpointInspect, error) {
	return Inspect[model.EndpointInspect](ctx, c, model.CollEndpoints, id)
}

// PolicyList returns every policy.
func (c *Client) PolicyList(ctx context.Context) ([]model.Policy, error) {
	return List[model.Policy](ctx, c, model.CollPolicies)
}

// PolicyGet returns one policy.
func (c *Client) PolicyGet(ctx context.Context, tenant, policy string) (*model.Policy, error) {
	return Get[model.Policy](ctx, c, model.CollPolicies, model.ScopedKey(tenant, policy))
}

// PolicyPost creates a policy.
func (c *Client) PolicyPost(ctx context.Context, o *model.Policy) error {
	return c.Post(ctx, model.CollPolicies, model.ScopedKey(o.TenantName, o.PolicyName), o)
}

// PolicyDelete deletes a policy.
func (c *Client) PolicyDelete(ctx context.Context, tenant, policy string) error {
	return c.Delete(ctx, model.CollPolicies, model.ScopedKey(tenant, policy))
}

// PolicyInspect returns a policy's inspect view.
func (c *Client) PolicyInspect(ctx context.Context, tenant, policy string) (*model.PolicyInspect, error) {
	return Inspect[model.PolicyInspect](ctx, c, model.CollPolicies, model.ScopedKey(tenant, policy))
}

// RuleList returns every rule of every policy.
func (c *Client) RuleList(ctx context.Context) ([]model.Rule, error) {
	return List[model.Rule](ctx, c, model.CollRules)
}

// RulePost creates a rule.
func (c *Client) RulePost(ctx context.Context, o *model.Rule) error {
	return c.Post(ctx, model.CollRules, model.RuleKey(o.TenantName, o.PolicyName, o.RuleID), o)
}

// RuleDelete deletes a rule.
func (c *Client) RuleDelete(ctx context.Context, tenant, policy, ruleID string) error {
	return c.Delete(ctx, model.CollRules, model.RuleKey(tenant, policy, ruleID))
}

// AppProfileList returns every app profile.
func (c *Client) AppProfileList(ctx context.Context) ([]model.AppProfile, error) {
	return List[model.AppProfile](ctx, c, model.CollAppProfiles)
}

// AppProfileGet returns one app profile.
func (c *Client) AppProfileGet(ctx context.Context, tenant, name string) (*model.AppProfile, error) {
	return Get[model.AppProfile](ctx, c, model.CollAppProfiles, model.ScopedKey(tenant, name))
}

// AppProfilePost creates or updates an app profile.
func (c *Client) AppProfilePost(ctx context.Context, o *model.AppProfile) error {
	return c.Post(ctx, model.CollAppProfiles, model.ScopedKey(o.TenantName, o.AppProfileName), o)
}

// AppProfileDelete deletes an app profile.
func (c *Client) AppProfileDelete(ctx context.Context, tenant, name string) error {
	return c.Delete(ctx, model.CollAppProfiles, model.ScopedKey(tenant, name))
}

// ServiceLBList returns every service.
func (c *Client) ServiceLBList(ctx context.Context) ([]model.ServiceLB, error) {
	return List[model.ServiceLB](ctx, c, model.CollServiceLBs)
}

// ServiceLBPost creates a service.
func (c *Client) ServiceLBPost(ctx context.Context, o *model.ServiceLB) error {
	return c.Post(ctx, model.CollServiceLBs, model.ScopedKey(o.TenantName, o.ServiceName), o)
}

// ServiceLBDelete deletes a service.
func (c *Client) ServiceLBDelete(ctx context.Context, tenant, name string) error {
	return c.Delete(ctx, model.CollServiceLBs, model.ScopedKey(tenant, name))
}

// ServiceLBInspect returns a service's inspect view.
func (c *Client) ServiceLBInspect(ctx context.Context, tenant, name string) (*model.ServiceLBInspect, error) {
	return Inspect[model.ServiceLBInspect](ctx, c, model.CollServiceLBs, model.ScopedKey(tenant, name))
}

// GlobalList returns the global objects (normally exactly one, "global").
func (c *Client) GlobalList(ctx context.Context) ([]model.Global, error) {
	return List[model.Global](ctx, c, model.CollGlobals)
}

// GlobalGet returns the global object.
func (c *Client) GlobalGet(ctx context.Context) (*model.Global, error) {
	return Get[model.Global](ctx, c, model.CollGlobals, "global")
}

// GlobalPost updates the global object.
func (c *Client) GlobalPost(ctx context.Context, o *model.Global) error {
	return c.Post(ctx, model.CollGlobals, "global", o)
}

// GlobalInspect returns the global inspect view.
func (c *Client) GlobalInspect(ctx context.Context) (*model.GlobalInspect, error) {
	return Inspect[model.GlobalInspect](ctx, c, model.CollGlobals, "global")
}

// NetprofileList returns every netprofile.
func (c *Client) NetprofileList(ctx context.Context) ([]model.Netprofile, error) {
	return List[model.Netprofile](ctx, c, model.CollNetprofiles)
}

// NetprofilePost creates or updates a netprofile.
func (c *Client) NetprofilePost(ctx context.Context, o *model.Netprofile) error {
	return c.Post(ctx, model.CollNetprofiles, model.ScopedKey(o.TenantName, o.ProfileName), o)
}

// NetprofileDelete deletes a netprofile.
func (c *Client) NetprofileDelete(ctx context.Context, tenant, name string) error {
	return c.Delete(ctx, model.CollNetprofiles, model.ScopedKey(tenant, name))
}

// NetprofileInspect returns a netprofile's inspect view.
func (c *Client) NetprofileInspect(ctx context.Context, tenant, name string) (*model.NetprofileInspect, error) {
	return Inspect[model.NetprofileInspect](ctx, c, model.CollNetprofiles, model.ScopedKey(tenant, name))
}

// BgpList returns every BGP host config.
func (c *Client) BgpList(ctx context.Context) ([]model.Bgp, error) {
	return List[model.Bgp](ctx, c, model.CollBgps)
}

// BgpPost creates a BGP host config.
func (c *Client) BgpPost(ctx context.Context, o *model.Bgp) error {
	return c.Post(ctx, model.CollBgps, o.Hostname, o)
}

// BgpDelete deletes a BGP host config.
func (c *Client) BgpDelete(ctx context.Context, host string) error {
	return c.Delete(ctx, model.CollBgps, host)
}

// BgpInspect returns a BGP host config's inspect view.
func (c *Client) BgpInspect(ctx context.Context, host string) (*model.BgpInspect, error) {
	return Inspect[model.BgpInspect](ctx, c, model.CollBgps, host)
}

// ExtContractsGroupList returns every external contracts group.
func (c *Client) ExtContractsGroupList(ctx context.Context) ([]model.ExtContractsGroup, error) {
	return List[model.ExtContractsGroup](ctx, c, model.CollExtContractsGroups)
}

// ExtContractsGroupPost creates an external contracts group.
func (c *Client) ExtContractsGroupPost(ctx context.Context, o *model.ExtContractsGroup) error {
	return c.Post(ctx, model.CollExtContractsGroups, model.ScopedKey(o.TenantName, o.ContractsGroupName), o)
}

// ExtContractsGroupDelete deletes an external contracts group.
func (c *Client) ExtContractsGroupDelete(ctx context.Context, tenant, name string) error {
	return c.Delete(ctx, model.CollExtContractsGroups, model.ScopedKey(tenant, name))
}

// AciGwList returns the aciGw objects (at most one, "aciGw").
func (c *Client) AciGwList(ctx context.Context) ([]model.AciGw, error) {
	return List[model.AciGw](ctx, c, model.CollAciGws)
}

// AciGwGet returns the aciGw object.
func (c *Client) AciGwGet(ctx context.Context) (*model.AciGw, error) {
	return Get[model.AciGw](ctx, c, model.CollAciGws, "aciGw")
}

// AciGwPost creates or updates the aciGw object.
func (c *Client) AciGwPost(ctx context.Context, o *model.AciGw) error {
	return c.Post(ctx, model.CollAciGws, "aciGw", o)
}

// AciGwInspect returns the aciGw inspect view.
func (c *Client) AciGwInspect(ctx context.Context) (*model.AciGwInspect, error) {
	return Inspect[model.AciGwInspect](ctx, c, model.CollAciGws, "aciGw")
}

// QuotaGet returns a tenant's limits and usage (this project's /api/v1/quotas/).
func (c *Client) QuotaGet(ctx context.Context, tenant string) (*model.TenantQuota, error) {
	return Get[model.TenantQuota](ctx, c, model.CollQuotas, tenant)
}

// QuotaSet merges limits and tag ranges into a tenant's (admins only); a nil limit goes back
// to the default, a nil range is dropped.
func (c *Client) QuotaSet(ctx context.Context, tenant string, upd model.QuotaUpdate, ranges model.TagRangeUpdate) (*model.TenantQuota, error) {
	body := make(map[string]any, len(upd)+len(ranges))
	for k, v := range upd {
		body[k] = v
	}
	for k, v := range ranges {
		body[k] = v
	}
	var out model.TenantQuota
	if err := c.Do(ctx, http.MethodPut, ObjectPath(model.CollQuotas, tenant), body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// QuotaReset drops every limit set for a tenant (admins only): the defaults apply again.
func (c *Client) QuotaReset(ctx context.Context, tenant string) (*model.TenantQuota, error) {
	var out model.TenantQuota
	if err := c.Do(ctx, http.MethodDelete, ObjectPath(model.CollQuotas, tenant), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// HostScopeList returns every host's scope (this project's /api/v1/hostScopes/).
func (c *Client) HostScopeList(ctx context.Context) ([]model.HostScope, error) {
	return List[model.HostScope](ctx, c, model.CollHostScopes)
}

// HostScopeGet returns a host's scope (404: it has none and serves every tenant).
func (c *Client) HostScopeGet(ctx context.Context, host string) (*model.HostScope, error) {
	return Get[model.HostScope](ctx, c, model.CollHostScopes, host)
}

// HostScopeSet replaces a host's scope (admins only).
func (c *Client) HostScopeSet(ctx context.Context, s *model.HostScope) (*model.HostScope, error) {
	var out model.HostScope
	if err := c.Do(ctx, http.MethodPut, ObjectPath(model.CollHostScopes, s.Host), s, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// HostScopeReset drops a host's scope (admins only): it serves every tenant again.
func (c *Client) HostScopeReset(ctx context.Context, host string) error {
	return c.Do(ctx, http.MethodDelete, ObjectPath(model.CollHostScopes, host), nil, nil)
}

// WireGuardHosts returns every host's published WireGuard record with its rotation state
// (this project's GET /wireguard/hosts).
func (c *Client) WireGuardHosts(ctx context.Context) ([]model.WireGuardHost, error) {
	var out []model.WireGuardHost
	if err := c.Do(ctx, http.MethodGet, "/wireguard/hosts", nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// WireGuardRotate asks host's agent for a new WireGuard key (admins only) and returns the
// record with the rotation requested.
func (c *Client) WireGuardRotate(ctx context.Context, host string) (*model.WireGuardHost, error) {
	var out model.WireGuardHost
	if err := c.Do(ctx, http.MethodPost, "/wireguard/hosts/"+url.PathEscape(host)+"/rotate", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PrefilterList returns the deny list (this project's /api/v1/prefilters/, issue 36).
func (c *Client) PrefilterList(ctx context.Context) ([]model.Prefilter, error) {
	return List[model.Prefilter](ctx, c, model.CollPrefilters)
}

// PrefilterGet returns one deny list entry (404: there is none of that name).
func (c *Client) PrefilterGet(ctx context.Context, name string) (*model.Prefilter, error) {
	return Get[model.Prefilter](ctx, c, model.CollPrefilters, name)
}

// PrefilterSet creates or replaces a deny list entry (admins only); it returns the entry
// as netmaster stored it (the prefix masked, the host lowercase).
func (c *Client) PrefilterSet(ctx context.Context, p *model.Prefilter) (*model.Prefilter, error) {
	var out model.Prefilter
	if err := c.Do(ctx, http.MethodPut, ObjectPath(model.CollPrefilters, p.Name), p, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PrefilterDelete drops a deny list entry (admins only; 404 when there is none).
func (c *Client) PrefilterDelete(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, ObjectPath(model.CollPrefilters, name), nil, nil)
}
