package netctl

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// prefilterCommand is `netctl prefilter`: the deny list, source prefixes the hosts drop
// where the underlay's packets enter (this project's /api/v1/prefilters/; docs/api.md
// "Prefilters"). Contiv's netctl has no such command.
func prefilterCommand() *cli.Command {
	return &cli.Command{
		Name: "prefilter", Usage: "Source prefixes the hosts drop at their uplinks (the deny list)",
		Subcommands: []*cli.Command{
			{Name: "ls", Aliases: []string{"list"}, Usage: "List the deny list's entries", ArgsUsage: " ",
				Flags: []cli.Flag{jsonFlag()}, Action: action(listPrefilters)},
			{Name: "create", Usage: "Create or replace an entry (admins): deny --cidr at every host, or at --host", ArgsUsage: "[name]",
				Flags: []cli.Flag{
					str("cidr", "c", "", "The IPv4 source prefix to drop, like 192.0.2.0/24 - REQUIRED"),
					str("host", "", "", "Only at this host's uplink (default: every host's)"),
				}, Action: action(createPrefilter)},
			{Name: "rm", Aliases: []string{"delete"}, Usage: "Delete an entry (admins)", ArgsUsage: "[name]",
				Action: action(deletePrefilter)},
		},
	}
}

// prefilterHost is how a listing names an entry's host ("" is every host).
func prefilterHost(p model.Prefilter) string {
	if p.Host == "" {
		return "(all)"
	}
	return p.Host
}

func listPrefilters(e *env) error {
	if err := e.noArgs(); err != nil {
		return err
	}
	l, err := e.cl.PrefilterList(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(l)
	}
	tw := newTable(e.out, 2)
	fmt.Fprint(tw, "Name\tCIDR\tHost\n")
	fmt.Fprint(tw, "----\t----\t----\n")
	for _, p := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, p.CIDR, prefilterHost(p))
	}
	return ioErr(tw.Flush())
}

func createPrefilter(e *env) error {
	if err := e.nargs(1, "Prefilter name required"); err != nil {
		return err
	}
	if e.c.String("cidr") == "" {
		return usageErr(e.c, "--cidr is required")
	}
	p, err := e.cl.PrefilterSet(e.ctx, &model.Prefilter{Name: e.arg(0), CIDR: e.c.String("cidr"), Host: e.c.String("host")})
	if err != nil {
		return apiErr(err)
	}
	where := "every host"
	if p.Host != "" {
		where = "host " + p.Host
	}
	e.printf("Creating prefilter %s: %s dropped at %s\n", p.Name, p.CIDR, where)
	return nil
}

func deletePrefilter(e *env) error {
	if err := e.nargs(1, "Prefilter name required"); err != nil {
		return err
	}
	if err := e.cl.PrefilterDelete(e.ctx, e.arg(0)); err != nil {
		return apiErr(err)
	}
	e.printf("Deleting prefilter %s\n", e.arg(0))
	return nil
}
