package netctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/netctl/client"
)

// env is what every command action gets.
type env struct {
	c   *cli.Context
	ctx context.Context
	cl  *client.Client
	out io.Writer
}

func action(fn func(e *env) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		e := &env{c: c, ctx: c.Context, out: c.App.Writer}
		var err error
		if e.cl, err = newClient(c); err != nil {
			return err
		}
		return fn(e)
	}
}

// nargs checks the positional argument count (Contiv: exit 1 with a message).
func (e *env) nargs(n int, msg string) error {
	if e.c.NArg() != n {
		return usageErr(e.c, "%s", msg)
	}
	return nil
}

func (e *env) noArgs() error { return e.nargs(0, "More arguments than required") }

func (e *env) arg(i int) string { return e.c.Args().Get(i) }

func (e *env) tenant() string { return e.c.String("tenant") }

func (e *env) printf(format string, a ...any) {
	_, _ = io.WriteString(e.out, fmt.Sprintf(format, a...))
}

// dumpJSON prints v as 2-space indented JSON plus a newline (netctl -j and inspect).
func (e *env) dumpJSON(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return ioErr(err)
	}
	b = append(b, '\n')
	if _, err := e.out.Write(b); err != nil {
		return ioErr(err)
	}
	return nil
}

// names prints one name per line (-q).
func (e *env) names(names []string) error {
	var sb strings.Builder
	for _, n := range names {
		sb.WriteString(n)
		sb.WriteByte('\n')
	}
	_, err := io.WriteString(e.out, sb.String())
	return ioErr(err)
}

// checkTenant is what tenant-scoped list commands do first: the tenant must exist.
func (e *env) checkTenant(t string) error {
	_, err := e.cl.TenantGet(e.ctx, t)
	return apiErr(err)
}

// filterTenant keeps the objects of tenant t unless --all.
func filterTenant[T any](e *env, objs []T, t string, tenantOf func(*T) string) []T {
	out := []T{}
	for i := range objs {
		if e.c.Bool("all") || tenantOf(&objs[i]) == t {
			out = append(out, objs[i])
		}
	}
	return out
}

// list implements the common "ls" shape: -j, -q, else the table.
func list[T any](e *env, objs []T, name func(*T) string, table func(io.Writer, []T) error) error {
	switch {
	case e.c.Bool("json"):
		return e.dumpJSON(objs)
	case e.c.Bool("quiet"):
		ns := make([]string, len(objs))
		for i := range objs {
			ns[i] = name(&objs[i])
		}
		return e.names(ns)
	default:
		return ioErr(table(e.out, objs))
	}
}

// ---- network ----

func createNetwork(e *env) error {
	if err := e.nargs(1, "Network name required"); err != nil {
		return err
	}
	subnet, gw, gw6 := e.c.String("subnet"), e.c.String("gateway"), e.c.String("gatewayv6")
	if subnet == "" {
		return usageErr(e.c, "Subnet is required")
	}
	if gw != "" && net.ParseIP(gw) == nil {
		return usageErr(e.c, "Invalid gateway - Enter in A.B.C.D format")
	}
	if gw6 != "" && net.ParseIP(gw6) == nil {
		return usageErr(e.c, "Invalid IPv6 gateway")
	}
	t, n := e.tenant(), e.arg(0)
	err := e.cl.NetworkPost(e.ctx, &model.Network{
		TenantName:  t,
		NetworkName: n,
		Encap:       e.c.String("encap"),
		Subnet:      subnet,
		Gateway:     gw,
		Ipv6Subnet:  e.c.String("subnetv6"),
		Ipv6Gateway: gw6,
		PktTag:      e.c.Int("pkt-tag"),
		NwType:      e.c.String("nw-type"),
		CfgdTag:     e.c.String("nw-tag"),
		NatDisabled: e.c.Bool("no-nat"),
	})
	if err != nil {
		return apiErr(err)
	}
	e.printf("Creating network %s:%s\n", t, n)
	return nil
}

func deleteNetwork(e *env) error {
	if err := e.nargs(1, "Network name required"); err != nil {
		return err
	}
	t, n := e.tenant(), e.arg(0)
	e.printf("Deleting network %s:%s\n", t, n)
	return apiErr(e.cl.NetworkDelete(e.ctx, t, n))
}

func inspectNetwork(e *env) error {
	if err := e.nargs(1, "Network name required"); err != nil {
		return err
	}
	v, err := e.cl.NetworkInspect(e.ctx, e.tenant(), e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func listNetworks(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	t := e.tenant()
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.NetworkList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(n *model.Network) string { return n.TenantName })
	return list(e, objs, func(n *model.Network) string { return n.NetworkName }, writeNetworkTable)
}

// ---- tenant ----

func createTenant(e *env) error {
	if err := e.nargs(1, "Tenant name required"); err != nil {
		return err
	}
	t := e.arg(0)
	if err := e.cl.TenantPost(e.ctx, &model.Tenant{TenantName: t}); err != nil {
		return apiErr(err)
	}
	e.printf("Creating tenant: %s\n", t)
	return nil
}

func deleteTenant(e *env) error {
	if err := e.nargs(1, "Tenant name required"); err != nil {
		return err
	}
	e.printf("Deleting tenant %s\n", e.arg(0))
	return apiErr(e.cl.TenantDelete(e.ctx, e.arg(0)))
}

func inspectTenant(e *env) error {
	if err := e.nargs(1, "Tenant name required"); err != nil {
		return err
	}
	v, err := e.cl.TenantInspect(e.ctx, e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func listTenants(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	all, err := e.cl.TenantList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	if all == nil {
		all = []model.Tenant{}
	}
	return list(e, all, func(t *model.Tenant) string { return t.TenantName }, writeTenantTable)
}

// ---- endpoint group ----

func createGroup(e *env) error {
	if err := e.nargs(2, "Network and group name required"); err != nil {
		return err
	}
	t, g := e.tenant(), e.arg(1)
	err := e.cl.EndpointGroupPost(e.ctx, &model.EndpointGroup{
		TenantName:       t,
		NetworkName:      e.arg(0),
		GroupName:        g,
		NetProfile:       e.c.String("networkprofile"),
		IpPool:           e.c.String("ip-pool"),
		Policies:         e.c.StringSlice("policy"),
		ExtContractsGrps: e.c.StringSlice("external-contract"),
		CfgdTag:          e.c.String("epg-tag"),
	})
	if err != nil {
		return apiErr(err)
	}
	e.printf("Creating EndpointGroup %s:%s\n", t, g)
	return nil
}

func inspectGroup(e *env) error {
	if err := e.nargs(1, "EndpointGroup name required"); err != nil {
		return err
	}
	v, err := e.cl.EndpointGroupInspect(e.ctx, e.tenant(), e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func deleteGroup(e *env) error {
	if err := e.nargs(1, "EndpointGroup name required"); err != nil {
		return err
	}
	return apiErr(e.cl.EndpointGroupDelete(e.ctx, e.tenant(), e.arg(0)))
}

func listGroups(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	t := e.tenant()
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.EndpointGroupList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(g *model.EndpointGroup) string { return g.TenantName })
	return list(e, objs, func(g *model.EndpointGroup) string { return g.GroupName }, writeGroupTable)
}

// ---- endpoint ----

func inspectEndpoint(e *env) error {
	if err := e.nargs(1, "Endpoint name required"); err != nil {
		return err
	}
	v, err := e.cl.EndpointInspect(e.ctx, e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

// ---- policy and rules ----

func createPolicy(e *env) error {
	if err := e.nargs(1, "Policy name required"); err != nil {
		return err
	}
	t, p := e.tenant(), e.arg(0)
	if err := e.cl.PolicyPost(e.ctx, &model.Policy{TenantName: t, PolicyName: p}); err != nil {
		return apiErr(err)
	}
	e.printf("Creating policy %s:%s\n", t, p)
	return nil
}

func deletePolicy(e *env) error {
	if err := e.nargs(1, "Policy name required"); err != nil {
		return err
	}
	t, p := e.tenant(), e.arg(0)
	e.printf("Deleting policy %s:%s\n", t, p)
	return apiErr(e.cl.PolicyDelete(e.ctx, t, p))
}

func inspectPolicy(e *env) error {
	if err := e.nargs(1, "Policy name required"); err != nil {
		return err
	}
	v, err := e.cl.PolicyInspect(e.ctx, e.tenant(), e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func listPolicies(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	t := e.tenant()
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.PolicyList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(p *model.Policy) string { return p.TenantName })
	return list(e, objs, func(p *model.Policy) string { return p.PolicyName }, writePolicyTable)
}

// checkRule mirrors netmaster's direction rules so mistakes are caught before the request.
func checkRule(e *env) error {
	has := func(f string) bool { return e.c.String(f) != "" }
	switch e.c.String("direction") {
	case "in":
		switch {
		case has("to-group"):
			return usageErr(nil, "Cant specify to-group for incoming rule")
		case has("to-network"):
			return usageErr(nil, "Cant specify to-network for incoming rule")
		case has("from-group") && has("from-network"):
			return usageErr(nil, "Can't specify both from-group argument and -from-network ")
		}
	case "out":
		switch {
		case has("from-group"):
			return usageErr(nil, "Cant specify from-group for outgoing rule")
		case has("from-network"):
			return usageErr(nil, "Cant specify from-network for outgoing rule")
		case has("from-ip-address"):
			return usageErr(nil, "Cant specify from-ip-address for outgoing rule")
		case has("to-group") && has("to-network"):
			return usageErr(nil, "Can't specify both -to-group and -to-network")
		}
	default:
		return usageErr(nil, "Unknown direction")
	}
	return nil
}

func addRule(e *env) error {
	if err := e.nargs(2, "Policy name and Rule ID required"); err != nil {
		return err
	}
	if err := checkRule(e); err != nil {
		return err
	}
	return apiErr(e.cl.RulePost(e.ctx, &model.Rule{
		TenantName:        e.tenant(),
		PolicyName:        e.arg(0),
		RuleID:            e.arg(1),
		Priority:          e.c.Int("priority"),
		Direction:         e.c.String("direction"),
		FromEndpointGroup: e.c.String("from-group"),
		ToEndpointGroup:   e.c.String("to-group"),
		FromNetwork:       e.c.String("from-network"),
		ToNetwork:         e.c.String("to-network"),
		FromIpAddress:     e.c.String("from-ip-address"),
		ToIpAddress:       e.c.String("to-ip-address"),
		Protocol:          e.c.String("protocol"),
		Port:              e.c.Int("port"),
		Action:            e.c.String("action"),
	}))
}

func deleteRule(e *env) error {
	if err := e.nargs(2, "Policy name and Rule ID required"); err != nil {
		return err
	}
	return apiErr(e.cl.RuleDelete(e.ctx, e.tenant(), e.arg(0), e.arg(1)))
}

func listRules(e *env) error {
	if err := e.nargs(1, "Policy name required"); err != nil {
		return err
	}
	t, p := e.tenant(), e.arg(0)
	if err := e.checkTenant(t); err != nil {
		return err
	}
	if _, err := e.cl.PolicyGet(e.ctx, t, p); err != nil {
		return apiErr(err)
	}
	all, err := e.cl.RuleList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	rules := []model.Rule{}
	for _, r := range all {
		if r.TenantName == t && r.PolicyName == p {
			rules = append(rules, r)
		}
	}
	// By priority, ascending; equal priorities keep the server's order.
	sort.SliceStable(rules, func(i, j int) bool { return rules[i].Priority < rules[j].Priority })
	return list(e, rules, func(r *model.Rule) string { return r.RuleID }, writeRuleTable)
}

// ---- netprofile ----

func createNetprofile(e *env) error {
	if err := e.nargs(1, "Net profile name required"); err != nil {
		return err
	}
	t, n := e.tenant(), e.arg(0)
	err := e.cl.NetprofilePost(e.ctx, &model.Netprofile{
		TenantName:  t,
		ProfileName: n,
		Bandwidth:   e.c.String("bandwidth"),
		DSCP:        e.c.Int("dscp"),
		Burst:       e.c.Int("burst"),
	})
	if err != nil {
		return apiErr(err)
	}
	e.printf("Creating netprofile %s:%s\n", t, n)
	return nil
}

func deleteNetprofile(e *env) error {
	if err := e.nargs(1, "Net profile name required"); err != nil {
		return err
	}
	return apiErr(e.cl.NetprofileDelete(e.ctx, e.tenant(), e.arg(0)))
}

func inspectNetprofile(e *env) error {
	if err := e.nargs(1, "Net profile name required"); err != nil {
		return err
	}
	v, err := e.cl.NetprofileInspect(e.ctx, e.tenant(), e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func listNetprofiles(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	t := e.tenant()
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.NetprofileList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(p *model.Netprofile) string { return p.TenantName })
	return list(e, objs, func(p *model.Netprofile) string { return p.ProfileName }, writeNetprofileTable)
}

// ---- app-profile ----

func appProfileFromFlags(e *env) *model.AppProfile {
	groups := []string{}
	if g := e.c.String("group"); g != "" {
		groups = strings.Split(g, ",")
	}
	return &model.AppProfile{TenantName: e.tenant(), AppProfileName: e.arg(0), EndpointGroups: groups}
}

func createAppProfile(e *env) error {
	if err := e.nargs(1, "Profile name required"); err != nil {
		return err
	}
	p := appProfileFromFlags(e)
	if err := e.cl.AppProfilePost(e.ctx, p); err != nil {
		return apiErr(err)
	}
	e.printf("Creating AppProfile %s:%s\n", p.TenantName, p.AppProfileName)
	return nil
}

func updateAppProfile(e *env) error {
	if err := e.nargs(1, "Profile name required"); err != nil {
		return err
	}
	return apiErr(e.cl.AppProfilePost(e.ctx, appProfileFromFlags(e)))
}

func deleteAppProfile(e *env) error {
	if err := e.nargs(1, "Profile name required"); err != nil {
		return err
	}
	return apiErr(e.cl.AppProfileDelete(e.ctx, e.tenant(), e.arg(0)))
}

func listAppProfiles(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	t := e.tenant()
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.AppProfileList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(p *model.AppProfile) string { return p.TenantName })
	return list(e, objs, func(p *model.AppProfile) string { return p.AppProfileName }, writeAppProfileTable)
}

func listAppProfileGroups(e *env) error {
	if err := e.nargs(1, "Profile name required"); err != nil {
		return err
	}
	p, err := e.cl.AppProfileGet(e.ctx, e.tenant(), e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(p)
	}
	_, err = io.WriteString(e.out, strings.Join(p.EndpointGroups, ",")) // no newline, as Contiv
	return ioErr(err)
}

// ---- service ----

func serviceTenant(e *env) string {
	if t := e.tenant(); t != "" {
		return t
	}
	return "default"
}

func createService(e *env) error {
	if err := e.nargs(1, "Service name required"); err != nil {
		return err
	}
	t, s := serviceTenant(e), e.arg(0)
	err := e.cl.ServiceLBPost(e.ctx, &model.ServiceLB{
		ServiceName: s,
		TenantName:  t,
		NetworkName: e.c.String("network"),
		IpAddress:   e.c.String("preferred-ip"),
		Selectors:   e.c.StringSlice("selector"),
		Ports:       e.c.StringSlice("port"),
		NodePorts:   e.c.StringSlice("node-port"),
	})
	if err != nil {
		return apiErr(err)
	}
	e.printf("Creating ServiceLB %s:%s\n", t, s)
	return nil
}

func deleteService(e *env) error {
	if err := e.nargs(1, "Service name required"); err != nil {
		return err
	}
	t, s := serviceTenant(e), e.arg(0)
	e.printf("Deleting Service  %s,%s\n", s, t)
	return apiErr(e.cl.ServiceLBDelete(e.ctx, t, s))
}

func inspectService(e *env) error {
	if err := e.nargs(1, "Service group name required"); err != nil {
		return err
	}
	v, err := e.cl.ServiceLBInspect(e.ctx, e.tenant(), e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func listServices(e *env) error {
	t := serviceTenant(e)
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.ServiceLBList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(s *model.ServiceLB) string { return s.TenantName })
	return list(e, objs, func(s *model.ServiceLB) string { return s.ServiceName }, writeServiceTable)
}

// ---- global ----

func showGlobal(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	all, err := e.cl.GlobalList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(nonNil(all))
	}
	return ioErr(writeGlobalInfo(e.out, all))
}

func inspectGlobal(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	v, err := e.cl.GlobalInspect(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func setGlobal(e *env) error {
	g, err := e.cl.GlobalGet(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	set := func(dst *string, flag string) {
		if v := e.c.String(flag); v != "" {
			*dst = v
		}
	}
	set(&g.NetworkInfraType, "fabric-mode")
	set(&g.Vlans, "vlan-range")
	set(&g.Vxlans, "vxlan-range")
	set(&g.FwdMode, "fwd-mode")
	set(&g.ArpMode, "arp-mode")
	set(&g.PvtSubnet, "private-subnet")
	set(&g.Encryption, "encryption")
	return apiErr(e.cl.GlobalPost(e.ctx, g))
}

// ---- aci-gw ----

func setAciGw(e *env) error {
	gw, err := e.cl.AciGwGet(e.ctx)
	if err != nil || gw == nil {
		gw = &model.AciGw{Name: "aciGw"}
	}
	gw.EnforcePolicies = e.c.String("enforce-policies")
	gw.IncludeCommonTenant = e.c.String("include-common-tenant")
	gw.NodeBindings = e.c.String("node-bindings")
	gw.PathBindings = e.c.String("path-bindings")
	gw.PhysicalDomain = e.c.String("phys-dom")
	return apiErr(e.cl.AciGwPost(e.ctx, gw))
}

func showAciGw(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	all, err := e.cl.AciGwList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(nonNil(all))
	}
	return ioErr(writeAciGwInfo(e.out, all))
}

func inspectAciGw(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	v, err := e.cl.AciGwInspect(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

// ---- bgp ----

func addBgp(e *env) error {
	if e.c.NArg() < 1 {
		return usageErr(e.c, "Host name required")
	}
	routerIP, neighbor := e.c.String("router-ip"), e.c.String("neighbor")
	as, neighborAS := e.c.String("as"), e.c.String("neighbor-as")
	if _, _, err := net.ParseCIDR(routerIP); err != nil {
		return usageErr(e.c, "Wrong CIDR format. Enter in x.x.x.x/len format")
	}
	if net.ParseIP(neighbor) == nil {
		return usageErr(e.c, "Wrong IP format. Enter in x.x.x.x format")
	}
	if as == "" || neighborAS == "" {
		return usageErr(e.c, "Missing attributes")
	}
	return apiErr(e.cl.BgpPost(e.ctx, &model.Bgp{
		Hostname:   e.arg(0),
		Routerip:   routerIP,
		As:         as,
		NeighborAs: neighborAS,
		Neighbor:   neighbor,
	}))
}

func deleteBgp(e *env) error {
	if err := e.nargs(1, "Host name required"); err != nil {
		return err
	}
	e.printf("Deleting Bgp router config: %s\n", e.arg(0))
	return apiErr(e.cl.BgpDelete(e.ctx, e.arg(0)))
}

func inspectBgp(e *env) error {
	if err := e.nargs(1, "Host name required"); err != nil {
		return err
	}
	v, err := e.cl.BgpInspect(e.ctx, e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	return e.dumpJSON(v)
}

func listBgp(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	all, err := e.cl.BgpList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	return list(e, nonNil(all), func(b *model.Bgp) string { return b.Hostname }, writeBgpTable)
}

// ---- external contracts ----

func createExtContracts(e *env) error {
	if err := e.nargs(1, "Contracts group name required"); err != nil {
		return err
	}
	var typ string
	switch prov, cons := e.c.Bool("provided"), e.c.Bool("consumed"); {
	case prov && cons:
		return usageErr(nil, "Cannot use both provided and consumed")
	case prov:
		typ = "provided"
	case cons:
		typ = "consumed"
	default:
		return usageErr(nil, "Either provided or consumed must be specified")
	}
	contracts := e.c.StringSlice("contract")
	if len(contracts) == 0 {
		return usageErr(nil, "Contracts not provided")
	}
	t, n := e.tenant(), e.arg(0)
	err := e.cl.ExtContractsGroupPost(e.ctx, &model.ExtContractsGroup{
		TenantName:         t,
		ContractsGroupName: n,
		ContractsType:      typ,
		Contracts:          contracts,
	})
	if err != nil {
		return apiErr(err)
	}
	e.printf("Creating ExternalContracts %s:%s\n", t, n)
	return nil
}

func deleteExtContracts(e *env) error {
	if err := e.nargs(1, "Contracts group name required"); err != nil {
		return err
	}
	t, n := e.tenant(), e.arg(0)
	e.printf("Deleting external contracts group %s in tenant %s\n", n, t)
	return apiErr(e.cl.ExtContractsGroupDelete(e.ctx, t, n))
}

func listExtContracts(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	t := e.tenant()
	if err := e.checkTenant(t); err != nil {
		return err
	}
	all, err := e.cl.ExtContractsGroupList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	objs := filterTenant(e, all, t, func(g *model.ExtContractsGroup) string { return g.TenantName })
	return list(e, objs, func(g *model.ExtContractsGroup) string { return g.ContractsGroupName }, writeExtContractsTable)
}

// ---- version ----

func showVersion(build BuildInfo) func(e *env) error {
	return func(e *env) error {
		if err := e.noArgs(); err != nil {
			return err
		}
		v, err := e.cl.Version(e.ctx)
		if err != nil {
			var ce *client.ConnError
			if errors.As(err, &ce) {
				return &exitError{code: ExitRequest, msg: oneLine(err.Error())}
			}
			return apiErr(err)
		}
		e.printf("Client Version:\nVersion: %s\nGitCommit: %s\nBuildTime: %s\n\n", build.Version, build.GitCommit, build.BuildTime)
		e.printf("Server Version:\nVersion: %s\nGitCommit: %s\nBuildTime: %s\n", v.Version, v.GitCommit, v.BuildTime)
		return nil
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
