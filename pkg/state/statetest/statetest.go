// Package statetest gives tests a real, private etcd: an embedded server on free loopback
// ports with its data in the test's temp dir, and a Store connected to it.
package statetest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Etcd starts a private embedded etcd and returns its client URL. It stops at test end.
func Etcd(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var lastErr error
	for i := 0; i < 5; i++ {
		cu := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
		pu := fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
		srv, err := etcdembed.Start(ctx, etcdembed.Config{DataDir: t.TempDir(), ClientURL: cu, PeerURL: pu})
		if err != nil {
			lastErr = err
			continue
		}
		t.Cleanup(srv.Close)
		return cu
	}
	t.Fatalf("start test etcd: %v", lastErr)
	return ""
}

// Store starts a private etcd and returns a connected Store, closed at test end.
func Store(t testing.TB) (*state.Store, string) {
	t.Helper()
	url := Etcd(t)
	s, err := state.Open(context.Background(), []string{url})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, url
}
