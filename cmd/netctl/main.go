// Command netctl is the operator CLI for netmaster (Contiv-compatible). See docs/netctl.md.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/contivbpf/contivbpf/pkg/buildinfo"
	"github.com/contivbpf/contivbpf/pkg/netctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	b := buildinfo.Get()
	code := netctl.Run(ctx, os.Args, os.Stdout, os.Stderr,
		netctl.BuildInfo{Version: b.Version, GitCommit: b.GitCommit, BuildTime: b.BuildTime})
	stop()
	os.Exit(code)
}
