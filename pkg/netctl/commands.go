package netctl

import "github.com/urfave/cli/v2"

// Flag constructors: every command gets fresh flag values (urfave/cli keeps parse state in
// the flag structs, so they must not be shared between commands).
func tenantFlag() cli.Flag {
	return &cli.StringFlag{Name: "tenant", Aliases: []string{"t"}, Value: "default", Usage: "Name of the tenant"}
}
func allFlag() cli.Flag {
	return &cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "List all items"}
}
func jsonFlag() cli.Flag {
	return &cli.BoolFlag{Name: "json", Aliases: []string{"j"}, Usage: "Output list in JSON format"}
}
func quietFlag() cli.Flag {
	return &cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "Only display name field"}
}
func listFlags() []cli.Flag { return []cli.Flag{tenantFlag(), allFlag(), jsonFlag(), quietFlag()} }

func str(name, short, value, usage string) cli.Flag {
	f := &cli.StringFlag{Name: name, Value: value, Usage: usage}
	if short != "" {
		f.Aliases = []string{short}
	}
	return f
}
func integer(name, short string, value int, usage string) cli.Flag {
	f := &cli.IntFlag{Name: name, Value: value, Usage: usage}
	if short != "" {
		f.Aliases = []string{short}
	}
	return f
}
func strSlice(name, short, usage string) cli.Flag {
	f := &cli.StringSliceFlag{Name: name, Usage: usage}
	if short != "" {
		f.Aliases = []string{short}
	}
	return f
}
func boolean(name, short, usage string) cli.Flag {
	f := &cli.BoolFlag{Name: name, Usage: usage}
	if short != "" {
		f.Aliases = []string{short}
	}
	return f
}

func commands(build BuildInfo) []*cli.Command {
	cmds := []*cli.Command{
		{Name: "version", Usage: "Version Information", Action: action(showVersion(build))},
		{
			Name: "group", Usage: "Endpoint Group manipulation tools",
			Subcommands: []*cli.Command{
				{Name: "create", Usage: "Create an endpoint group", ArgsUsage: "[network] [group]",
					Flags: []cli.Flag{tenantFlag(),
						strSlice("policy", "p", "Policy"),
						str("networkprofile", "n", "", "network profile"),
						strSlice("external-contract", "e", "External contract"),
						str("ip-pool", "r", "", "IP Address range, example 10.36.0.1-10.36.0.10"),
						str("epg-tag", "tag", "", "Configured Group Tag"),
					}, Action: action(createGroup)},
				{Name: "inspect", Usage: "Inspect an EndpointGroup", ArgsUsage: "[group]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(inspectGroup)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete an endpoint group", ArgsUsage: "[group]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deleteGroup)},
				{Name: "ls", Aliases: []string{"list"}, Usage: "List endpoint groups", ArgsUsage: " ",
					Flags: listFlags(), Action: action(listGroups)},
			},
		},
		{
			Name: "endpoint", Aliases: []string{"ep"}, Usage: "Endpoint Inspection",
			Subcommands: []*cli.Command{
				{Name: "inspect", Usage: "Inspect an Endpoint (by endpoint id, container id or container name, or a part of one)", ArgsUsage: "[epid]", Action: action(inspectEndpoint)},
				endpointListCommand(),
			},
		},
		{
			Name: "netprofile", Usage: "Network profile manipulation tools",
			Subcommands: []*cli.Command{
				{Name: "create", Usage: "Create a network profile", ArgsUsage: "[netprofile]",
					Flags: []cli.Flag{tenantFlag(),
						str("bandwidth", "b", "", "Bandwidth (e.g., 10 kbps, 100 mbps, 1gbps)"),
						integer("dscp", "d", 0, "DSCP"),
						integer("burst", "s", 0, "burst size in kilobits (0: the dataplane's default, docs/netprofiles.md)"),
					}, Action: action(createNetprofile)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete a network profile", ArgsUsage: "[netprofile]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deleteNetprofile)},
				{Name: "ls", Aliases: []string{"list"}, Usage: "List network profiles", ArgsUsage: " ",
					Flags: listFlags(), Action: action(listNetprofiles)},
				{Name: "inspect", Usage: "Inspect a network profile", ArgsUsage: "[netprofile]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(inspectNetprofile)},
			},
		},
		{
			Name: "network", Aliases: []string{"net"}, Usage: "Network manipulation tools",
			Subcommands: []*cli.Command{
				{Name: "ls", Aliases: []string{"list"}, Usage: "List networks", ArgsUsage: " ",
					Flags: listFlags(), Action: action(listNetworks)},
				{Name: "inspect", Usage: "Inspect a Network", ArgsUsage: "[network]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(inspectNetwork)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete a network", ArgsUsage: "[network]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deleteNetwork)},
				{Name: "create", Usage: "Create a network", ArgsUsage: "[network]",
					Flags: []cli.Flag{tenantFlag(),
						str("nw-type", "n", "data", "Network Type (infra or data)"),
						str("encap", "e", "vxlan", "Encap type (vlan or vxlan)"),
						integer("pkt-tag", "p", 0, "Packet tag (Vlan ID/VNI)"),
						str("subnet", "s", "", "Subnet CIDR - REQUIRED"),
						str("gateway", "g", "", "Gateway"),
						str("subnetv6", "s6", "", "IPv6 Subnet CIDR"),
						str("gatewayv6", "g6", "", "IPv6 Gateway"),
						str("nw-tag", "tag", "", "Configured Network Tag"),
						boolean("no-nat", "", "Endpoints do not reach the outside through their host (egress NAT off)"),
					}, Action: action(createNetwork)},
			},
		},
		{
			Name: "tenant", Usage: "Tenant manipulation tools",
			Subcommands: []*cli.Command{
				{Name: "ls", Aliases: []string{"list"}, Usage: "List tenants", ArgsUsage: " ",
					Flags: []cli.Flag{quietFlag(), jsonFlag()}, Action: action(listTenants)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete a tenant", ArgsUsage: "[tenant]",
					Action: action(deleteTenant)},
				{Name: "create", Usage: "Create a tenant", ArgsUsage: "[tenant]", Action: action(createTenant)},
				{Name: "inspect", Usage: "Inspect a tenant", ArgsUsage: "[tenant]", Action: action(inspectTenant)},
				quotaCommand(),
			},
		},
		hostCommand(),
		wireguardCommand(),
		prefilterCommand(),
		{
			Name: "policy", Usage: "Policy manipulation tools",
			Subcommands: []*cli.Command{
				{Name: "create", Usage: "Create a new policy", ArgsUsage: "[policy]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(createPolicy)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete a policy", ArgsUsage: "[policy]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deletePolicy)},
				{Name: "ls", Aliases: []string{"list"}, Usage: "List policies", ArgsUsage: " ",
					Flags: listFlags(), Action: action(listPolicies)},
				{Name: "inspect", Usage: "Inspect a policy", ArgsUsage: "[policy]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(inspectPolicy)},
				{Name: "rule-ls", Usage: "List rules for a given tenant,policy", ArgsUsage: "[policy]",
					Flags: []cli.Flag{tenantFlag(), jsonFlag(), quietFlag()}, Action: action(listRules)},
				{Name: "rule-rm", Usage: "Delete a rule from the policy", ArgsUsage: "[policy] [rule id]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deleteRule)},
				{Name: "rule-add", Usage: "Add a new rule to the policy", ArgsUsage: "[policy] [rule id]",
					Flags: []cli.Flag{tenantFlag(),
						integer("priority", "p", 1, "Priority Indicator"),
						str("direction", "d", "in", "Direction of traffic (in/out)"),
						str("from-group", "g", "", "From Endpoint Group Name (Valid in incoming direction only)"),
						str("to-group", "e", "", "To Endpoint Group Name (Valid in outgoing direction only)"),
						str("from-network", "n", "", "From Network name (Valid in incoming direction only)"),
						str("to-network", "o", "", "To Network name (Valid in outgoing direction only)"),
						str("from-ip-address", "i", "", "From IP address/CIDR (Valid in incoming direction only)"),
						str("to-ip-address", "s", "", "To IP address/CIDR (Valid in outgoing direction only)"),
						str("protocol", "l", "", "Protocol (e.g., tcp, udp, icmp)"),
						integer("port", "P", 0, "Port"),
						str("action", "j", "allow", "Action to take (allow or deny)"),
					}, Action: action(addRule)},
			},
		},
		{
			Name: "external-contracts", Usage: "External contracts",
			Subcommands: []*cli.Command{
				{Name: "ls", Aliases: []string{"list"}, Usage: "List external contracts", ArgsUsage: " ",
					Flags: []cli.Flag{quietFlag(), allFlag(), jsonFlag(), tenantFlag()}, Action: action(listExtContracts)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete external contracts", ArgsUsage: "[name]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deleteExtContracts)},
				{Name: "create", Usage: "Create external contracts", ArgsUsage: "[name]",
					Flags: []cli.Flag{tenantFlag(),
						boolean("consumed", "c", "External contracts type - consumed"),
						boolean("provided", "p", "External contracts type - provided"),
						strSlice("contract", "a", "Contract"),
					}, Action: action(createExtContracts)},
			},
		},
		{
			Name: "global", Usage: "Global information",
			Subcommands: []*cli.Command{
				{Name: "info", Usage: "Show global information", ArgsUsage: " ",
					Flags: []cli.Flag{tenantFlag(), allFlag(), jsonFlag()}, Action: action(showGlobal)},
				{Name: "inspect", Usage: "Inspect Global Operational Information", ArgsUsage: " ",
					Action: action(inspectGlobal)},
				{Name: "set", Usage: "Set global parameters", ArgsUsage: " ",
					Flags: []cli.Flag{
						str("fabric-mode", "f", "", "Fabric mode (aci, aci-opflex or default)"),
						str("vlan-range", "v", "", "Allowed Vlan id range"),
						str("vxlan-range", "x", "", "Allowed Vxlan VNID range"),
						str("fwd-mode", "b", "", "forwarding mode (bridge,routing)"),
						str("arp-mode", "a", "", "arp mode (proxy,flood)"),
						str("private-subnet", "s", "172.19.0.0/16", "Select a /16 private subnet for host access"),
						str("encryption", "", "", "Encryption between hosts (none, wireguard) for netplugins started without --encryption (not in Contiv)"),
					}, Action: action(setGlobal)},
			},
		},
		{
			Name: "aci-gw", Usage: "ACI Gateway information",
			Subcommands: []*cli.Command{
				{Name: "info", Usage: "Show aci gateway information", ArgsUsage: " ",
					Flags: []cli.Flag{tenantFlag(), allFlag(), jsonFlag()}, Action: action(showAciGw)},
				{Name: "inspect", Usage: "Inspect aci gateway operational information", ArgsUsage: " ",
					Action: action(inspectAciGw)},
				{Name: "set", Usage: "Set aci-gw parameters", ArgsUsage: " ",
					Flags: []cli.Flag{
						str("path-bindings", "p", "", "Blank or comma separated paths of the form topology/pod-1/paths-101/pathep-[eth1/14]"),
						str("node-bindings", "n", "", "Blank or comma separated nodes of the form topology/pod-1/node-101"),
						str("phys-dom", "d", "", "ACI physical domain name (e.g. containerDom)"),
						str("enforce-policies", "e", "yes", "Should security policies be enforced (yes,no)"),
						str("include-common-tenant", "i", "no", "Should gateway look up objects in common tenant as well (yes,no)"),
					}, Action: action(setAciGw)},
			},
		},
		{
			Name: "bgp", Usage: "router capability configuration",
			Subcommands: []*cli.Command{
				{Name: "ls", Aliases: []string{"list"}, Usage: "List BGP configuration", ArgsUsage: " ",
					Flags: []cli.Flag{jsonFlag(), quietFlag()}, Action: action(listBgp)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete BGP configuration", ArgsUsage: "[hostname]",
					Action: action(deleteBgp)},
				{Name: "create", Usage: "Add BGP configuration.", ArgsUsage: "[hostname]",
					Flags: []cli.Flag{
						str("router-ip", "", "", "BGP my-router ip (CIDR)"),
						str("as", "", "", "Self AS id"),
						str("neighbor-as", "", "", "BGP neighbor AS id"),
						str("neighbor", "", "", "BGP neighbor to be added"),
					}, Action: action(addBgp)},
				{Name: "inspect", Usage: "Inspect Bgp", ArgsUsage: "[hostname]", Action: action(inspectBgp)},
			},
		},
		{
			Name: "app-profile", Usage: "Application Profile manipulation tools",
			Subcommands: []*cli.Command{
				{Name: "create", Usage: "Create an application profile", ArgsUsage: "[app-profile]",
					Flags:  []cli.Flag{tenantFlag(), str("group", "g", "", "Endpoint Group List (separated by commas)")},
					Action: action(createAppProfile)},
				{Name: "update", Usage: "Update an application profile", ArgsUsage: "[app-profile]",
					Flags:  []cli.Flag{tenantFlag(), str("group", "g", "", "Endpoint Group List (separated by commas)")},
					Action: action(updateAppProfile)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete an application profile", ArgsUsage: "[app-profile]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(deleteAppProfile)},
				{Name: "ls", Aliases: []string{"list"}, Usage: "List Application Profiles", ArgsUsage: " ",
					Flags: listFlags(), Action: action(listAppProfiles)},
				{Name: "group-ls", Aliases: []string{"group-list"}, Usage: "List groups in an app-profile", ArgsUsage: "[app-profile]",
					Flags: listFlags(), Action: action(listAppProfileGroups)},
			},
		},
		{
			Name: "service", Usage: "service object creation",
			Subcommands: []*cli.Command{
				{Name: "ls", Aliases: []string{"list"}, Usage: "List service objects", ArgsUsage: " ",
					Flags: listFlags(), Action: action(listServices)},
				{Name: "inspect", Usage: "Inspect a service", ArgsUsage: "[servicename]",
					Flags: []cli.Flag{tenantFlag()}, Action: action(inspectService)},
				{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete service object", ArgsUsage: "[servicename]",
					Flags: []cli.Flag{str("tenant", "t", "", "service tenant")}, Action: action(deleteService)},
				{Name: "create", Usage: "Create Service object", ArgsUsage: "[servicename]",
					Flags: []cli.Flag{
						str("tenant", "t", "", "service tenant"),
						str("network", "s", "", "service network name"),
						strSlice("selector", "l", "service selector: --selector=key1=value1 --selector=key2=value2"),
						strSlice("port", "p", "service/provider port: --port=svcPort1:provPort1:protocol --port=svcPort2:provPort2:protocol"),
						strSlice("node-port", "", "also reachable on every host's address: --node-port=nodePort:svcPort:protocol (30000-32767)"),
						str("preferred-ip", "ip", "", "preferred ip address"),
					}, Action: action(createService)},
			},
		},
	}
	return cmds
}
