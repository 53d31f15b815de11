package netctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// DefaultAgent is netplugin's local inspect API (its --inspect-listen default).
const DefaultAgent = "http://127.0.0.1:9090"

// bpfKinds are the tables netplugin decodes (pkg/dataplane/ebpf and ovs ListingKinds;
// flows only on OVS, nat, netpol and routes only on eBPF; qos: endpoints' rate limits).
var bpfKinds = []string{"endpoints", "networks", "peers", "ct", "nat", "services", "policy", "netpol", "routes", "counters", "flows", "qos"}

// listing is netplugin's /inspect/bpf/<kind> answer.
type listing struct {
	Kind      string     `json:"kind"`
	Columns   []string   `json:"columns"`
	Rows      [][]string `json:"rows"`
	Truncated int        `json:"truncated,omitempty"`
}

// bpfCommand is `netctl bpf <table>`: one datapath table of a host, decoded by its
// netplugin (addresses, ports, protocols, actions, rule ids and names).
func bpfCommand() *cli.Command {
	var subs []*cli.Command
	for _, kind := range bpfKinds {
		flags := []cli.Flag{
			&cli.StringFlag{Name: "agent", Aliases: []string{"host"}, Value: DefaultAgent, EnvVars: []string{"CONTIV_AGENT"},
				Usage: "`URL` of the host's netplugin inspect API (its --inspect-listen)"},
			jsonFlag(),
		}
		if kind == "ct" || kind == "nat" {
			flags = append(flags, &cli.IntFlag{Name: "limit", Value: 1000, Usage: "at most this many entries"})
		}
		if kind == "policy" {
			flags = append(flags, &cli.StringFlag{Name: "group", Aliases: []string{"g"}, Usage: "only this endpoint group's rules (read alone)"},
				tenantFlag())
		}
		subs = append(subs, &cli.Command{Name: kind, Usage: "Decoded " + kind + " table of a host's datapath", ArgsUsage: " ",
			Flags: flags, Action: bpfList(kind)})
	}
	return &cli.Command{Name: "bpf", Usage: "Decoded eBPF datapath tables of a host (from its netplugin)", Subcommands: subs}
}

// agentBases checks netplugin URLs (--agent) and trims a trailing slash.
// hostAgents returns the inspect APIs a multi-host command talks to: with --all, every
// netplugin netmaster lists (GET /agents: those listening beyond loopback); otherwise the
// --agent URLs.
func hostAgents(c *cli.Context) ([]string, error) {
	if !c.Bool("all") {
		return agentBases(c, c.StringSlice("agent")...)
	}
	if c.IsSet("agent") {
		return nil, usageErr(c, "%s", "--all and --agent exclude each other")
	}
	cl, err := newClient(c)
	if err != nil {
		return nil, err
	}
	var agents []model.AgentInfo
	if err := cl.Do(c.Context, http.MethodGet, "/agents", nil, &agents); err != nil {
		return nil, err
	}
	if len(agents) == 0 {
		return nil, &exitError{code: ExitAPI, msg: "netmaster lists no netplugin inspect API (netplugins register theirs when --inspect-listen is not a loopback address)"}
	}
	out := make([]string, 0, len(agents))
	for _, a := range agents {
		out = append(out, strings.TrimSuffix(a.URL, "/"))
	}
	return out, nil
}

// allHostsFlag is --all of the multi-host commands.
func allHostsFlag() cli.Flag {
	return &cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "every host netmaster lists (GET /agents) instead of --agent"}
}

func agentBases(c *cli.Context, raw ...string) ([]string, error) {
	out := make([]string, 0, len(raw))
	for _, a := range raw {
		base := strings.TrimSuffix(a, "/")
		if !strings.HasPrefix(base, "http://") && !strings.HasPrefix(base, "https://") {
			return nil, usageErr(c, "--agent %q must start with http:// or https://", a)
		}
		out = append(out, base)
	}
	return out, nil
}

func bpfList(kind string) cli.ActionFunc {
	return func(c *cli.Context) error {
		if c.NArg() != 0 {
			return usageErr(c, "%s", "More arguments than required")
		}
		bases, err := agentBases(c, c.String("agent"))
		if err != nil {
			return err
		}
		u := bases[0] + "/inspect/bpf/" + kind
		if kind == "ct" || kind == "nat" {
			if c.Int("limit") < 1 {
				return usageErr(c, "--limit %d must be at least 1", c.Int("limit"))
			}
			u += "?limit=" + url.QueryEscape(strconv.Itoa(c.Int("limit")))
		}
		if kind == "policy" && c.String("group") != "" {
			u += "?group=" + url.QueryEscape(c.String("group")+":"+c.String("tenant"))
		}
		l, err := fetchListing(c.Context, agentHTTP(c, c.Duration("timeout")), u)
		if err != nil {
			return err
		}
		if c.Bool("json") {
			e := &env{c: c, ctx: c.Context, out: c.App.Writer}
			return e.dumpJSON(l)
		}
		return writeListing(c.App.Writer, l)
	}
}

func fetchListing(ctx context.Context, hc *http.Client, u string) (listing, error) {
	var l listing
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return l, &exitError{code: ExitUsage, msg: err.Error()}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return l, &exitError{code: ExitAPI, msg: fmt.Sprintf("cannot reach netplugin at %s: %v", u, err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return l, &exitError{code: ExitAPI, msg: fmt.Sprintf("read %s: %v", u, err)}
	}
	if resp.StatusCode != http.StatusOK {
		return l, &exitError{code: ExitAPI, msg: fmt.Sprintf("netplugin at %s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))}
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return l, &exitError{code: ExitAPI, msg: fmt.Sprintf("netplugin at %s: bad listing: %v", u, err)}
	}
	return l, nil
}

func writeListing(w io.Writer, l listing) error {
	tw := newTable(w, 2)
	fmt.Fprintln(tw, strings.Join(l.Columns, "\t"))
	seps := make([]string, len(l.Columns))
	for i, c := range l.Columns {
		seps[i] = strings.Repeat("-", len(c))
	}
	fmt.Fprintln(tw, strings.Join(seps, "\t"))
	for _, r := range l.Rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return ioErr(err)
	}
	if l.Truncated > 0 {
		if _, err := fmt.Fprintf(w, "(%d more entries not shown: raise --limit)\n", l.Truncated); err != nil {
			return ioErr(err)
		}
	}
	return nil
}

// agentHTTP is the client of netplugins' inspect API: it sends --agent-token (when set)
// with every request and follows no redirect; timeout 0 is none (streams).
func agentHTTP(c *cli.Context, timeout time.Duration) *http.Client {
	var rt http.RoundTripper = http.DefaultTransport
	if tok := strings.TrimSpace(c.String("agent-token")); tok != "" {
		rt = auth.Bearer(tok, rt)
	}
	// Redirects are not followed: the token would go wherever one points.
	return &http.Client{Timeout: timeout, Transport: rt,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
