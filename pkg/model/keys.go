package model

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// NetworkID is the state id of a network: "<net>.<tenant>".
func NetworkID(network, tenant string) string { return network + "." + tenant }

// EndpointStateID is the state id of an endpoint: "<net>.<tenant>-<endpointID>".
func EndpointStateID(network, tenant, endpointID string) string {
	return NetworkID(network, tenant) + "-" + endpointID
}

// EPGStateID is the state id of an EPG: "<group>:<tenant>" (group first).
func EPGStateID(group, tenant string) string { return group + ":" + tenant }

// ServiceID is the state id of a serviceLB: "<service>:<tenant>".
func ServiceID(service, tenant string) string { return service + ":" + tenant }

// ScopedKey is the model key of a tenant-scoped object: "<tenant>:<name>".
func ScopedKey(tenant, name string) string { return tenant + ":" + name }

// RuleKey is the model key of a rule: "<tenant>:<policy>:<ruleId>".
func RuleKey(tenant, policy, ruleID string) string { return tenant + ":" + policy + ":" + ruleID }

// EpgPolicyID is the state/policy id: "<epgModelKey>:<policyModelKey>".
func EpgPolicyID(epgKey, policyKey string) string { return epgKey + ":" + policyKey }

// ModelKey is the etcd key of a model object: /contiv.io/obj/modeldb/<objType>/<key>.
func ModelKey(objType, key string) string { return ModelDBPrefix + objType + "/" + key }

// NetStateKey, EpStateKey, ... are the etcd keys of the derived state records.
func NetStateKey(netID string) string       { return NetStatePrefix + netID }
func EpStateKey(epStateID string) string    { return EpStatePrefix + epStateID }
func EpOperKey(epStateID string) string     { return EpOperPrefix + epStateID }
func EPGStateKey(epgID string) string       { return EPGStatePrefix + epgID }
func PolicyStateKey(id string) string       { return PolicyStatePrefix + id }
func RuleStateKey(ruleID string) string     { return RuleStatePrefix + ruleID }
func SvcLBStateKey(serviceID string) string { return SvcLBStatePrefix + serviceID }
func ProviderKey(serviceID string) string   { return ProviderPrefix + serviceID }
func BgpStateKey(host string) string        { return BgpStatePrefix + host }
func BgpOperKey(host string) string         { return BgpOperPrefix + host }

// NodePortPrefix holds one key per node port in use (this project's extension): every
// host answers a node port on its own address, so a port belongs to one service of all
// tenants. The value is the owning service id.
const NodePortPrefix = "/contiv.io/state/nodeports/"

// NodePortKey is the key of node port port/proto ("tcp" or "udp").
func NodePortKey(port int, proto string) string {
	return fmt.Sprintf("%s%s/%d", NodePortPrefix, proto, port)
}

// NetCreatorPrefix holds, for a network an agent bound to a host created (Docker's network
// create, this project's extension), that agent's identity name ("host:<host>"): only it
// may change or delete the network among bound agents. The key is the network's model key.
const NetCreatorPrefix = "/contiv.io/state/netcreators/"

// NetCreatorKey is the creator record of network model key key ("<tenant>:<net>").
func NetCreatorKey(key string) string { return NetCreatorPrefix + key }

// PendingPrefix holds, for an address an agent bound to a host allocated through
// /plugin/allocAddress (Docker's IPAM step, this project's extension) and no endpoint holds
// yet, that agent's identity name: among bound agents only it may adopt or release it.
const PendingPrefix = "/contiv.io/state/pending/"

// PendingKey is the record of pending address ip of network netID.
func PendingKey(netID, ip string) string { return PendingPrefix + netID + "/" + ip }

// MACFromIPv4 is Contiv's endpoint MAC: 02:02 followed by the four address bytes.
func MACFromIPv4(ip string) (string, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return "", fmt.Errorf("mac from ip: %q is not an IPv4 address", ip)
	}
	b := a.As4()
	return fmt.Sprintf("02:02:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3]), nil
}

// SubnetIndexPrefix holds the subnet index netmaster checks a new network against (this
// project's extension): a record of each network under its tenant's prefix
// (SubnetIndexTenantPrefix) and, for a VLAN network, one more under SubnetIndexVLANPrefix
// (routing mode routes them natively, so their subnets may not overlap across tenants). A
// network create reads its tenant's records instead of every network of the cluster, and
// writes one record (two for a VLAN network), whatever the tenant or the cluster holds.
const SubnetIndexPrefix = "/contiv.io/state/subnetidx/"

// SubnetIndexTenantPrefix holds tenant's records of the subnet index, by network id.
func SubnetIndexTenantPrefix(tenant string) string {
	return SubnetIndexPrefix + "tenant/" + tenant + "/"
}

// SubnetIndexVLANPrefix holds the subnet index's records of every VLAN network, by id.
const SubnetIndexVLANPrefix = SubnetIndexPrefix + "vlan/"

// SubnetIndexGuardKey is rewritten with every change to tenant's records of the subnet
// index (SubnetIndexVLANGuardKey with every change to the VLAN records): a create reads
// it, with a commit guard, in place of a guard on each record it lists, so its checks
// cost the same however many networks the tenant (or the cluster) holds.
func SubnetIndexGuardKey(tenant string) string { return SubnetIndexPrefix + "guard/" + tenant }

// SubnetIndexVLANGuardKey is SubnetIndexGuardKey for the VLAN records.
const SubnetIndexVLANGuardKey = SubnetIndexPrefix + "guard-vlan"

// SubnetIndexGuard is the record at a SubnetIndexGuardKey: the network whose change
// rewrote it last, and whether a repair of the records is left to finish.
type SubnetIndexGuard struct {
	Network string `json:"network"`
	Partial bool   `json:"partial,omitempty"`
}

// LegacySubnetIndexKeys are the whole-tenant and whole-VLAN records of the index's first
// layout (one record rewritten on each create), which nothing reads any more: removed
// with their tenant, and when a check rebuilds its records.
func LegacySubnetIndexKeys(tenant string) []string {
	return []string{SubnetIndexPrefix + "tenant/" + tenant, SubnetIndexPrefix + "vlan"}
}

// SubnetRecord is what the subnet index keeps of a network.
type SubnetRecord struct {
	Tenant        string `json:"tenant"`
	Encap         string `json:"encap"`
	SubnetIP      string `json:"subnetIP"`
	SubnetLen     uint   `json:"subnetLen"`
	IPv6Subnet    string `json:"ipv6Subnet,omitempty"`
	IPv6SubnetLen uint   `json:"ipv6SubnetLen,omitempty"`
	// PktTag is a VLAN network's VLAN: the VLAN record is checked against the VLANs in use.
	PktTag int `json:"pktTag,omitempty"`
}

// dnsLabel is what a name must look like to be served by the DNS responders (one DNS
// label, lower case).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)

// DNSName is name as the DNS responders serve it (lower case) and whether they do: an
// endpoint's, group's or service's name that is not one DNS label is not answered.
func DNSName(name string) (string, bool) {
	name = strings.ToLower(name)
	return name, dnsLabel.MatchString(name)
}
