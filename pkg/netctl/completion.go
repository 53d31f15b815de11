package netctl

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// Shell completion: `netctl __complete <words typed so far>` prints the words that may
// follow (subcommands, or flags when the last word starts with '-'), walking the same
// command tree netctl runs; `netctl completion bash|zsh` prints the shell glue that asks
// it. Install with
//
//	netctl completion bash > /etc/bash_completion.d/netctl
//	netctl completion zsh > "${fpath[1]}/_netctl"
const bashCompletion = `# bash completion for netctl (netctl completion bash)
_netctl() {
  local IFS=$'\n'
  COMPREPLY=($(netctl __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o bashdefault -o default -F _netctl netctl
`

const zshCompletion = `#compdef netctl
# zsh completion for netctl (netctl completion zsh)
_netctl() {
  local -a opts
  opts=("${(@f)$(netctl __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
  if [[ -n "${opts[1]}" ]]; then
    compadd -a opts
  else
    _files
  fi
}
compdef _netctl netctl
`

func completionCommand() *cli.Command {
	return &cli.Command{
		Name: "completion", Usage: "Print shell completion code (bash or zsh)", ArgsUsage: "bash|zsh",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageErr(c, "%s", "completion needs one argument: bash or zsh")
			}
			switch c.Args().First() {
			case "bash":
				_, err := fmt.Fprint(c.App.Writer, bashCompletion)
				return err
			case "zsh":
				_, err := fmt.Fprint(c.App.Writer, zshCompletion)
				return err
			}
			return usageErr(c, "unknown shell %q: want bash or zsh", c.Args().First())
		},
	}
}

// completeCommand is the hidden `__complete` the shell glue calls.
func completeCommand() *cli.Command {
	return &cli.Command{
		Name: "__complete", Hidden: true, SkipFlagParsing: true, HideHelp: true,
		Action: func(c *cli.Context) error {
			for _, w := range complete(c.App, c.Args().Slice()) {
				if _, err := fmt.Fprintln(c.App.Writer, w); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// complete returns the candidates for the last of words (the one being typed; "" for a
// new word) after the others, in the command tree of app.
func complete(app *cli.App, words []string) []string {
	if len(words) == 0 {
		words = []string{""}
	}
	cur := words[len(words)-1]
	cmds, flags := app.Commands, app.Flags
	for _, w := range words[:len(words)-1] {
		if strings.HasPrefix(w, "-") {
			continue
		}
		for _, c := range cmds {
			if c.HasName(w) {
				cmds, flags = c.Subcommands, c.Flags
				break
			}
		}
	}
	var out []string
	if strings.HasPrefix(cur, "-") {
		for _, f := range flags {
			for _, n := range f.Names() {
				opt := "--" + n
				if len(n) == 1 {
					opt = "-" + n
				}
				if strings.HasPrefix(opt, cur) {
					out = append(out, opt)
				}
			}
		}
		return out
	}
	for _, c := range cmds {
		if c.Hidden {
			continue
		}
		for _, n := range c.Names() {
			if strings.HasPrefix(n, cur) {
				out = append(out, n)
			}
		}
	}
	return out
}
