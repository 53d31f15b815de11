package netctl

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

// wireguardCommand is `netctl wireguard` (not in Contiv): the hosts' published WireGuard
// keys and their rotation (docs/encryption.md).
func wireguardCommand() *cli.Command {
	return &cli.Command{
		Name: "wireguard", Usage: "Hosts' WireGuard keys (netplugin --encryption wireguard)",
		Subcommands: []*cli.Command{
			{Name: "ls", Aliases: []string{"list"}, Usage: "List the hosts' published keys, endpoints and rotation state", ArgsUsage: " ",
				Flags: []cli.Flag{jsonFlag()}, Action: action(listWireGuard)},
			{Name: "rotate", Usage: "Ask a host's agent for a new key (admins); `ls` shows it pending until published", ArgsUsage: "[host]",
				Action: action(rotateWireGuard)},
		},
	}
}

// fingerprintLen is how much of a public key `wireguard ls` shows: its start as wg(8)
// prints it, enough to tell keys apart by eye (-j has the whole key).
const fingerprintLen = 12

func listWireGuard(e *env) error {
	l, err := e.cl.WireGuardHosts(e.ctx)
	if err != nil {
		return apiErr(err)
	}
	if e.c.Bool("json") {
		return e.dumpJSON(l)
	}
	tw := newTable(e.out, 2)
	fmt.Fprint(tw, "Host\tKey\tEndpoint\tRotation\n")
	fmt.Fprint(tw, "----\t---\t--------\t--------\n")
	for _, h := range l {
		fp := h.PublicKey
		if len(fp) > fingerprintLen {
			fp = fp[:fingerprintLen] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Host, fp, h.Endpoint, h.RotationState())
	}
	return ioErr(tw.Flush())
}

func rotateWireGuard(e *env) error {
	if err := e.nargs(1, "Host name required"); err != nil {
		return err
	}
	h, err := e.cl.WireGuardRotate(e.ctx, e.arg(0))
	if err != nil {
		return apiErr(err)
	}
	_, err = fmt.Fprintf(e.out, "Key rotation %d of host %s requested: pending until its agent publishes a new key\n", h.Rotate, h.Host)
	return ioErr(err)
}
