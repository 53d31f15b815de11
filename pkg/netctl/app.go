// Package netctl is the operator CLI (Contiv's netctl, same commands, flags, messages, exit
// codes and table layouts) built on urfave/cli/v2 and the REST client in pkg/netctl/client.
// It owns argument handling and output formatting; it knows nothing about how netmaster
// stores or computes anything.
package netctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/contivbpf/contivbpf/pkg/netctl/client"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
)

// DefaultNetmaster is used when neither --netmaster nor CONTIV_NETMASTER/NETMASTER is set.
const DefaultNetmaster = "http://netmaster:9999"

// Exit codes, as Contiv's netctl.
const (
	ExitOK      = 0
	ExitUsage   = 1 // wrong argument count, missing or invalid flag
	ExitRequest = 2 // raw HTTP request failed (version)
	ExitAPI     = 3 // API answered an error, or netmaster unreachable
	ExitIO      = 4 // local I/O or encoding failure
)

// BuildInfo is the client's own version, printed by `netctl version`.
type BuildInfo struct {
	Version   string
	GitCommit string
	BuildTime string
}

// exitError carries the exit code and the one-line message to print.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func usageErr(c *cli.Context, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	if c != nil && c.Command != nil {
		msg += fmt.Sprintf(" (see '%s --help')", c.Command.HelpName)
	}
	return &exitError{code: ExitUsage, msg: msg}
}

// apiErr turns a client error into exit code 3 (or 2 for the raw version request).
func apiErr(err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: ExitAPI, msg: oneLine(err.Error())}
}

func ioErr(err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: ExitIO, msg: oneLine(err.Error())}
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// Run executes one netctl invocation (args[0] is the program name) and returns the exit code.
// Everything is written to stdout/stderr; nothing calls os.Exit.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, build BuildInfo) int {
	app := NewApp(stdout, stderr, build)
	notFound := false
	app.CommandNotFound = func(c *cli.Context, name string) {
		notFound = true
		help := "netctl"
		if c.Command != nil && c.Command.HelpName != "" {
			help = c.Command.HelpName
		}
		fmt.Fprintf(stderr, "Error: no such command %q (see '%s --help')\n", name, help)
	}
	if len(args) < 2 || args[1] != "__complete" { // completion sees the words as typed
		args = ReorderArgs(app, args)
	}
	err := app.RunContext(ctx, args)
	if err == nil {
		if notFound {
			return ExitUsage
		}
		return ExitOK
	}
	code := ExitUsage
	msg := oneLine(err.Error())
	var ee *exitError
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ee):
		code, msg = ee.code, ee.msg
	case errors.As(err, &ec):
		code = ec.ExitCode()
	}
	if msg != "" {
		fmt.Fprintf(stderr, "Error: %s\n", msg)
	}
	return code
}

// NewApp builds the command tree. Exported for help generation and tests.
func NewApp(stdout, stderr io.Writer, build BuildInfo) *cli.App {
	app := &cli.App{
		Name:  "netctl",
		Usage: "A command line client for Contiv netplugin",
		Version: fmt.Sprintf("\nVersion: %s\nGitCommit: %s\nBuildTime: %s",
			build.Version, build.GitCommit, build.BuildTime),
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:  "netmaster",
				Value: DefaultNetmaster,
				Usage: "The URL of netmaster (http:// or https://); else $CONTIV_NETMASTER, else $NETMASTER",
			},
			&cli.BoolFlag{
				Name:    "insecure",
				Usage:   "skip TLS certificate verification (a warning says so on stderr)",
				EnvVars: []string{"CONTIV_INSECURE", "INSECURE"}, // (INSECURE: Contiv's netctl's)
			},
			&cli.StringFlag{Name: "cacert", EnvVars: []string{"CONTIV_CACERT"}, Usage: "CA `FILE` to verify an https:// netmaster with (default: system roots)"},
			&cli.StringFlag{Name: "cert", EnvVars: []string{"CONTIV_CERT"}, Usage: "client certificate `FILE` (with --key)"},
			&cli.StringFlag{Name: "key", EnvVars: []string{"CONTIV_KEY"}, Usage: "private key `FILE` of --cert"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"CONTIV_TOKEN"}, Usage: "bearer `TOKEN` for netmaster's --auth-tokens"},
			&cli.StringFlag{Name: "agent-token", EnvVars: []string{"CONTIV_AGENT_TOKEN"}, Usage: "bearer `TOKEN` for netplugins' inspect API (their --inspect-token-file; it travels unencrypted: give it role read-only)"},
			&cli.DurationFlag{Name: "timeout", Value: 30 * time.Second, EnvVars: []string{"CONTIV_TIMEOUT"}, Usage: "give up on a request after this long"},
		},
		Commands:       append(commands(build), bpfCommand(), monitorCommand(), traceCommand(), verifyCommand(), completionCommand(), completeCommand()),
		ExitErrHandler: func(*cli.Context, error) {}, // Run maps errors to exit codes
		OnUsageError:   onUsageError,
	}
	// Contiv sorts commands by name in help.
	sortCommands(app.Commands)
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, c := range cmds {
			c.OnUsageError = onUsageError
			if len(c.Subcommands) == 0 {
				c.HideHelpCommand = true
			}
			walk(c.Subcommands)
		}
	}
	walk(app.Commands)
	return app
}

// onUsageError turns flag parsing errors into one line and exit code 1.
func onUsageError(c *cli.Context, err error, _ bool) error {
	return usageErr(c, "%v", err)
}

// netmasterURL: the flag if given, else the first non-empty of CONTIV_NETMASTER and
// NETMASTER, else the default.
func netmasterURL(c *cli.Context) string {
	if c.IsSet("netmaster") {
		return c.String("netmaster")
	}
	for _, env := range []string{"CONTIV_NETMASTER", "NETMASTER"} {
		if v := os.Getenv(env); v != "" {
			return v
		}
	}
	return DefaultNetmaster
}

// insecureSource names what turned --insecure on: an environment variable that is set,
// else the flag.
func insecureSource() string {
	for _, env := range []string{"CONTIV_INSECURE", "INSECURE"} {
		if on, err := strconv.ParseBool(os.Getenv(env)); err == nil && on {
			return "$" + env + " is set"
		}
	}
	return "--insecure"
}

// newClient builds the REST client from the global flags.
func newClient(c *cli.Context) (*client.Client, error) {
	if c.Duration("timeout") <= 0 {
		return nil, &exitError{code: ExitUsage, msg: "--timeout must be positive"}
	}
	tc, err := tlsconf.Client(tlsconf.Files{CA: c.String("cacert"), Cert: c.String("cert"), Key: c.String("key")}, "--cacert/--cert/--key")
	if err != nil {
		return nil, &exitError{code: ExitUsage, msg: err.Error()}
	}
	if c.Bool("insecure") {
		tc.InsecureSkipVerify = true //nolint:gosec // the operator asked for it
		// Never silently: a generic environment variable left set in a shell would turn
		// off certificate checks (and send tokens to whoever answers) unnoticed.
		if strings.HasPrefix(netmasterURL(c), "https://") {
			fmt.Fprintf(c.App.ErrWriter, "netctl: warning: TLS certificates are not verified (%s): whoever answers gets the request and its token\n", insecureSource())
		}
	}
	opts := []client.Option{client.WithHTTPClient(&http.Client{Timeout: c.Duration("timeout"), Transport: &http.Transport{
		Proxy: http.ProxyFromEnvironment, TLSClientConfig: tc}})}
	if tok := strings.TrimSpace(c.String("token")); tok != "" {
		opts = append(opts, client.WithHeader("Authorization", "Bearer "+tok))
	}
	cl, err := client.New(netmasterURL(c), opts...)
	if err != nil {
		return nil, &exitError{code: ExitUsage, msg: err.Error()}
	}
	return cl, nil
}
