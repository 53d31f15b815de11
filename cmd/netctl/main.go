// Command netctl is the operator CLI for netmaster (Contiv-compatible). See docs/netctl.md.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/contivbpf/contivbpf/pkg/netctl"
)

// Set with -ldflags "-X main.version=... -X main.gitCommit=... -X main.buildTime=...".
var (
	version   = "dev"
	gitCommit = "unknown"
	buildTime = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := netctl.Run(ctx, os.Args, os.Stdout, os.Stderr,
		netctl.BuildInfo{Version: version, GitCommit: gitCommit, BuildTime: buildTime})
	stop()
	os.Exit(code)
}
