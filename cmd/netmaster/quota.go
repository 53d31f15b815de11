package main

import (
	"fmt"
	"log/slog"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// quotaFlag is one default per-tenant limit.
type quotaFlag struct {
	name, kind, what string
}

// quotaFlagList lists the default quota flags, one per kind (model.QuotaKinds).
func quotaFlagList() []quotaFlag {
	return []quotaFlag{
		{"quota-networks", model.QuotaNetworks, "networks"},
		{"quota-endpoint-groups", model.QuotaEndpointGroups, "endpoint groups"},
		{"quota-endpoint-group-ids", model.QuotaEPGIDs, "endpoint group ids its groups hold (of the 65,535 every tenant shares; bounds a tenant whose endpoint group limit an admin raised)"},
		{"quota-policies", model.QuotaPolicies, "policies"},
		{"quota-rules", model.QuotaRules, "policy rules (all its policies' together)"},
		{"quota-services", model.QuotaServices, "services (serviceLBs, Kubernetes Services included)"},
		{"quota-node-ports", model.QuotaNodePorts, "node ports its services hold (of the 30000-32767 range each protocol has; Kubernetes Services past it lose the ports beyond)"},
		{"quota-app-profiles", model.QuotaAppProfiles, "app profiles"},
		{"quota-netprofiles", model.QuotaNetprofiles, "netprofiles"},
		{"quota-endpoints", model.QuotaEndpoints, "endpoints"},
		{"quota-bytes", model.QuotaBytes, "bytes of stored records, keys and values (unless given, at most a 32nd of --etcd-quota-bytes)"},
	}
}

// quotaCLIFlags are the flags of quotaFlagList, their defaults master.DefaultQuota's.
func quotaCLIFlags() []cli.Flag {
	def := master.DefaultQuota()
	var out []cli.Flag
	for _, q := range quotaFlagList() {
		out = append(out, &cli.Int64Flag{Name: q.name, Value: def[q.kind], EnvVars: env(envName(q.name)),
			Usage: "default per-tenant limit of " + q.what + " (`N`; -1: none); an admin sets a tenant's own with netctl tenant quota"})
	}
	return out
}

// envName is a flag's environment name: "quota-networks" → "QUOTA_NETWORKS".
func envName(flag string) string {
	b := []byte(flag)
	for i, c := range b {
		switch {
		case c == '-':
			b[i] = '_'
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// quotaFrom reads the default per-tenant limits: -1 leaves a kind unlimited by default;
// the bytes limit, unless given, is at most a 32nd of etcd's quota (far below it).
func quotaFrom(c *cli.Context, etcdQuota int64) (map[string]int64, error) {
	out := map[string]int64{}
	for _, q := range quotaFlagList() {
		v := c.Int64(q.name)
		switch {
		case v == -1:
			continue
		case v < 0:
			return nil, fmt.Errorf("--%s %d: a limit is 0 or more (-1: none)", q.name, v)
		case q.kind == model.QuotaBytes && !c.IsSet(q.name):
			v = min(v, etcdQuota/32)
		case q.kind == model.QuotaBytes && v > etcdQuota/4:
			slog.Warn("one tenant may fill more than a quarter of etcd's quota", "flag", "--"+q.name, "limit", v, "etcd-quota-bytes", etcdQuota)
		}
		out[q.kind] = v
	}
	return out, nil
}
