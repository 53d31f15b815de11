package model

import (
	"slices"
	"strings"
)

// Host scopes (this project's extension, issue 34): which tenants, or single networks of a
// tenant, the agent of a host serves. An admin sets a host's scope; netmaster then refuses
// that host's bound agent (token or certificate "host:<host>") an endpoint, a network or an
// address outside it. A host without a record serves every tenant, as in Contiv.

// CollHostScopes is the REST collection of hosts' scopes: /api/v1/hostScopes/<host>/.
const CollHostScopes = "hostScopes"

// HostScopePrefix holds one record per host with a scope.
const HostScopePrefix = "/contiv.io/state/hostscopes/"

// HostScopeKey is the scope record of host. Host names are case-insensitive: a scope an
// admin set for "Node1" confines the agent bound to "node1" too (never a second record
// that leaves the agent serving every tenant).
func HostScopeKey(host string) string { return HostScopePrefix + strings.ToLower(host) }

// HostScope is what host serves: every network of the tenants listed, and the networks
// listed ("<tenant>:<network>"). Both empty: nothing (a drained host).
type HostScope struct {
	Host     string   `json:"host"`
	Tenants  []string `json:"tenants"`
	Networks []string `json:"networks"`
}

// Serves reports whether network of tenant is in the scope (a network the host creates too).
func (s *HostScope) Serves(tenant, network string) bool {
	return slices.Contains(s.Tenants, tenant) || slices.Contains(s.Networks, ScopedKey(tenant, network))
}
