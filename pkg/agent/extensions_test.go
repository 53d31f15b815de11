package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// extDriver has every extension pkg/dataplane declares beyond Driver, with exactly those
// signatures, and records which the agent called. Its embedded Driver is nil: the
// routes under test call nothing else of it but Name.
type extDriver struct {
	dataplane.Driver
	mu     sync.Mutex
	called []string
}

var (
	_ dataplane.Lister        = (*extDriver)(nil)
	_ dataplane.CounterReader = (*extDriver)(nil)
	_ dataplane.EventSource   = (*extDriver)(nil)
	_ dataplane.Verifier      = (*extDriver)(nil)
	_ dataplane.Tracer        = (*extDriver)(nil)
	_ dataplane.NativeRouter  = (*extDriver)(nil)
)

func (d *extDriver) call(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.called = append(d.called, name)
}

func (d *extDriver) wasCalled(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.called, name)
}

func (d *extDriver) Name() string { return "ext" }

func (d *extDriver) Listing(q dataplane.ListQuery) (dataplane.Listing, error) {
	d.call("Listing")
	return dataplane.Listing{Kind: q.Kind}, nil
}

func (d *extDriver) Counters(context.Context) (map[string]float64, error) {
	d.call("Counters")
	return map[string]float64{"ext_counter": 1}, nil
}

func (d *extDriver) MonitorEvents(context.Context) (<-chan dataplane.MonitorEvent, error) {
	d.call("MonitorEvents")
	return make(chan dataplane.MonitorEvent), nil
}

func (d *extDriver) SetAllowEvents(bool) error { d.call("SetAllowEvents"); return nil }

func (d *extDriver) Verify(dataplane.State) ([]dataplane.Drift, error) {
	d.call("Verify")
	return nil, nil
}

func (d *extDriver) Trace(dataplane.TraceRequest) (dataplane.TraceResult, error) {
	d.call("Trace")
	return dataplane.TraceResult{}, nil
}

func (d *extDriver) TraceReceive(dataplane.TraceTunnel) (dataplane.TraceResult, error) {
	d.call("TraceReceive")
	return dataplane.TraceResult{Verdict: "delivered"}, nil
}

func (d *extDriver) SetNativeRouting(context.Context, dataplane.NativeRouting) error {
	d.call("SetNativeRouting")
	return nil
}

func (d *extDriver) NativeRoutes() ([]dataplane.Route, error) {
	d.call("NativeRoutes")
	return nil, nil
}

// TestExtensionsReached: a driver with the extensions as pkg/dataplane declares them is
// served on every agent route that uses one (none answers 501 or leaves it out). It fails
// when the agent asserts a driver to an interface of its own whose signature drifted from
// the backends' (the backends assert pkg/dataplane's at compile time).
func TestExtensionsReached(t *testing.T) {
	d := &extDriver{}
	a := &Agent{cfg: Config{Driver: d, Host: "h", InspectOpen: true}, driver: d, metrics: newMetrics(), rec: newRecords(),
		errs: map[string]error{}, applied: dataplane.NewIndex(), bad: map[string]error{}}
	h := a.Handler(prometheus.NewRegistry(), nil)
	for _, c := range []struct {
		method, path, body string
		want               string // the driver method the route must reach
	}{
		{http.MethodGet, "/inspect/bpf/ct", "", "Listing"},
		{http.MethodGet, "/inspect/verify", "", "Verify"},
		{http.MethodPost, "/inspect/trace-receive", "{}", "TraceReceive"},
		{http.MethodGet, "/metrics", "", "Counters"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader(c.body)))
		if rec.Code != http.StatusOK || !d.wasCalled(c.want) {
			t.Errorf("%s %s: %d %q, %s called: %v", c.method, c.path, rec.Code, strings.TrimSpace(rec.Body.String()), c.want, d.wasCalled(c.want))
		}
	}
	if _, err := a.monitor(); err != nil {
		t.Errorf("monitor: %v", err)
	}
	if _, ok := a.driver.(dataplane.NativeRouter); !ok {
		t.Error("the driver is no dataplane.NativeRouter")
	}

	// Without the extensions the same routes say so.
	p := &Agent{cfg: Config{Driver: struct{ dataplane.Driver }{}}}
	rec := httptest.NewRecorder()
	p.serveTraceReceive(rec, httptest.NewRequest(http.MethodPost, "/inspect/trace-receive", strings.NewReader("{}")))
	if rec.Code != http.StatusNotImplemented {
		t.Errorf("trace-receive without a tracer: %d %s", rec.Code, rec.Body)
	}
	if _, err := p.monitor(); err == nil {
		t.Error("monitor without an event source: no error")
	}
}
