package ebpf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// A second driver on the same pin root is refused, naming the pin root and the pid that
// holds it; Close releases the lock.
func TestPinRootLock(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	d2, err := New(ctx, h.cfg.HostConfig, h.cfg.Options)
	if err == nil {
		d2.Close()
		t.Fatal("second driver on one pin root: no error")
	}
	want := fmt.Sprintf("pin root %s is locked by pid %d", h.cfg.PinRoot, os.Getpid())
	if !errors.Is(err, ErrPinRootBusy) || !strings.Contains(err.Error(), want) {
		t.Fatalf("second driver: %v; want ErrPinRootBusy and %q", err, want)
	}
	t.Logf("second New: %v", err)
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	h.d = h.start(t) // after Close the pin root is free again
}
