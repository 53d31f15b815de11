package nsexec

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

func TestRun(t *testing.T) {
	testroot.Need(t)
	name := fmt.Sprintf("cbnsexec-%d", os.Getpid())
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	err = Run("/proc/self/ns/net", func() error { return nil }) // own namespace by path
	if err != nil {
		t.Fatal(err)
	}
	// A new namespace (created on a thread of its own): fn sees it.
	err = Run("", func() error {
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		if err != nil {
			return err // the thread stays locked and dies with the test's goroutine
		}
		h.Close()
		if err := netns.Set(orig); err != nil {
			return err
		}
		runtime.UnlockOSThread()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer netns.DeleteNamed(name)
	var inside netns.NsHandle
	want := errors.New("fn's error")
	err = Run("/run/netns/"+name, func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		inside = cur
		return want
	})
	if !errors.Is(err, want) {
		t.Fatalf("Run returned %v, want fn's error", err)
	}
	defer inside.Close()
	if inside.Equal(orig) {
		t.Fatal("fn ran in the caller's namespace")
	}
	if err := Run("/run/netns/cbnsexec-does-not-exist", func() error { return nil }); err == nil {
		t.Fatal("a missing namespace was entered")
	}
	called := false
	if err := Run("", func() error { called = true; return nil }); err != nil || !called {
		t.Fatal("empty path: fn not called directly")
	}
}
