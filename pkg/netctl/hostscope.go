package netctl

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// hostCommand is `netctl host`: the hosts' scopes, which tenants (or networks) each host's
// agent serves (this project's /api/v1/hostScopes/; docs/api.md "Host scopes").
func hostCommand() *cli.Command {
	return &cli.Command{
		Name: "host", Usage: "Which tenants each host's agent serves (host scopes)",
		Subcommands: []*cli.Command{
			{Name: "ls", Aliases: []string{"list"}, Usage: "List the hosts with a scope (hosts not listed serve every tenant)", ArgsUsage: " ",
				Flags: []cli.Flag{jsonFlag()}, Action: action(listHostScopes)},
			{Name: "scope", Usage: "Show a host's scope; set it (admins) with --tenant and --network, drop it with --reset", ArgsUsage: "[host]",
				Flags: []cli.Flag{
					strSlice("tenant", "t", "A tenant the host serves, every network of it (repeat for more)"),
					strSlice("network", "n", "A network the host serves, as <tenant>:<network> (repeat for more)"),
					boolean("none", "", "Serve nothing (a drained host): its agent creates no endpoint, network or address"),
					boolean("reset", "", "Drop the host's scope: it serves every tenant again"),
					jsonFlag(),
				}, Action: action(hostScope)},
		},
	}
}

func listHostScopes(e *env) error {
	l, err := e.cl.HostScopeList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(l)
	}
	tw := newTable(e.out, 2)
	fmt.Fprint(tw, "Host\tTenants\tNetworks\n")
	fmt.Fprint(tw, "----\t-------\t--------\n")
	for _, s := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Host, strings.Join(s.Tenants, ","), strings.Join(s.Networks, ","))
	}
	return ioErr(tw.Flush())
}

func hostScope(e *env) error {
	if err := e.nargs(1, "Host name required"); err != nil {
		return err
	}
	host := e.arg(0)
	tenants, networks, none, reset := e.c.StringSlice("tenant"), e.c.StringSlice("network"), e.c.Bool("none"), e.c.Bool("reset")
	set := len(tenants)+len(networks) > 0 || none
	if set && reset || none && len(tenants)+len(networks) > 0 {
		return usageErr(e.c, "--reset, --none and --tenant/--network exclude each other")
	}
	if reset {
		if err := e.cl.HostScopeReset(e.ctx, host); err != nil {
			return apiErr(err)
		}
		_, err := fmt.Fprintf(e.out, "Host %s serves every tenant\n", host)
		return ioErr(err)
	}
	var s *model.HostScope
	var err error
	if set {
		s, err = e.cl.HostScopeSet(e.ctx, &model.HostScope{Host: host, Tenants: tenants, Networks: networks})
	} else {
		s, err = e.cl.HostScopeGet(e.ctx, host)
	}
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(s)
	}
	return ioErr(writeHostScope(e.out, s))
}

func writeHostScope(w io.Writer, s *model.HostScope) error {
	list := func(l []string) string {
		if len(l) == 0 {
			return "(none)"
		}
		return strings.Join(l, ", ")
	}
	_, err := fmt.Fprintf(w, "Host: %s\nTenants: %s\nNetworks: %s\n", s.Host, list(s.Tenants), list(s.Networks))
	return err
}
