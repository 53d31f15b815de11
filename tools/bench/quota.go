package main

import "github.com/contivbpf/contivbpf/tools/sim"

// noQuotas is netmaster's default command line with its per-tenant quotas lifted: the scale
// and k8s stages put more rules, or Kubernetes Services, into one tenant than the defaults
// allow. Usage is still booked, so what the books cost is measured.
func noQuotas(c *sim.Cluster) []string {
	args := c.DefaultMasterArgs()
	for _, kind := range []string{"networks", "endpoint-groups", "policies", "rules", "services", "app-profiles", "netprofiles", "endpoints", "bytes"} {
		args = append(args, "--quota-"+kind, "-1")
	}
	return args
}
