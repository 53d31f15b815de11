package ebpf

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/conformance"
)

// TestStagesOutliveTheAgent: the kernel empties a program array when its last pin and
// file go, and an entry program then drops what it hands to a stage (drop_no_stage). The
// driver pins each load's array (calls/), so new flows, which take the full stage, keep
// passing while no agent runs and after a restart (which replaces the pin once every link
// runs its programs). Without the pin they stop: the test removes it to show that.
func TestStagesOutliveTheAgent(t *testing.T) {
	h := newOneHost(t)
	ctx := context.Background()
	a := h.endpoint(t, "a", "10.50.0.2", true)
	b := h.endpoint(t, "b", "10.50.0.3", true)
	a.EPGID, b.EPGID = 11, 12
	// A group with rules: every new flow is judged by the full stage.
	state := dataplane.State{Networks: []dataplane.Network{h.net}, Endpoints: []dataplane.Endpoint{a, b},
		Policies: []dataplane.PolicySet{{EPGID: 12, Rules: []dataplane.PolicyRule{
			{ID: "deny-9997", Priority: 5, Ingress: true, Proto: 17, Port: 9997, Action: dataplane.ActionDeny}}}}}
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	pins := func() []string {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(h.cfg.PinRoot, callsDir))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	first := pins()
	if len(first) != 1 {
		t.Fatalf("stage array pins %v, want one", first)
	}
	conformance.PingOK(t, a.NetNS, b.IP.String(), 3)
	// No agent.
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	conformance.PingOK(t, a.NetNS, b.IP.String(), 3)
	// A restart: its own array, the earlier one unpinned once the links run its programs.
	h.d = h.start(t)
	if err := h.d.Sync(ctx, state); err != nil {
		t.Fatal(err)
	}
	if now := pins(); len(now) != 1 || now[0] == first[0] {
		t.Errorf("stage array pins after a restart %v (before %v), want one new one", now, first)
	}
	conformance.PingOK(t, a.NetNS, b.IP.String(), 3)
	rc, err := h.d.ReasonCounters()
	if err != nil {
		t.Fatal(err)
	}
	if n := rc[DropNoStage].Packets; n != 0 {
		t.Errorf("%d packets found no stage", n)
	}
	// The control: without the pin, once the agent is gone, new flows find no stage.
	if err := os.RemoveAll(filepath.Join(h.cfg.PinRoot, callsDir)); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Close(); err != nil {
		t.Fatal(err)
	}
	conformance.PingFails(t, a.NetNS, b.IP.String())
}
