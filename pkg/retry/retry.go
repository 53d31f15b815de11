// Package retry owns how this project waits between attempts: exponential backoff with
// jitter (github.com/cenkalti/backoff/v5: each wait is the current interval ±20 %, the
// interval doubles up to a cap) and a wait that ends with its context. Every retry loop
// uses it, so no two components retry in lockstep after a shared failure (an etcd leader
// change, netmaster restarting).
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff is one retry loop's state. Not safe for concurrent use.
type Backoff struct {
	b *backoff.ExponentialBackOff
}

// New starts at initial and grows to at most max (both > 0).
func New(initial, max time.Duration) *Backoff {
	b := &backoff.ExponentialBackOff{InitialInterval: initial, MaxInterval: max, Multiplier: 2, RandomizationFactor: 0.2}
	b.Reset()
	return &Backoff{b: b}
}

// Next is the wait before the next attempt (and grows the interval).
func (b *Backoff) Next() time.Duration { return b.b.NextBackOff() }

// Reset starts over at the initial interval (after a success).
func (b *Backoff) Reset() { b.b.Reset() }

// Wait sleeps Next(); false if ctx ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
