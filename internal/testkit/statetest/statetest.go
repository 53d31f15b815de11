// Package statetest gives tests a real, private etcd: an embedded server on free loopback
// ports with its data in the test's temp dir, and a Store connected to it.
package statetest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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

// PutBytes sums the key and value sizes of every put under prefix in revisions (from, to],
// read back from etcd's watch history: what a change cost in etcd bytes.
func PutBytes(ctx context.Context, cli *clientv3.Client, prefix string, from, to int64) (int, error) {
	puts, err := Puts(ctx, cli, prefix, from, to)
	total := 0
	for _, p := range puts {
		total += p.Bytes
	}
	return total, err
}

// Put is one put read back from etcd's history: its key, its size (key and value) and
// the revision it was made at.
type Put struct {
	Key   string
	Bytes int
	Rev   int64
}

// Puts lists the puts under prefix in revisions (from, to], in revision order. Every put
// of revision to is included (one transaction writes all its keys at one revision, and etcd
// never splits a revision across watch responses).
func Puts(ctx context.Context, cli *clientv3.Client, prefix string, from, to int64) ([]Put, error) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if to <= from {
		return nil, nil
	}
	var out []Put
	for wr := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		if err := wr.Err(); err != nil {
			return nil, err
		}
		done := false
		for _, ev := range wr.Events {
			if ev.Kv.ModRevision > to {
				done = true
				break
			}
			if ev.Type == clientv3.EventTypePut {
				out = append(out, Put{Key: string(ev.Kv.Key), Bytes: len(ev.Kv.Key) + len(ev.Kv.Value), Rev: ev.Kv.ModRevision})
			}
			done = done || ev.Kv.ModRevision == to
		}
		if done {
			return out, nil
		}
	}
	return nil, fmt.Errorf("watch of revisions %d..%d ended early: %w", from, to, wctx.Err())
}
