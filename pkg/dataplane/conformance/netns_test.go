package conformance

import (
	"testing"

	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestFreePrefixSkipsHeld: a prefix a namespace already starts with (another test's, in a
// package running in parallel) is drawn again.
func TestFreePrefixSkipsHeld(t *testing.T) {
	testroot.Need(t)
	held := Prefix()
	NewNetNS(t, held+"-h1")
	draws := []string{held, held, held + "x"}
	i := 0
	got := freePrefix(func() string { p := draws[i]; i++; return p })
	if got != held+"x" || i != 3 {
		t.Fatalf("freePrefix returned %q after %d draws, want %q after 3", got, i, held+"x")
	}
}
