package ebpf

import (
	"testing"
)

// countIfaces counts the interface table's entries as the datapath sees them.
func countIfaces(t *testing.T, d *Driver) int {
	t.Helper()
	n := 0
	if err := d.ifaces().each(func(uint32, contivbpfCbIface) { n++ }); err != nil {
		t.Fatal(err)
	}
	return n
}
