package netctl

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/urfave/cli/v2"
)

// ExitDrift is netctl verify's status when a host's datapath differs from its state.
const ExitDrift = 5

// verifyReport is netplugin's /inspect/verify answer.
type verifyReport struct {
	Host   string `json:"host"`
	Synced bool   `json:"synced"`
	Drift  []struct {
		Table  string `json:"table"`
		Object string `json:"object"`
		Kind   string `json:"kind"`
		Detail string `json:"detail"`
	} `json:"drift"`
	// Agent and Err are filled here: the URL asked and why it could not be.
	Agent string `json:"agent"`
	Err   string `json:"error,omitempty"`
}

// verifyCommand is `netctl verify`: each host's netplugin compares its live datapath
// with the state netmaster's records imply and names every difference.
func verifyCommand() *cli.Command {
	return &cli.Command{
		Name: "verify", Usage: "Compare hosts' live datapaths with netmaster's state (exit 5 on drift)", ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "agent", Aliases: []string{"host"}, Value: cli.NewStringSlice(DefaultAgent), EnvVars: []string{"CONTIV_AGENT"},
				Usage: "`URL` of a host's netplugin inspect API; repeat for several hosts"},
			allHostsFlag(),
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return usageErr(c, "%s", "More arguments than required")
			}
			agents, err := hostAgents(c)
			if err != nil {
				return err
			}
			reports := make([]verifyReport, len(agents))
			hc := agentHTTP(c, c.Duration("timeout"))
			var wg sync.WaitGroup
			for i, base := range agents {
				wg.Add(1)
				go func() {
					defer wg.Done()
					reports[i] = fetchVerify(c, hc, base)
				}()
			}
			wg.Wait()
			down, drift := 0, 0
			for _, r := range reports {
				if r.Err != "" {
					down++
				}
				drift += len(r.Drift)
			}
			if c.Bool("json") {
				e := &env{c: c, ctx: c.Context, out: c.App.Writer}
				if err := e.dumpJSON(reports); err != nil {
					return err
				}
			} else {
				tw := newTable(c.App.Writer, 2)
				fmt.Fprintln(tw, "HOST\tTABLE\tOBJECT\tKIND\tDETAIL")
				fmt.Fprintln(tw, "----\t-----\t------\t----\t------")
				for _, r := range reports {
					host := r.Host
					if host == "" {
						host = r.Agent
					}
					if r.Err != "" {
						fmt.Fprintf(tw, "%s\t-\t-\tdown\t%s\n", host, r.Err)
						continue
					}
					if len(r.Drift) == 0 {
						fmt.Fprintf(tw, "%s\t-\t-\tin sync\t\n", host)
					}
					for _, d := range r.Drift {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", host, d.Table, d.Object, d.Kind, d.Detail)
					}
				}
				if err := tw.Flush(); err != nil {
					return ioErr(err)
				}
			}
			switch {
			case down > 0:
				return &exitError{code: ExitAPI, msg: fmt.Sprintf("%d of %d hosts could not be checked", down, len(agents))}
			case drift > 0:
				return &exitError{code: ExitDrift, msg: fmt.Sprintf("%d differences between netmaster's state and the datapath", drift)}
			}
			return nil
		},
	}
}

func fetchVerify(c *cli.Context, hc *http.Client, base string) verifyReport {
	r := verifyReport{Agent: base}
	req, err := http.NewRequestWithContext(c.Context, http.MethodGet, base+"/inspect/verify", nil)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	resp, err := hc.Do(req)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.Err = resp.Status
		return r
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		r.Err = "bad answer: " + err.Error()
	}
	r.Agent = base
	return r
}
