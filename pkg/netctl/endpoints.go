package netctl

import (
	"fmt"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// endpointList is `netctl endpoint ls`: the endpoints of a tenant's networks (or of all
// with -a), with container names, addresses, groups and hosts, from netmaster's network
// inspect records. Not in Contiv's netctl.
func endpointListCommand() *cli.Command {
	return &cli.Command{
		Name: "ls", Aliases: []string{"list"}, Usage: "List endpoints (with container names, addresses, groups and hosts)", ArgsUsage: " ",
		Flags: []cli.Flag{tenantFlag(), allFlag(), jsonFlag(),
			str("network", "n", "", "only this network"),
			str("host", "", "", "only endpoints homed on this host")},
		Action: action(listEndpoints),
	}
}

func listEndpoints(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	if !e.c.Bool("all") {
		if err := e.checkTenant(e.tenant()); err != nil {
			return err
		}
	}
	nets, err := e.cl.NetworkList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	var eps []model.EndpointOper
	for _, n := range nets {
		if !e.c.Bool("all") && n.TenantName != e.tenant() {
			continue
		}
		if want := e.c.String("network"); want != "" && n.NetworkName != want {
			continue
		}
		in, err := e.cl.NetworkInspect(e.ctx, n.TenantName, n.NetworkName)
		if err != nil {
			return apiErr(err)
		}
		for _, ep := range in.Oper.Endpoints {
			if h := e.c.String("host"); h != "" && ep.HomingHost != h {
				continue
			}
			eps = append(eps, ep)
		}
	}
	sort.Slice(eps, func(i, j int) bool {
		if eps[i].Network != eps[j].Network {
			return eps[i].Network < eps[j].Network
		}
		return eps[i].Key < eps[j].Key
	})
	if e.c.Bool("json") {
		if eps == nil {
			eps = []model.EndpointOper{}
		}
		return e.dumpJSON(eps)
	}
	tw := newTable(e.out, 2)
	fmt.Fprint(tw, "Network\tEndpoint\tContainer\tIP\tGroup\tHost\n")
	fmt.Fprint(tw, "-------\t--------\t---------\t--\t-----\t----\n")
	for _, ep := range eps {
		var ips []string
		for _, ip := range ep.IpAddress {
			if ip != "" {
				ips = append(ips, ip)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", ep.Network, ep.Key, ep.ContainerName, strings.Join(ips, ","), ep.EndpointGroupKey, ep.HomingHost)
	}
	if err := tw.Flush(); err != nil {
		return ioErr(err)
	}
	return nil
}
