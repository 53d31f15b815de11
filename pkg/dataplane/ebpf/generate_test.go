package ebpf_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedObjectsMatchSources rebuilds every bpf2go target of this package and of
// reffwd from bpf/*.c with the pinned clang into a temp dir and compares the objects and
// Go bindings byte for byte with the committed ones, so a change to bpf/ that was not
// regenerated (`make generate`) cannot ship stale programs.
func TestGeneratedObjectsMatchSources(t *testing.T) {
	if _, err := exec.LookPath("clang-14"); err != nil {
		t.Fatalf("clang-14 not found (make test installs it via scripts/deps.sh): %v", err)
	}
	for _, dir := range []string{".", "reffwd"} {
		src, err := os.ReadFile(filepath.Join(dir, "gen.go"))
		if err != nil {
			t.Fatal(err)
		}
		pkg := ""
		for _, line := range strings.Split(string(src), "\n") {
			if strings.HasPrefix(line, "package ") {
				pkg = strings.TrimSpace(strings.TrimPrefix(line, "package "))
			}
			cmdline, ok := strings.CutPrefix(line, "//go:generate ")
			if !ok {
				continue
			}
			args := splitWords(cmdline)
			if len(args) < 3 || args[0] != "go" || args[1] != "tool" || args[2] != "bpf2go" {
				t.Fatalf("%s: unexpected generate line %q", dir, cmdline)
			}
			out := t.TempDir()
			full := append([]string{"tool", "bpf2go", "-output-dir", out}, args[3:]...)
			cmd := exec.Command("go", full...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOPACKAGE="+pkg)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: bpf2go: %v\n%s", dir, err, b)
			}
			files, err := os.ReadDir(out)
			if err != nil || len(files) == 0 {
				t.Fatalf("%s: bpf2go wrote nothing (%v)", dir, err)
			}
			for _, f := range files {
				got, err := os.ReadFile(filepath.Join(out, f.Name()))
				if err != nil {
					t.Fatal(err)
				}
				want, err := os.ReadFile(filepath.Join(dir, f.Name()))
				if err != nil {
					t.Errorf("%s/%s: generated but not committed: %v", dir, f.Name(), err)
					continue
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s/%s differs from what bpf/ builds to: run `make generate` and commit", dir, f.Name())
				}
			}
		}
	}
}

// splitWords splits a go:generate line at spaces outside double quotes (enough for ours).
func splitWords(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, have = !quoted, true
		case r == ' ' && !quoted:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}
