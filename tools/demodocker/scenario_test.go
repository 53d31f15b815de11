package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/testroot"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// TestDockerTwoHosts runs the Docker walkthrough with the extra checks on two simulated
// hosts with private dockerds: network sync, IPAM through netmaster, MAC/MTU/gateway,
// ping across hosts, address release on removal, docker-created network adoption.
func TestDockerTwoHosts(t *testing.T) {
	testroot.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := sim.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("CONTIVBPF_TEST_BIN") // prebuilt netmaster, netplugin, netctl
	if bin == "" {
		bin = t.TempDir()
		if err := sim.Build(ctx, root, bin); err != nil {
			t.Fatal(err)
		}
	}
	if err := Walkthrough(ctx, Options{BinDir: bin, Out: testWriter{t}, Extra: true}); err != nil {
		t.Fatal(err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
