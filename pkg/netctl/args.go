package netctl

import (
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// ReorderArgs moves a leaf command's flags in front of its positional arguments, so that both
// `netctl net create -s 10.1.1.0/24 web` and `netctl net create web -s 10.1.1.0/24` work
// (urfave/cli v2 stops parsing flags at the first positional argument; Contiv's cli v1
// reordered them). Everything after "--" stays positional and in order.
func ReorderArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	i := 1
	// Global flags, then the command path.
	flags := app.Flags
	cmds := app.Commands
	var leaf *cli.Command
	for i < len(args) {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if isFlag(a) {
			out = append(out, a)
			if takesValue(flags, a) && !strings.Contains(a, "=") && i+1 < len(args) {
				out = append(out, args[i+1])
				i++
			}
			i++
			continue
		}
		cmd := findCommand(cmds, a)
		if cmd == nil {
			break
		}
		out = append(out, a)
		i++
		leaf = cmd
		flags = cmd.Flags
		cmds = cmd.Subcommands
		if len(cmds) == 0 {
			break
		}
	}
	if leaf == nil || len(leaf.Subcommands) > 0 {
		return append(out, args[i:]...)
	}
	var fl, pos []string
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !isFlag(a) {
			pos = append(pos, a)
			continue
		}
		fl = append(fl, canonicalSliceFlag(flags, a))
		if takesValue(flags, a) && !strings.Contains(a, "=") && i+1 < len(args) {
			fl = append(fl, args[i+1])
			i++
		}
	}
	out = append(out, fl...)
	if len(pos) > 0 {
		// "--" keeps a positional that starts with '-' from being read as a flag.
		for _, p := range pos {
			if strings.HasPrefix(p, "-") {
				out = append(out, "--")
				break
			}
		}
		out = append(out, pos...)
	}
	return out
}

func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' }

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue reports whether the flag named by arg (-x, --xx, -x=v) expects a value.
// Unknown flags are treated as booleans; the parser reports them.
func takesValue(flags []cli.Flag, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if k := strings.IndexByte(name, '='); k >= 0 {
		name = name[:k]
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				if dg, ok := f.(cli.DocGenerationFlag); ok {
					return dg.TakesValue()
				}
				return false
			}
		}
	}
	return false
}

// canonicalSliceFlag rewrites an alias of a repeatable flag to its main name: urfave/cli
// refuses "-p a --policy b" ("two forms of the same flag"), Contiv's cli accepted it.
func canonicalSliceFlag(flags []cli.Flag, arg string) string {
	name := strings.TrimLeft(arg, "-")
	value := ""
	if k := strings.IndexByte(name, '='); k >= 0 {
		name, value = name[:k], name[k:]
	}
	for _, f := range flags {
		if _, ok := f.(*cli.StringSliceFlag); !ok {
			continue
		}
		names := f.Names()
		for _, n := range names[1:] {
			if n == name {
				return "--" + names[0] + value
			}
		}
	}
	return arg
}

func sortCommands(cmds []*cli.Command) {
	sort.SliceStable(cmds, func(i, j int) bool { return cmds[i].Name < cmds[j].Name })
}
