package netctl

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// quotaFlagKinds maps `tenant quota`'s limit flags to quota kinds, in display order.
func quotaFlagKinds() [][2]string {
	return [][2]string{
		{"networks", model.QuotaNetworks}, {"endpoint-groups", model.QuotaEndpointGroups},
		{"endpoint-group-ids", model.QuotaEPGIDs},
		{"policies", model.QuotaPolicies}, {"rules", model.QuotaRules}, {"services", model.QuotaServices},
		{"node-ports", model.QuotaNodePorts},
		{"app-profiles", model.QuotaAppProfiles}, {"netprofiles", model.QuotaNetprofiles}, {"endpoints", model.QuotaEndpoints},
		{"bytes", model.QuotaBytes},
	}
}

// quotaCommand is `netctl tenant quota <tenant>`: shows the tenant's limits and usage; an
// admin sets limits with the flags (a number, or "default"), or drops them with --reset.
func quotaCommand() *cli.Command {
	var flags []cli.Flag
	for _, f := range quotaFlagKinds() {
		usage := "Limit of " + strings.ReplaceAll(f[0], "-", " ") + " (a number, or \"default\"; admins only)"
		if f[1] == model.QuotaBytes {
			usage = "Limit of bytes of the tenant's stored records (e.g. 64Mi, 1G, or \"default\"; admins only)"
		}
		flags = append(flags, str(f[0], "", "", usage))
	}
	flags = append(flags,
		str("vlans", "", "", "VLAN ids the tenant's networks use, lo-hi (e.g. 100-199), or \"none\" (admins only)"),
		str("vxlans", "", "", "VXLAN ids (VNIs) the tenant's networks use, lo-hi (e.g. 6000-6999), or \"none\" (admins only)"),
		boolean("reset", "", "Drop every limit set for the tenant: netmaster's defaults apply (admins only)"), jsonFlag())
	return &cli.Command{Name: "quota", Usage: "Show a tenant's quota and usage; set its limits (admins)", ArgsUsage: "[tenant]",
		Flags: flags, Action: action(tenantQuota)}
}

// rangeFlags maps `tenant quota`'s tag range flags to the quota's range fields.
func rangeFlags() [][2]string {
	return [][2]string{{"vlans", model.QuotaVLANs}, {"vxlans", model.QuotaVXLANs}}
}

func tenantQuota(e *env) error {
	if err := e.nargs(1, "Tenant name required"); err != nil {
		return err
	}
	t := e.arg(0)
	upd, err := quotaUpdate(e)
	if err != nil {
		return err
	}
	ranges, err := rangeUpdate(e)
	if err != nil {
		return err
	}
	q, err := e.cl.QuotaGet(e.ctx, t)
	if e.c.Bool("reset") && err == nil {
		q, err = e.cl.QuotaReset(e.ctx, t)
	}
	if len(upd)+len(ranges) > 0 && err == nil {
		q, err = e.cl.QuotaSet(e.ctx, t, upd, ranges)
	}
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(q)
	}
	return ioErr(writeQuotaTable(e.out, q))
}

// quotaUpdate reads the limit flags given.
func quotaUpdate(e *env) (model.QuotaUpdate, error) {
	upd := model.QuotaUpdate{}
	for _, f := range quotaFlagKinds() {
		if !e.c.IsSet(f[0]) {
			continue
		}
		v := e.c.String(f[0])
		if v == "default" {
			upd[f[1]] = nil
			continue
		}
		n, err := parseLimit(v)
		if err != nil {
			return nil, usageErr(e.c, "--%s %q: %v", f[0], v, err)
		}
		upd[f[1]] = &n
	}
	return upd, nil
}

// reTagRange is what a tag range flag takes besides "none" (netmaster checks the bounds).
var reTagRange = regexp.MustCompile(`^[0-9]{1,8}-[0-9]{1,8}$`)

// rangeUpdate reads the tag range flags given ("none": drop the range).
func rangeUpdate(e *env) (model.TagRangeUpdate, error) {
	out := model.TagRangeUpdate{}
	for _, f := range rangeFlags() {
		if !e.c.IsSet(f[0]) {
			continue
		}
		v := e.c.String(f[0])
		switch {
		case v == "none":
			out[f[1]] = nil
		case reTagRange.MatchString(v):
			out[f[1]] = &v
		default:
			return nil, usageErr(e.c, "--%s %q: want a range like 100-199, or \"none\"", f[0], v)
		}
	}
	return out, nil
}

// parseLimit reads a limit: a whole number, with an optional K, M, G (powers of 1000) or
// Ki, Mi, Gi (powers of 1024) suffix.
func parseLimit(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("want a number of 0 or more (suffix K, M, G, Ki, Mi or Gi), or \"default\"")
	}
	return n * mult, nil
}

// writeQuotaTable prints a tenant's limits and usage, one kind per line; Source says
// whether the limit was set for the tenant or is netmaster's default.
func writeQuotaTable(w io.Writer, q *model.TenantQuota) error {
	fmt.Fprintf(w, "Tenant: %s\n", q.Tenant)
	tw := newTable(w, 2)
	fmt.Fprint(tw, "Kind\tUsage\tLimit\tSource\n")
	fmt.Fprint(tw, "----\t-----\t-----\t------\n")
	for _, k := range model.QuotaKinds() {
		limit, source := "-", "none"
		if v, ok := q.Limits[k]; ok {
			limit, source = strconv.FormatInt(v, 10), "default"
		}
		if _, ok := q.Overrides[k]; ok {
			source = "tenant"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", k, q.Usage[k], limit, source)
	}
	for _, r := range []struct{ field, val string }{{model.QuotaVLANs, q.VLANs}, {model.QuotaVXLANs, q.VXLANs}} {
		limit, source := "-", "none"
		if r.val != "" {
			limit, source = r.val, "tenant"
		}
		fmt.Fprintf(tw, "%s\t-\t%s\t%s\n", r.field, limit, source)
	}
	return tw.Flush()
}
