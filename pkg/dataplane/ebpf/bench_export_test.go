//go:build cbbench

package ebpf

import "testing"

// MeasurePaths must time every path it names, each after checking the packet took it.
func TestMeasurePaths(t *testing.T) {
	requireRoot(t)
	costs, err := MeasurePaths(20000)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"noop": true, "noop-single": true, "local": true, "ref-forward": true, "arp-reply": true, "tunnel-encap": true,
		"tunnel-decap": true, "drop-unknown-dst": true, "vlan-push": true, "vlan-pop": true, "local-single": true,
		"stage-unknown-iface": true, "stage-not-ipv4": true, "service": true, "ct-established": true}
	for _, c := range costs {
		if c.NsPerPk <= 0 {
			t.Errorf("%s: %.1f ns", c.Name, c.NsPerPk)
		}
		// Every path's ratio has its own reference timing; the service path (it rewrites
		// its packet) is timed hot through the restoring copies.
		if c.RefNs <= 0 && c.Name != "ref-forward" && c.Program != "cb_bench_noop" {
			t.Errorf("%s: no reference timed around it", c.Name)
		}
		if (c.Name == "service") != (c.BaseNs > 0) {
			t.Errorf("%s: restored difference %.1f ns", c.Name, c.RestoredDiff)
		}
		delete(want, c.Name)
		t.Logf("%-18s %-18s %7.1f ns/packet single=%v", c.Name, c.Program, c.NsPerPk, c.Single)
	}
	if len(want) != 0 {
		t.Errorf("paths not measured: %v", want)
	}
}
