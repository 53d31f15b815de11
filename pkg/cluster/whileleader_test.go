package cluster

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunWhileLeader: one run per leadership term, cancelled when the term ends, never two
// at once, and none after shutdown.
func TestRunWhileLeader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan bool, 1)
	var running, starts, overlap atomic.Int32
	done := make(chan struct{})
	go func() {
		runWhileLeader(ctx, changes, func(ctx context.Context) {
			if running.Add(1) > 1 {
				overlap.Add(1)
			}
			starts.Add(1)
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond) // a slow stop must finish before the next term
			running.Add(-1)
		})
		close(done)
	}()
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	changes <- true
	wait("first term started", func() bool { return starts.Load() == 1 })
	changes <- true // repeated "leader": no second run
	changes <- false
	wait("first term stopped", func() bool { return running.Load() == 0 })
	changes <- true
	wait("second term started", func() bool { return starts.Load() == 2 })
	cancel()
	<-done
	if running.Load() != 0 || overlap.Load() != 0 || starts.Load() != 2 {
		t.Fatalf("running %d overlap %d starts %d", running.Load(), overlap.Load(), starts.Load())
	}
}
