// Command netplugin is the per-host agent: it watches Contiv's state in etcd, programs the
// chosen dataplane (eBPF by default), serves the CNI socket and the :9090 inspect API, and
// registers the host's control and VTEP addresses. Flags follow Contiv 1.2's netplugin.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/buildinfo"
	"github.com/contivbpf/contivbpf/pkg/filewatch"
)

func main() {
	// SIGHUP reloads the inspect token file once its reloader runs (after etcd, the
	// datapath and netmaster are reached); until then, or without a token file, it must
	// not kill netplugin.
	filewatch.HoldSIGHUP()
	app := &cli.App{
		Name:    "netplugin",
		Usage:   "Contiv-compatible host agent with an eBPF dataplane",
		Version: buildinfo.Get().String(),
		Flags:   flags(),
		Action: func(c *cli.Context) error {
			cfg, err := configFrom(c)
			if err != nil {
				return cli.Exit(fmt.Sprintf("netplugin: %v", err), 22) // Contiv: invalid config exits 22
			}
			if c.Bool("check-config") {
				fmt.Println("configuration ok")
				return nil
			}
			return run(c.Context, cfg)
		},
	}
	if err := app.Run(os.Args); err != nil {
		slog.Error("netplugin failed", "err", err)
		os.Exit(1)
	}
}
