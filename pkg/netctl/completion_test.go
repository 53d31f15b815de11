package netctl

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestShellCompletion sources `netctl completion bash` in a real bash and asks it to
// complete partial command lines, as a user pressing TAB would.
func TestShellCompletion(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash not found")
	}
	bin := os.Getenv("CONTIVBPF_TEST_BIN")
	if bin == "" {
		bin = t.TempDir()
		out, err := exec.Command("go", "build", "-o", bin, "github.com/contivbpf/contivbpf/cmd/netctl").CombinedOutput()
		if err != nil {
			t.Fatalf("build netctl: %v\n%s", err, out)
		}
	}
	var script strings.Builder
	if code := Run(context.Background(), []string{"netctl", "completion", "bash"}, &script, os.Stderr, BuildInfo{}); code != 0 {
		t.Fatalf("completion bash: exit %d", code)
	}
	file := filepath.Join(t.TempDir(), "netctl.bash")
	if err := os.WriteFile(file, []byte(script.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		line string // words typed so far; the last one is being completed
		want []string
	}{
		{"netctl ne", []string{"netprofile", "network"}},
		{"netctl network ", []string{"create", "inspect", "ls", "rm"}},
		{"netctl net create --sub", []string{"--subnet", "--subnetv6"}},
		{"netctl group create --", []string{"--policy", "--tenant"}},
	} {
		words := strings.Split(tc.line, " ")
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		cmd := exec.Command("bash", "-c", `source "$1"; COMP_WORDS=(`+strings.Join(quoted, " ")+`); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _netctl; printf '%s\n' "${COMPREPLY[@]}"`, "bash", file)
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.line, err, out)
		}
		got := strings.Fields(string(out))
		for _, w := range tc.want {
			found := false
			for _, g := range got {
				found = found || g == w
			}
			if !found {
				t.Errorf("completing %q: got %v, want %s among them", tc.line, got, w)
			}
		}
	}
	var errOut strings.Builder
	if code := Run(context.Background(), []string{"netctl", "completion", "fish"}, &strings.Builder{}, &errOut, BuildInfo{}); code == 0 || !strings.Contains(errOut.String(), "fish") {
		t.Fatalf("completion fish: exit %d, %q", code, errOut.String())
	}
}

// TestAgentURLs: every command that talks to a netplugin refuses a URL without a scheme
// before connecting anywhere (exit 1 with the flag named).
func TestAgentURLs(t *testing.T) {
	for _, args := range [][]string{
		{"bpf", "ct", "--agent", "127.0.0.1:9090"},
		{"monitor", "--agent", "http://127.0.0.1:9090", "--agent", "h2:9090"},
		{"verify", "--agent", "ftp://x"},
		{"trace", "--from", "a", "--to", "10.0.0.1", "--port", "1", "--agent", "x"},
	} {
		var out, errOut strings.Builder
		code := Run(context.Background(), append([]string{"netctl"}, args...), &out, &errOut, BuildInfo{})
		if code != ExitUsage || !strings.Contains(errOut.String(), "--agent") {
			t.Errorf("%v: exit %d %q", args, code, errOut.String())
		}
	}
}

// TestNetprofileBurstUnit: netctl's help names the unit the burst is enforced in
// (kilobits, docs/netprofiles.md), not kilobytes, eight times what is applied, and says a
// burst of 0 gets the dataplane's own default (OVS 250 ms, eBPF 200 ms), not one
// backend's figure.
func TestNetprofileBurstUnit(t *testing.T) {
	var out, errOut strings.Builder
	Run(context.Background(), []string{"netctl", "netprofile", "create", "--help"}, &out, &errOut, BuildInfo{})
	help := out.String() + errOut.String()
	if !strings.Contains(help, "kilobits") || strings.Contains(help, "kilobytes") {
		t.Errorf("netprofile create --help:\n%s", help)
	}
	if strings.Contains(help, " ms ") || !strings.Contains(help, "dataplane's default") {
		t.Errorf("netprofile create --help gives one backend's default burst:\n%s", help)
	}
}
