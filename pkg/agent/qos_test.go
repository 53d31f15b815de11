package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// qosDriver refuses an endpoint whose egress rate is above maxRate (0: accepts all).
type qosDriver struct {
	failingDriver
	maxRate uint64
}

func (d *qosDriver) UpsertEndpoint(_ context.Context, ep dataplane.Endpoint) error {
	if d.maxRate != 0 && ep.QoS.EgressRate > d.maxRate {
		return fmt.Errorf("endpoint %s: rate %d beyond this switch's %d", ep.ID, ep.QoS.EgressRate, d.maxRate)
	}
	return nil
}

// TestGroupNetprofileReachesEndpoints: a group's netprofile (its state record) becomes the
// QoS of this host's endpoints of the group, follows a change of the profile in a scoped
// pass (a rewrite of the record's bookkeeping alone touches nothing), is combined with a
// pod's annotations (the stricter per direction), goes when detached, and a QoS the driver
// refuses makes /healthz fail naming the endpoint.
func TestGroupNetprofileReachesEndpoints(t *testing.T) {
	d := &qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}}
	a := testAgent(t, d, dataplane.FwdBridge)
	ctx := context.Background()
	r := a.rec
	for i, id := range []string{"n.t-a", "n.t-b"} {
		r.setEp(id, &model.CfgEndpointState{ID: id, NetID: "n.t", IPAddress: fmt.Sprintf("10.5.0.%d", i+2), HomingHost: "h0",
			EndpointGroupID: 3, EndpointGroupKey: "web:t"})
		r.setLocal(id, &LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: id, IntfName: "eth0", PortName: HostIfName(id)}, NetNS: "/run/netns/x"})
	}
	group := model.EndpointGroupState{ID: "web:t", GroupName: "web", TenantName: "t", EndpointGroupID: 3, Bandwidth: "10mbps", Burst: 800, DSCP: 46}
	putGroup := func(g model.EndpointGroupState) {
		b, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		a.put(model.EPGStatePrefix, model.EPGStateKey(g.ID), b)
	}
	putGroup(group)
	if errs := a.reconcile(ctx); len(errs) != 0 {
		t.Fatalf("first pass: %v", errs)
	}
	want := dataplane.QoS{EgressRate: 10e6, EgressBurst: 100_000, IngressRate: 10e6, IngressBurst: 100_000, DSCP: 46, SetDSCP: true}
	for _, id := range []string{"n.t-a", "n.t-b"} {
		if got := a.applied.Endpoints[id].QoS; got != want {
			t.Fatalf("%s: QoS %+v, want %+v", id, got, want)
		}
	}

	// netmaster rewrites the record for every endpoint it adds: nothing to do.
	group.EpCount = 2
	putGroup(group)
	if !a.rec.dirty.empty() {
		t.Fatalf("a bookkeeping rewrite of the group made the pass %+v", a.rec.dirty)
	}
	// The profile changes: a scoped pass over the group's endpoints applies it.
	group.Bandwidth, group.Burst, group.DSCP = "20mbps", 0, 0
	putGroup(group)
	if d := a.rec.dirty; d.all || len(d.eps) != 2 {
		t.Fatalf("a netprofile change made the pass %+v, want the group's two endpoints", d)
	}
	a.reconcile(ctx)
	want = dataplane.QoS{EgressRate: 20e6, IngressRate: 20e6} // (no burst: the backend's default)
	if got := a.applied.Endpoints["n.t-a"].QoS; got != want {
		t.Fatalf("after the change: QoS %+v, want %+v", got, want)
	}

	// A pod's annotations: the stricter per direction.
	l := r.local["n.t-b"]
	l.PodQoS = dataplane.QoS{EgressRate: 5e6, EgressBurst: 70_000}
	r.setLocal("n.t-b", &l)
	a.reconcile(ctx)
	want.EgressRate, want.EgressBurst = 5e6, 70_000
	if got := a.applied.Endpoints["n.t-b"].QoS; got != want {
		t.Fatalf("with the pod's 5M egress: QoS %+v, want %+v", got, want)
	}

	// A QoS the driver refuses: the endpoint fails /healthz by name.
	d.maxRate = 30e6
	group.Bandwidth = "40mbps"
	putGroup(group)
	errs := a.reconcile(ctx)
	if errs["endpoint/n.t-a"] == nil || !strings.Contains(errs["endpoint/n.t-a"].Error(), "beyond") {
		t.Fatalf("refused QoS not reported: %v", errs)
	}
	h := a.Handler(prometheus.NewRegistry(), nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"endpoint"`) {
		t.Fatalf("/healthz with a refused QoS: %d %s", rec.Code, rec.Body.String())
	}
	if got := a.Errors()["endpoint/n.t-a"]; !strings.Contains(got, "beyond") {
		t.Fatalf("Errors: %q", got)
	}

	// Detached: no limit (the pod's own stays); /healthz recovers.
	group.Bandwidth, group.DSCP, group.Burst = "", 0, 0
	putGroup(group)
	if errs := a.reconcile(ctx); len(errs) != 0 {
		t.Fatalf("after detaching: %v", errs)
	}
	if got := a.applied.Endpoints["n.t-a"].QoS; !got.IsZero() {
		t.Fatalf("detached: QoS %+v", got)
	}
	if got := a.applied.Endpoints["n.t-b"].QoS; got != l.PodQoS {
		t.Fatalf("detached: pod's QoS %+v, want %+v", got, l.PodQoS)
	}
	// A group record whose values cannot be read fails its endpoints (closed, reported).
	group.Bandwidth = "fast"
	putGroup(group)
	a.reconcile(ctx)
	if got := a.Errors()["endpoint/n.t-a"]; !strings.Contains(got, "bandwidth") {
		t.Fatalf("bad netprofile values: %q", got)
	}
	if _, ok := a.applied.Endpoints["n.t-a"]; ok {
		t.Fatal("an endpoint whose netprofile cannot be read is still applied (without its limit)")
	}
	// So does a group record that does not decode at all (its netprofile is unknown):
	// never taken for a group without one.
	group.Bandwidth = "10mbps"
	putGroup(group)
	if errs := a.reconcile(ctx); len(errs) != 0 {
		t.Fatalf("limited again: %v", errs)
	}
	a.put(model.EPGStatePrefix, model.EPGStateKey(group.ID), []byte(`{"groupName":"web","Bandwidth":5}`))
	a.reconcile(ctx)
	if got := a.Errors()["endpoint/n.t-a"]; !strings.Contains(got, "does not decode") {
		t.Fatalf("undecodable group record: endpoint error %q", got)
	}
	if ep, ok := a.applied.Endpoints["n.t-a"]; ok {
		t.Fatalf("an endpoint whose group record does not decode is applied with QoS %+v", ep.QoS)
	}
}

// fakePods answers labels and annotations from maps (the PodCache's interface).
type fakePods struct{ ann map[string]map[string]string }

func (f fakePods) PodLabels(context.Context, string, string) (map[string]string, error) {
	return map[string]string{}, nil
}
func (f fakePods) PodAnnotations(_ context.Context, ns, name string) (map[string]string, error) {
	a, ok := f.ann[ns+"/"+name]
	if !ok {
		return nil, fmt.Errorf("pod %s/%s not found", ns, name)
	}
	return a, nil
}

// TestPodQoSFromAnnotations: a pod's bandwidth annotations become its QoS (ingress: what it
// receives); a malformed one fails the CNI ADD naming the annotation, before anything is
// attached; a labeler without annotations leaves the pod unlimited.
func TestPodQoSFromAnnotations(t *testing.T) {
	pods := fakePods{ann: map[string]map[string]string{
		"prod/web":   {"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "1G"},
		"prod/bad":   {"kubernetes.io/egress-bandwidth": "lots"},
		"prod/plain": nil,
	}}
	ctx := context.Background()
	q, err := podQoS(ctx, pods, cniapi.PodRequest{Namespace: "prod", Name: "web"})
	if err != nil || q.IngressRate != 10e6 || q.EgressRate != 1e9 || q.IngressBurst != 0 || q.SetDSCP { // (burst 0: the backend's default)
		t.Fatalf("web: %+v, %v", q, err)
	}
	if q, err := podQoS(ctx, pods, cniapi.PodRequest{Namespace: "prod", Name: "plain"}); err != nil || !q.IsZero() {
		t.Fatalf("plain: %+v, %v", q, err)
	}
	if _, err := podQoS(ctx, pods, cniapi.PodRequest{Namespace: "prod", Name: "bad"}); err == nil ||
		!strings.Contains(err.Error(), "kubernetes.io/egress-bandwidth") {
		t.Fatalf("bad annotation: %v", err)
	}
	b := cniBackend{&Agent{cfg: Config{Pods: pods}, ready: make(chan struct{})}}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := b.AddPod(actx, cniapi.PodRequest{Name: "bad", Namespace: "prod", InfraContainerID: "x"}); err == nil ||
		!strings.Contains(err.Error(), "egress-bandwidth") {
		t.Fatalf("AddPod with a bad annotation: %v", err)
	}
	if q, err := podQoS(ctx, labelsOnly{}, cniapi.PodRequest{Namespace: "prod", Name: "web"}); err != nil || !q.IsZero() {
		t.Fatalf("labeler without annotations: %+v, %v", q, err)
	}
}

type labelsOnly struct{}

func (labelsOnly) PodLabels(context.Context, string, string) (map[string]string, error) {
	return map[string]string{}, nil
}

// allOrNothingDriver refuses a whole Sync when one endpoint's QoS is beyond maxRate, as
// the OVS driver's full install does when vswitchd refuses one meter (the bundle of
// flows using it cannot be installed).
type allOrNothingDriver struct{ qosDriver }

func (d *allOrNothingDriver) Sync(ctx context.Context, s dataplane.State) error {
	for _, ep := range s.Endpoints {
		if err := d.UpsertEndpoint(ctx, ep); err != nil {
			return fmt.Errorf("install: %w", err)
		}
	}
	return nil
}

// TestRefusedQoSFailsOnlyItsEndpoint: a QoS the backend refuses in the first full Sync
// (which it refuses whole) fails that endpoint alone: the others are applied with
// theirs, /healthz names only the refused endpoint, and it is applied once its QoS is one
// the backend takes.
func TestRefusedQoSFailsOnlyItsEndpoint(t *testing.T) {
	d := &allOrNothingDriver{qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}, maxRate: 30e6}}
	a := testAgent(t, d, dataplane.FwdBridge)
	ctx := context.Background()
	qos := map[string]dataplane.QoS{"n.t-a": {EgressRate: 10e6}, "n.t-b": {EgressRate: 40e6}, "n.t-c": {}}
	for i, id := range []string{"n.t-a", "n.t-b", "n.t-c"} {
		a.rec.setEp(id, &model.CfgEndpointState{ID: id, NetID: "n.t", IPAddress: fmt.Sprintf("10.5.0.%d", i+2), HomingHost: "h0"})
		a.rec.setLocal(id, &LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: id, IntfName: "eth0", PortName: HostIfName(id)},
			NetNS: "/run/netns/x", PodQoS: qos[id]})
	}
	errs := a.reconcile(ctx)
	if len(errs) != 1 || errs["endpoint/n.t-b"] == nil || !strings.Contains(errs["endpoint/n.t-b"].Error(), "beyond") {
		t.Fatalf("errors %v, want endpoint/n.t-b alone", errs)
	}
	for _, id := range []string{"n.t-a", "n.t-c"} {
		if got, ok := a.applied.Endpoints[id]; !ok || got.QoS != qos[id] {
			t.Errorf("%s: applied %v with QoS %+v, want %+v", id, ok, got.QoS, qos[id])
		}
	}
	if _, ok := a.applied.Endpoints["n.t-b"]; ok {
		t.Error("the refused endpoint is applied")
	}
	rec := httptest.NewRecorder()
	a.Handler(prometheus.NewRegistry(), nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	// (/healthz counts failures by kind for anyone; the names are for the inspect API.)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(strings.Join(strings.Fields(rec.Body.String()), ""), `"failing":{"endpoint":1}`) {
		t.Fatalf("/healthz: %d %s, want 503 with one failing endpoint", rec.Code, rec.Body.String())
	}
	if got := a.Errors(); len(got) != 1 || !strings.Contains(got["endpoint/n.t-b"], "beyond") {
		t.Fatalf("errors %v, want endpoint/n.t-b alone", got)
	}
	l := a.rec.local["n.t-b"]
	l.PodQoS = dataplane.QoS{EgressRate: 20e6}
	a.rec.setLocal("n.t-b", &l)
	if errs := a.reconcile(ctx); len(errs) != 0 || a.applied.Endpoints["n.t-b"].QoS != l.PodQoS {
		t.Fatalf("after the fix: errors %v, QoS %+v", errs, a.applied.Endpoints["n.t-b"].QoS)
	}
	if got := a.Errors(); len(got) != 0 {
		t.Fatalf("/healthz errors after the fix: %v", got)
	}
}
