package buildinfo

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestStampedBuild builds a tiny program the way `make build` builds the binaries and
// checks that the version and build time given with -ldflags come back, and that without
// them the version still names the commit.
func TestStampedBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	dir := t.TempDir()
	main := filepath.Join(dir, "main.go")
	if err := os.WriteFile(main, []byte("package main\n\nimport (\n\t\"fmt\"\n\n\t\"github.com/contivbpf/contivbpf/pkg/buildinfo\"\n)\n\nfunc main() { fmt.Println(buildinfo.Get()) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(ldflags string) string {
		t.Helper()
		bin := filepath.Join(dir, "prog")
		args := []string{"build", "-o", bin}
		if ldflags != "" {
			args = append(args, "-ldflags", ldflags)
		}
		cmd := exec.Command("go", append(args, main)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	const pkg = "github.com/contivbpf/contivbpf/pkg/buildinfo"
	got := build("-X " + pkg + ".version=v9.8.7-3-gabc -X " + pkg + ".gitCommit=0123456789abcdef -X " + pkg + ".buildTime=2026-11-24T07:00:00Z")
	if got != "v9.8.7-3-gabc (commit 0123456789abcdef, built 2026-11-24T07:00:00Z, "+runtime.Version()+")" {
		t.Fatalf("stamped build says %q", got)
	}
	if got := build(""); !strings.HasPrefix(got, "dev (commit unknown, built unknown") {
		t.Fatalf("unstamped build says %q", got)
	}
}
