package netctl

import (
	"fmt"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// Table writers. Layouts (headers, separators, cell formats and tabwriter parameters) are
// Contiv's, byte for byte: minwidth 0, tabwidth 2 (4 for tenant ls and the info commands),
// padding 2, pad ' ', no flags. Quirks (the trailing space in the network header, the short
// separator under "From IpAddress", the misaligned external-contracts rows) are kept on
// purpose: scripts parse this output.

func newTable(w io.Writer, tabwidth int) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, tabwidth, 2, ' ', 0)
}

func writeTenantTable(w io.Writer, tenants []model.Tenant) error {
	tw := newTable(w, 4)
	fmt.Fprint(tw, "Name\t\n")
	fmt.Fprint(tw, "------\t\n")
	for _, t := range tenants {
		fmt.Fprintf(tw, "%v\t\n", t.TenantName)
	}
	return tw.Flush()
}

func writeNetworkTable(w io.Writer, nets []model.Network) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Tenant\tNetwork\tNw Type\tEncap type\tPacket tag\tSubnet\tGateway\tIPv6Subnet\tIPv6Gateway\tCfgd Tag \n")
	fmt.Fprint(tw, "------\t-------\t-------\t----------\t----------\t-------\t------\t----------\t-----------\t---------\n")
	for _, n := range nets {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\n",
			n.TenantName, n.NetworkName, n.NwType, n.Encap, n.PktTag, n.Subnet, n.Gateway,
			n.Ipv6Subnet, n.Ipv6Gateway, n.CfgdTag)
	}
	return tw.Flush()
}

func writeGroupTable(w io.Writer, groups []model.EndpointGroup) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Tenant\tGroup\tNetwork\tIP Pool\tCfgdTag\tPolicies\tNetwork profile\n")
	fmt.Fprint(tw, "------\t-----\t-------\t-------\t-------\t--------\t---------------\n")
	for _, g := range groups {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\t%v\n",
			g.TenantName, g.GroupName, g.NetworkName, g.IpPool, g.CfgdTag,
			strings.Join(g.Policies, ","), g.NetProfile)
	}
	return tw.Flush()
}

func writePolicyTable(w io.Writer, policies []model.Policy) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Tenant\tPolicy\n")
	fmt.Fprint(tw, "------\t------\n")
	for _, p := range policies {
		fmt.Fprintf(tw, "%s\t%s\n", p.TenantName, p.PolicyName)
	}
	return tw.Flush()
}

// writeRuleTable prints incoming then outgoing rules; rules must already be sorted.
func writeRuleTable(w io.Writer, rules []model.Rule) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Incoming Rules:\n")
	fmt.Fprint(tw, "Rule\tPriority\tFrom EndpointGroup\tFrom Network\tFrom IpAddress\tTo IpAddress\tProtocol\tPort\tAction\n")
	fmt.Fprint(tw, "----\t--------\t------------------\t------------\t---------\t------------\t--------\t----\t------\n")
	for _, r := range rules {
		if r.Direction == "in" {
			fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\n",
				r.RuleID, r.Priority, r.FromEndpointGroup, r.FromNetwork, r.FromIpAddress,
				r.ToIpAddress, r.Protocol, r.Port, r.Action)
		}
	}
	fmt.Fprint(tw, "Outgoing Rules:\n")
	fmt.Fprint(tw, "Rule\tPriority\tTo EndpointGroup\tTo Network\tTo IpAddress\tProtocol\tPort\tAction\n")
	fmt.Fprint(tw, "----\t--------\t----------------\t----------\t---------\t--------\t----\t------\n")
	for _, r := range rules {
		if r.Direction == "out" {
			fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\t%v\t%v\n",
				r.RuleID, r.Priority, r.ToEndpointGroup, r.ToNetwork, r.ToIpAddress,
				r.Protocol, r.Port, r.Action)
		}
	}
	return tw.Flush()
}

var digitsRE = regexp.MustCompile("[0-9]+")

func writeNetprofileTable(w io.Writer, profiles []model.Netprofile) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Name\tTenant\tBandwidth\tDSCP\tburst size\n")
	fmt.Fprint(tw, "------\t------\t---------\t--------\t----------\n")
	unit := "" // as Contiv: a bandwidth without a unit letter reuses the previous row's unit
	for _, p := range profiles {
		if p.Bandwidth == "" {
			fmt.Fprintf(tw, "%v\t%v\t%v\t%v\n", p.ProfileName, p.TenantName, p.Bandwidth, p.DSCP)
			continue
		}
		switch {
		case strings.ContainsAny(p.Bandwidth, "gG"):
			unit = "Gbps"
		case strings.ContainsAny(p.Bandwidth, "mM"):
			unit = "Mbps"
		case strings.ContainsAny(p.Bandwidth, "kK"):
			unit = "Kbps"
		}
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\n", p.ProfileName, p.TenantName,
			digitsRE.FindString(p.Bandwidth)+unit, p.DSCP, p.Burst)
	}
	return tw.Flush()
}

func writeAppProfileTable(w io.Writer, profiles []model.AppProfile) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Tenant\tAppProfile\tGroups\n")
	fmt.Fprint(tw, "------\t----------\t------\n")
	for _, p := range profiles {
		fmt.Fprintf(tw, "%v\t%v\t%v\n", p.TenantName, p.AppProfileName, strings.Join(p.EndpointGroups, ","))
	}
	return tw.Flush()
}

func writeServiceTable(w io.Writer, services []model.ServiceLB) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "ServiceName\tTenant\tNetwork\tSelectors\n")
	fmt.Fprint(tw, "---------\t--------\t-------\t-------\n")
	for _, s := range services {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t\n", s.ServiceName, s.TenantName, s.NetworkName, s.Selectors)
	}
	return tw.Flush()
}

func writeBgpTable(w io.Writer, bgps []model.Bgp) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "HostName\tRouterIP\tAS\tNeighbor\tNeighborAS\n")
	fmt.Fprint(tw, "---------\t--------\t-------\t--------\t-------\n")
	for _, b := range bgps {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\n", b.Hostname, b.Routerip, b.As, b.Neighbor, b.NeighborAs)
	}
	return tw.Flush()
}

func writeExtContractsTable(w io.Writer, groups []model.ExtContractsGroup) error {
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Tenant\tName\t\tType\t\tContracts\n")
	fmt.Fprint(tw, "------\t------\t\t------\t\t-------\n")
	for _, g := range groups {
		fmt.Fprintf(tw, "%s\t%s\t\t%s\t%s\n", g.TenantName, g.ContractsGroupName, g.ContractsType, g.Contracts)
	}
	return tw.Flush()
}

func writeGlobalInfo(w io.Writer, globals []model.Global) error {
	tw := newTable(w, 4)
	for _, g := range globals {
		fmt.Fprintf(tw, "Fabric mode: %v\n", g.NetworkInfraType)
		fmt.Fprintf(tw, "Forward mode: %v\n", g.FwdMode)
		fmt.Fprintf(tw, "ARP mode: %v\n", g.ArpMode)
		fmt.Fprintf(tw, "Vlan Range: %v\n", g.Vlans)
		fmt.Fprintf(tw, "Vxlan range: %v\n", g.Vxlans)
		fmt.Fprintf(tw, "Private subnet: %v\n", g.PvtSubnet)
		if g.Encryption != "" { // (not in Contiv: a netmaster of Contiv has none)
			fmt.Fprintf(tw, "Encryption: %v\n", g.Encryption)
		}
	}
	return tw.Flush()
}

func writeAciGwInfo(w io.Writer, gws []model.AciGw) error {
	tw := newTable(w, 4)
	for _, g := range gws {
		fmt.Fprintf(tw, "Path bindings: %v\n", g.PathBindings)
		fmt.Fprintf(tw, "Node bindings: %v\n", g.NodeBindings)
		fmt.Fprintf(tw, "Physical domain: %v\n", g.PhysicalDomain)
		fmt.Fprintf(tw, "Enforce policies: %v\n", g.EnforcePolicies)
		fmt.Fprintf(tw, "Include Common-Tenant: %v\n", g.IncludeCommonTenant)
	}
	return tw.Flush()
}
