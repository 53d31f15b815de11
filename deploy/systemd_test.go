// Package deploy_test checks the files operators install from deploy/: the systemd units
// are valid for this systemd, restart their service on failure, and run binaries whose
// fatal configuration errors really exit non-zero.
package deploy_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/tools/sim"
)

func bins(t *testing.T) string {
	t.Helper()
	if pre := os.Getenv("CONTIVBPF_TEST_BIN"); pre != "" {
		return pre
	}
	root, err := sim.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := sim.Build(context.Background(), root, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestSystemdUnits(t *testing.T) {
	bin := bins(t)
	dir := t.TempDir()
	for _, name := range []string{"netmaster", "netplugin"} {
		unit, err := os.ReadFile(filepath.Join("systemd", name+".service"))
		if err != nil {
			t.Fatal(err)
		}
		text := string(unit)
		for _, want := range []string{"Restart=on-failure", "ExecStart=/usr/local/bin/" + name + " ", "KillSignal=SIGTERM"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s.service lacks %q", name, want)
			}
		}
		// Verify against the binary just built (the unit names the installed path).
		text = strings.ReplaceAll(text, "/usr/local/bin/"+name, filepath.Join(bin, name))
		if err := os.WriteFile(filepath.Join(dir, name+".service"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(filepath.Join(bin, name), "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "commit ") {
			t.Errorf("%s --version: %v %s", name, err, out)
		}
	}
	units, _ := filepath.Glob(filepath.Join(dir, "*.service"))
	out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// Restart=on-failure only helps if a fatal configuration error is a failure.
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"netplugin", []string{"--fwdmode", "sideways"}},
		{"netmaster", []string{"--listen-url", "127.0.0.1:1", "--etcd-endpoints", "http://127.0.0.1:1"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, filepath.Join(bin, tc.name), tc.args...).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() <= 0 {
			t.Errorf("%s %v: want a non-zero exit, got %v\n%s", tc.name, tc.args, err, out)
		}
	}
}
