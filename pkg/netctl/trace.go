package netctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/urfave/cli/v2"
)

// traceResult is netplugin's /inspect/trace answer.
type traceResult struct {
	Host    string `json:"host"`
	Packet  string `json:"packet"`
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	Rule    string `json:"rule"`
	Stages  []struct {
		Name   string `json:"name"`
		Detail string `json:"detail"`
	} `json:"stages"`
	Tunnel *struct {
		Source string `json:"source"`
		VTEP   string `json:"vtep"`
		VNI    uint32 `json:"vni"`
		Inner  []byte `json:"inner"`
	} `json:"tunnel,omitempty"`
	// Receive is the destination host's part (--to-agent), when the packet is tunneled.
	Receive *traceResult `json:"receive,omitempty"`
}

// traceCommand is `netctl trace`: a packet from a local endpoint run through its host's
// live datapath (programs and maps) without sending it or changing any state.
func traceCommand() *cli.Command {
	return &cli.Command{
		Name: "trace", Usage: "Run a packet through a host's live datapath without sending it", ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "agent", Aliases: []string{"host"}, Value: DefaultAgent, EnvVars: []string{"CONTIV_AGENT"},
				Usage: "`URL` of the source endpoint's host netplugin inspect API"},
			&cli.StringFlag{Name: "to-agent", Usage: "`URL` of the destination host's netplugin: a tunneled packet is traced through its receive path too"},
			&cli.StringFlag{Name: "from", Aliases: []string{"f"}, Required: true, Usage: "source: a local endpoint id (or a unique part of it)"},
			&cli.StringFlag{Name: "to", Aliases: []string{"t"}, Required: true, Usage: "destination: an address (endpoint, service VIP, anything) or an endpoint id"},
			&cli.StringFlag{Name: "proto", Value: "tcp", Usage: "tcp, udp or icmp"},
			&cli.UintFlag{Name: "port", Aliases: []string{"p"}, Usage: "destination port (tcp, udp)"},
			&cli.UintFlag{Name: "sport", Usage: "source port (default: an ephemeral one)"},
			jsonFlag(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return usageErr(c, "%s", "More arguments than required")
			}
			if c.Uint("port") > 65535 || c.Uint("sport") > 65535 {
				return usageErr(c, "%s", "--port and --sport must be at most 65535")
			}
			bases, err := agentBases(c, c.String("agent"))
			if err != nil {
				return err
			}
			base := bases[0]
			body, _ := json.Marshal(map[string]any{"from": c.String("from"), "to": c.String("to"), "proto": c.String("proto"),
				"port": c.Uint("port"), "sport": c.Uint("sport")})
			var r traceResult
			if err := postTrace(c, base+"/inspect/trace", body, &r); err != nil {
				return err
			}
			if raw := c.String("to-agent"); raw != "" && r.Tunnel != nil {
				tos, err := agentBases(c, raw)
				if err != nil {
					return err
				}
				to := tos[0]
				tb, _ := json.Marshal(r.Tunnel)
				var rx traceResult
				if err := postTrace(c, to+"/inspect/trace-receive", tb, &rx); err != nil {
					return err
				}
				r.Receive = &rx
			}
			if c.Bool("json") {
				e := &env{c: c, ctx: c.Context, out: c.App.Writer}
				return e.dumpJSON(r)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "trace %s on host %s (nothing sent, no state changed)\n", r.Packet, r.Host)
			if err := writeStages(w, r); err != nil {
				return err
			}
			if rx := r.Receive; rx != nil {
				fmt.Fprintf(w, "received on host %s: %s\n", rx.Host, rx.Packet)
				if err := writeStages(w, *rx); err != nil {
					return err
				}
				fmt.Fprintf(w, "verdict: %s\n", rx.Verdict)
				return nil
			}
			fmt.Fprintf(w, "verdict: %s\n", r.Verdict)
			return nil
		},
	}
}

func writeStages(w io.Writer, r traceResult) error {
	tw := newTable(w, 2)
	for _, s := range r.Stages {
		fmt.Fprintf(tw, "  %s\t%s\n", s.Name, s.Detail)
	}
	if err := tw.Flush(); err != nil {
		return ioErr(err)
	}
	return nil
}

// postTrace posts body to a netplugin trace route and decodes the answer into out.
func postTrace(c *cli.Context, url string, body []byte, out *traceResult) error {
	req, err := http.NewRequestWithContext(c.Context, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return &exitError{code: ExitUsage, msg: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := agentHTTP(c, c.Duration("timeout")).Do(req)
	if err != nil {
		return &exitError{code: ExitAPI, msg: fmt.Sprintf("cannot reach netplugin at %s: %v", url, err)}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: ExitAPI, msg: fmt.Sprintf("netplugin at %s: %s", url, strings.TrimSpace(string(b)))}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return &exitError{code: ExitAPI, msg: "bad trace answer: " + err.Error()}
	}
	return nil
}
