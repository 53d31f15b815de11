package retry

import (
	"context"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		w *= time.Millisecond
		got := b.Next()
		if got < w*8/10-time.Millisecond || got > w*12/10+time.Millisecond {
			t.Fatalf("wait %d: %v, want %v ±20%%", i, got, w)
		}
	}
	b.Reset()
	if got := b.Next(); got > 121*time.Millisecond {
		t.Fatalf("after Reset: %v", got)
	}
	// Jitter: two loops started together do not wait the same.
	same := 0
	for range 20 {
		if New(time.Second, time.Second).Next() == New(time.Second, time.Second).Next() {
			same++
		}
	}
	if same > 2 {
		t.Fatalf("%d of 20 pairs waited exactly the same", same)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if New(time.Hour, time.Hour).Wait(ctx) || time.Since(start) > time.Second {
		t.Fatal("Wait did not end with its context")
	}
}
