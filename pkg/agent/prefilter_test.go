package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// denyDriver records the deny lists it is given (and refuses them while fail is set).
type denyDriver struct {
	failingDriver
	lists [][]netip.Prefix
	fail  bool
}

func (d *denyDriver) SetDenySources(_ context.Context, p []netip.Prefix) error {
	if d.fail {
		return errors.New("map full")
	}
	d.lists = append(d.lists, append([]netip.Prefix{}, p...))
	return nil
}

// The agent gives the driver this host's deny list (every host's entries and its own, any
// spelling of its name; not another host's), once per change: a pass with nothing new
// calls nothing; a record that does not check is reported and left out; a refused list is
// reported and given again by the next pass; a record garbled around netmaster keeps the
// entry it replaced (fail closed); a driver without a prefilter gets nothing
// and the list is reported as not applied.
func TestDenyListReachesDriver(t *testing.T) {
	d := &denyDriver{failingDriver: failingDriver{fail: map[string]bool{}}}
	a := testAgent(t, d, dataplane.FwdBridge)
	ctx := context.Background()
	put := func(p model.Prefilter) {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		a.put(model.PrefilterPrefix, model.PrefilterKey(p.Name), b)
	}
	last := func() []string {
		t.Helper()
		if len(d.lists) == 0 {
			return nil
		}
		var out []string
		for _, p := range d.lists[len(d.lists)-1] {
			out = append(out, p.String())
		}
		return out
	}
	put(model.Prefilter{Name: "all", CIDR: "203.0.113.0/24"})
	put(model.Prefilter{Name: "mine", CIDR: "192.0.2.5/32", Host: "H0"})
	put(model.Prefilter{Name: "theirs", CIDR: "198.51.100.0/24", Host: "h1"})
	put(model.Prefilter{Name: "again", CIDR: "203.0.113.0/24"})
	put(model.Prefilter{Name: "bad", CIDR: "0.0.0.0/0"})
	errs := a.reconcile(ctx)
	if got := last(); !slices.Equal(got, []string{"192.0.2.5/32", "203.0.113.0/24"}) || len(d.lists) != 1 {
		t.Fatalf("lists %v, last %v: want [192.0.2.5/32 203.0.113.0/24] once", d.lists, got)
	}
	if e := a.Errors()["prefilter/bad"]; !strings.Contains(e, "cidr") {
		t.Errorf("errors %v (pass %v): want prefilter/bad reported", a.Errors(), errs)
	}
	a.reconcile(ctx)
	if len(d.lists) != 1 {
		t.Errorf("a pass with nothing new gave the list again: %v", d.lists)
	}
	d.fail = true
	put(model.Prefilter{Name: "more", CIDR: "100.64.0.0/10"})
	a.reconcile(ctx)
	if e := a.Errors()[denyListKey]; !strings.Contains(e, "map full") {
		t.Errorf("refused list: errors %v, want %s reported", a.Errors(), denyListKey)
	}
	d.fail = false
	a.reconcile(ctx)
	if got := last(); !slices.Equal(got, []string{"100.64.0.0/10", "192.0.2.5/32", "203.0.113.0/24"}) {
		t.Errorf("after the refusal: %v, want the list with 100.64.0.0/10", got)
	}
	if _, bad := a.Errors()[denyListKey]; bad {
		t.Errorf("errors %v after the list was taken", a.Errors())
	}
	// A record garbled around netmaster keeps the entry it replaced in force (fail
	// closed), reported; fixed, it is taken again.
	a.put(model.PrefilterPrefix, model.PrefilterKey("more"), []byte("{"))
	a.reconcile(ctx)
	if got := last(); !slices.Contains(got, "100.64.0.0/10") {
		t.Errorf("after a garbled record: %v, want 100.64.0.0/10 still denied", got)
	}
	if e := a.Errors()["prefilter/more"]; !strings.Contains(e, "decode") {
		t.Errorf("garbled record: errors %v, want prefilter/more reported", a.Errors())
	}
	put(model.Prefilter{Name: "more", CIDR: "100.64.0.0/10"})
	a.reconcile(ctx)
	if _, bad := a.Errors()["prefilter/more"]; bad {
		t.Errorf("errors %v after the record was fixed", a.Errors())
	}
	a.applyEvent(model.PrefilterPrefix, state.Event{Type: state.EventDelete, Key: model.PrefilterKey("all")})
	a.applyEvent(model.PrefilterPrefix, state.Event{Type: state.EventDelete, Key: model.PrefilterKey("again")})
	a.reconcile(ctx)
	if got := last(); !slices.Equal(got, []string{"100.64.0.0/10", "192.0.2.5/32"}) {
		t.Errorf("after deletes: %v", got)
	}

	// A driver without a prefilter.
	b := testAgent(t, &failingDriver{fail: map[string]bool{}}, dataplane.FwdBridge)
	raw, _ := json.Marshal(model.Prefilter{Name: "all", CIDR: "203.0.113.0/24"})
	b.put(model.PrefilterPrefix, model.PrefilterKey("all"), raw)
	b.reconcile(ctx)
	if e := b.Errors()[denyListKey]; !strings.Contains(e, "not applied") {
		t.Errorf("no prefilter: errors %v, want the list reported not applied", b.Errors())
	}
}

// A deny list entry that holds a peer host's VTEP cuts the overlay from that host here
// (every overlay packet it sends is drop_denied_source). Netmaster refuses such an entry
// for the hosts it knows, but a host that joins later, or whose VTEP record changes, lands
// inside an existing one: the agent keeps enforcing the entry (the operator's list wins)
// and reports it under prefilter/<entry>, naming the host and its VTEP, for as long as it
// holds; its own VTEP and entries for other hosts are no such cut.
func TestDenyListHoldingAPeerVTEP(t *testing.T) {
	d := &denyDriver{failingDriver: failingDriver{fail: map[string]bool{}}}
	a := testAgent(t, d, dataplane.FwdBridge)
	ctx := context.Background()
	put := func(prefix, key string, v any) {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		a.put(prefix, key, b)
	}
	put(model.PrefilterPrefix, model.PrefilterKey("wide"), model.Prefilter{Name: "wide", CIDR: "10.254.0.0/16"})
	put(model.PrefilterPrefix, model.PrefilterKey("elsewhere"), model.Prefilter{Name: "elsewhere", CIDR: "10.9.0.0/16", Host: "h1"})
	put(vxlan.HostVTEPPrefix, vxlan.HostVTEPKey(a.cfg.Host), vxlan.HostVTEP{Host: a.cfg.Host, VTEP: "10.254.0.1"})
	put(vxlan.HostVTEPPrefix, vxlan.HostVTEPKey("h1"), vxlan.HostVTEP{Host: "h1", VTEP: "10.9.0.2"})
	a.reconcile(ctx)
	if e, ok := a.Errors()["prefilter/wide"]; ok {
		t.Fatalf("only this host's own VTEP in the entry: reported %q", e)
	}
	// h3 joins with its VTEP inside "wide".
	put(vxlan.HostVTEPPrefix, vxlan.HostVTEPKey("h3"), vxlan.HostVTEP{Host: "h3", VTEP: "10.254.0.3"})
	a.reconcile(ctx)
	if e := a.Errors()["prefilter/wide"]; !strings.Contains(e, "10.254.0.3") || !strings.Contains(e, "h3") {
		t.Errorf("errors %v: want prefilter/wide naming h3 and 10.254.0.3", a.Errors())
	}
	if got := d.lists[len(d.lists)-1]; !slices.Contains(got, netip.MustParsePrefix("10.254.0.0/16")) {
		t.Errorf("deny list %v: want the entry still enforced", got)
	}
	// Its VTEP moves out: the report goes.
	put(vxlan.HostVTEPPrefix, vxlan.HostVTEPKey("h3"), vxlan.HostVTEP{Host: "h3", VTEP: "10.253.0.3"})
	a.reconcile(ctx)
	if e, ok := a.Errors()["prefilter/wide"]; ok {
		t.Errorf("h3's VTEP moved out of the entry: still reported %q", e)
	}
}
