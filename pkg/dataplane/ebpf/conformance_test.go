package ebpf

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// pinnedFactory starts the suite's eBPF drivers: each simulated host pins its maps under
// /sys/fs/bpf/<the name of its namespace> (removed when the test that first started a
// driver for that host ends; a restart reuses them) and names its VXLAN device cbevx0.
func pinnedFactory() conformance.Factory { return pinnedFactoryWith(Options{}) }

// pinnedFactoryWith is pinnedFactory whose drivers start with opts (their pins and VXLAN
// device set as pinnedFactory's).
func pinnedFactoryWith(opts Options) conformance.Factory {
	var mu sync.Mutex
	roots := map[string]string{} // host namespace → pin root
	return func(t *testing.T, cfg dataplane.HostConfig) dataplane.Driver {
		t.Helper()
		mu.Lock()
		root, ok := roots[cfg.NetNS]
		if !ok {
			root = filepath.Join("/sys/fs/bpf", filepath.Base(cfg.NetNS))
			roots[cfg.NetNS] = root
			t.Cleanup(func() { _ = os.RemoveAll(root) })
		}
		mu.Unlock()
		o := opts
		o.PinRoot, o.VXLANIf = root, "cbevx0"
		d, err := New(context.Background(), cfg, o)
		if err != nil {
			t.Fatalf("new ebpf driver for %s: %v", cfg.Host, err)
		}
		return d
	}
}

func TestConformance(t *testing.T) {
	conformance.Run(t, pinnedFactory())
}

func TestConformanceRouting(t *testing.T) {
	conformance.RunRouting(t, pinnedFactory())
}

func TestConformanceAdversarial(t *testing.T) {
	conformance.RunAdversarial(t, pinnedFactory())
}

// TestConformanceMetadataAllowed: with EgressAllowMetadata (netplugin
// --egress-allow-metadata) a container reaches the metadata address beyond host 1, as the
// node; other link-local addresses stay refused. The default is the adversarial suite's
// metadata-unreachable.
func TestConformanceMetadataAllowed(t *testing.T) {
	conformance.RunEgressMetadataAllowed(t, pinnedFactoryWith(Options{EgressAllowMetadata: true}))
}

// TestConformanceOverlayXDP: the overlay's hand-made packets with the XDP prefilter on
// each host's wire (native, on the veth that holds the VTEP): spoofed inner sources and
// strangers' packets stay out, the legitimate ones beside them arrive.
func TestConformanceOverlayXDP(t *testing.T) {
	conformance.RunOverlayAdversarial(t, pinnedFactoryWith(Options{XDP: XDPNative}))
}
