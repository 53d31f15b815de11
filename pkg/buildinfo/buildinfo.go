// Package buildinfo owns what every binary says about its own build: a version from
// `git describe` that `make build` stamps in with -ldflags, and the commit, commit time and
// dirty flag Go records from the repository at build time. A binary built without the
// Makefile still names its commit ("dev-<commit>").
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Set by the linker: -X github.com/contivbpf/contivbpf/pkg/buildinfo.version=... (and
// .gitCommit, .buildTime; the Makefile sets all three, since GOFLAGS=-buildvcs=false
// leaves Go's own record empty). Constants in all but name: nothing assigns them at run
// time.
var (
	version   string
	gitCommit string
	buildTime string
)

// Info is a binary's build, in Contiv's /version field names.
type Info struct {
	Version   string
	GitCommit string
	BuildTime string
	GoVersion string
}

// Get returns this binary's build information.
func Get() Info {
	i := Info{Version: version, GitCommit: gitCommit, BuildTime: buildTime}
	if bi, ok := debug.ReadBuildInfo(); ok {
		i.GoVersion = bi.GoVersion
		modified, vcsTime := false, ""
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.GitCommit == "" {
					i.GitCommit = s.Value
				}
			case "vcs.time":
				vcsTime = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && gitCommit == "" && i.GitCommit != "" {
			i.GitCommit += "-dirty"
		}
		if i.BuildTime == "" {
			i.BuildTime = vcsTime
		}
	}
	if i.BuildTime == "" {
		i.BuildTime = "unknown"
	}
	if i.GitCommit == "" {
		i.GitCommit = "unknown"
	}
	if i.Version == "" {
		i.Version = "dev"
		if c := strings.TrimSuffix(i.GitCommit, "-dirty"); len(c) >= 12 {
			i.Version = "dev-" + c[:12]
		}
	}
	return i
}

// String is the one-line form printed by --version.
func (i Info) String() string {
	return i.Version + " (commit " + i.GitCommit + ", built " + i.BuildTime + ", " + i.GoVersion + ")"
}
