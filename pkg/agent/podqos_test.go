package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/contivbpf/contivbpf/internal/testkit/k8stest"
	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/netprofile"
)

// recordingMaster keeps the local endpoint records the agent writes; the first fail
// writes fail, and every write of endpoint refuse. calls counts the writes asked for.
type recordingMaster struct {
	MasterClient
	mu     sync.Mutex
	recs   map[string]model.LocalEndpointRecord
	fail   int
	refuse string
	calls  int
}

func (m *recordingMaster) RecordEndpoint(_ context.Context, rec model.LocalEndpointRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if rec.ID == m.refuse {
		return errors.New("netmaster refuses the record")
	}
	if m.fail > 0 {
		m.fail--
		return errors.New("netmaster unavailable")
	}
	m.recs[rec.ID] = rec
	return nil
}

func (m *recordingMaster) record(id string) model.LocalEndpointRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recs[id]
}

// runPodCache runs netplugin's pod cache for node against api, with the netplugin
// identity of deploy/kubernetes/rbac.yaml, until ctx ends.
func runPodCache(ctx context.Context, t *testing.T, api *k8stest.APIServer, node string) *k8s.PodCache {
	t.Helper()
	_, kc := api.ContivConfig(t, k8stest.UserNetplugin)
	cs, _, err := k8s.Clientset(kc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := k8s.NewPodCache(cs, node, 2*time.Second, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	c.Run(ctx)
	return c
}

// podAPI starts a kube-apiserver with pod ns/name on node n1 and a pod cache of n1; ctx
// ends with the test (at most a minute).
func podAPI(t *testing.T, ns, name string) (context.Context, *k8stest.APIServer, kubernetes.Interface, *k8s.PodCache) {
	t.Helper()
	k8stest.NeedAPIServer(t)
	api := k8stest.Start(t)
	api.Pod(t, ns, name, "n1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx, api, api.Clientset(t, k8stest.UserAdmin), runPodCache(ctx, t, api, "n1")
}

// podAgent is a test agent on driver d with pod cache pods and one local endpoint id of
// pod (namespace/name) at ip, applied, watching the pods' bandwidth annotations; its
// records go to the master returned.
func podAgent(ctx context.Context, t *testing.T, d dataplane.Driver, pods PodLabeler, id, ip, pod string) (*Agent, *recordingMaster) {
	t.Helper()
	a := testAgent(t, d, dataplane.FwdBridge)
	m := &recordingMaster{recs: map[string]model.LocalEndpointRecord{}}
	a.cfg.Master, a.cfg.Pods = m, pods
	a.rec.setEp(id, &model.CfgEndpointState{ID: id, NetID: "n.t", IPAddress: ip, HomingHost: "h0", K8sPod: pod})
	a.rec.setLocal(id, &LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: id, IntfName: "eth0", PortName: HostIfName(id)}, NetNS: "/run/netns/x"})
	if errs := a.reconcile(ctx); len(errs) != 0 {
		t.Fatalf("first pass: %v", errs)
	}
	a.watchPodBandwidth(ctx)
	return a, m
}

// annotatePod sets pod ns/name's annotations to ann through the kube-apiserver.
func annotatePod(ctx context.Context, t *testing.T, admin kubernetes.Interface, ns, name string, ann map[string]string) {
	t.Helper()
	p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = ann
	if _, err := admin.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestPodBandwidthLive: a running pod's kubernetes.io/{ingress,egress}-bandwidth
// annotations, changed through a real kube-apiserver, reach its endpoint's QoS without a
// new attach (the stricter of them and the group's netprofile, as at attach) and its
// local record; annotations changed to values that do not parse fail the endpoint by
// name (kept with its last valid QoS, not unlimited) until fixed; removed, the pod is
// unlimited again. A pod of another node, or one this host has no endpoint of, changes
// nothing.
func TestPodBandwidthLive(t *testing.T) {
	ctx, api, admin, pods := podAPI(t, "prod", "web")

	const id = "n.t-web"
	a, m := podAgent(ctx, t, &qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}}, pods, id, "10.5.0.2", "prod/web")
	annotate := func(ann map[string]string) { t.Helper(); annotatePod(ctx, t, admin, "prod", "web", ann) }
	// until passes reconciles until ok says the pass applied what is expected.
	until := func(what string, ok func(errs map[string]error) bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			errs := a.reconcile(ctx)
			if ok(errs) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not applied; endpoint %+v, errors %v", what, a.applied.Endpoints[id], errs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	qos := func() dataplane.QoS { return a.applied.Endpoints[id].QoS }

	annotate(map[string]string{netprofile.AnnotationEgress: "5M", netprofile.AnnotationIngress: "20M"})
	want := dataplane.QoS{EgressRate: 5e6, IngressRate: 20e6}
	until("annotations added", func(map[string]error) bool { return qos() == want })
	if got := m.record(id).PodQoS; got != want {
		t.Errorf("local record: PodQoS %+v, want %+v", got, want)
	}

	annotate(map[string]string{netprofile.AnnotationEgress: "lots", netprofile.AnnotationIngress: "20M"})
	until("malformed annotation", func(map[string]error) bool {
		err := a.Errors()["endpoint/"+id] // (/healthz's list)
		return strings.Contains(err, netprofile.AnnotationEgress) && strings.Contains(err, "prod/web")
	})
	if got := qos(); got != want {
		t.Fatalf("an endpoint whose annotations do not parse runs with QoS %+v, want its last valid %+v", got, want)
	}

	annotate(map[string]string{netprofile.AnnotationEgress: "2M"})
	want = dataplane.QoS{EgressRate: 2e6}
	until("annotation fixed", func(errs map[string]error) bool { return len(errs) == 0 && len(a.Errors()) == 0 && qos() == want })

	// Another node's pod of the same name elsewhere, and a pod without an endpoint here:
	// nothing to do.
	api.Pod(t, "prod", "other", "n2", nil)
	api.Pod(t, "prod", "idle", "n1", nil)
	if p, err := admin.CoreV1().Pods("prod").Get(ctx, "idle", metav1.GetOptions{}); err == nil {
		p.Annotations = map[string]string{netprofile.AnnotationEgress: "1M"}
		if _, err := admin.CoreV1().Pods("prod").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if errs := a.reconcile(ctx); len(errs) != 0 || qos() != want {
		t.Fatalf("another pod's annotations: errors %v, QoS %+v", errs, qos())
	}

	annotate(nil)
	until("annotations removed", func(errs map[string]error) bool {
		_, ok := a.applied.Endpoints[id]
		return len(errs) == 0 && len(a.Errors()) == 0 && ok && qos().IsZero()
	})
	if got := m.record(id).PodQoS; !got.IsZero() {
		t.Errorf("local record after removal: PodQoS %+v", got)
	}
}

// countingDriver counts the endpoint calls the agent makes, by endpoint id.
type countingDriver struct {
	qosDriver
	mu              sync.Mutex
	upserts, delets map[string]int
}

func (d *countingDriver) UpsertEndpoint(ctx context.Context, ep dataplane.Endpoint) error {
	d.mu.Lock()
	d.upserts[ep.ID]++
	d.mu.Unlock()
	return d.qosDriver.UpsertEndpoint(ctx, ep)
}

func (d *countingDriver) DeleteEndpoint(_ context.Context, id string) error {
	d.mu.Lock()
	d.delets[id]++
	d.mu.Unlock()
	return nil
}

func (d *countingDriver) counts(id string) (upserts, deletes int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.upserts[id], d.delets[id]
}

// TestPodBandwidthFlapping: a pod owner flipping the bandwidth annotations between
// malformed and valid values (through a real kube-apiserver), while the agent reconciles
// as it runs, neither deletes the pod's endpoint (its veth: each delete and create
// again made it anew) nor updates it more than once per podQoSInterval; the last value
// wins. Before, every malformed value deleted the endpoint and every valid one created it
// again, as fast as the owner wrote them.
func TestPodBandwidthFlapping(t *testing.T) {
	ctx, _, admin, pods := podAPI(t, "prod", "flap")

	d := &countingDriver{qosDriver: qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}}, upserts: map[string]int{}, delets: map[string]int{}}
	const id = "n.t-flap"
	a, m := podAgent(ctx, t, d, pods, id, "10.5.0.7", "prod/flap")
	up0, _ := d.counts(id)

	// The agent's loop: a pass as soon as anything changed.
	loopCtx, stopLoop := context.WithCancel(ctx)
	var loop sync.WaitGroup
	loop.Add(1)
	go func() {
		defer loop.Done()
		for loopCtx.Err() == nil {
			a.reconcile(loopCtx)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	start := time.Now()
	const flips = 8
	for i := range flips {
		for _, v := range []string{fmt.Sprintf("%dM", i+1), "lots"} {
			annotatePod(ctx, t, admin, "prod", "flap", map[string]string{netprofile.AnnotationEgress: v})
			time.Sleep(40 * time.Millisecond) // long enough for a pass per change
		}
	}
	annotatePod(ctx, t, admin, "prod", "flap", map[string]string{netprofile.AnnotationEgress: "9M"}) // the last value: valid
	span := time.Since(start)
	want := dataplane.QoS{EgressRate: 9e6}
	deadline := time.Now().Add(15 * time.Second)
	for {
		a.applyMu.Lock()
		got := a.applied.Endpoints[id].QoS
		a.applyMu.Unlock()
		if got == want && len(a.Errors()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last value not applied: QoS %+v, errors %v", got, a.Errors())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopLoop()
	loop.Wait()
	up, del := d.counts(id)
	if del != 0 {
		t.Errorf("the endpoint was deleted %d times while its annotations flapped (its veth made anew each time)", del)
	}
	// One apply per interval: the first at once, one at the end of each interval the
	// changes kept coming in, the last value's.
	if most := int(span/podQoSInterval) + 2; up-up0 > most {
		t.Errorf("%d endpoint updates for %d changes in %v, want at most %d (one per %v)", up-up0, 2*flips+1, span.Round(time.Millisecond), most, podQoSInterval)
	}
	if got := m.record(id).PodQoS; got != want {
		t.Errorf("local record: PodQoS %+v, want %+v", got, want)
	}
}

// retryAgent is podAgent with a pod cache of the test's making (pods: call its change
// for a pod's new annotations) whose master fails the next fails record writes; ctx ends
// with the test (at most 10 s).
func retryAgent(t *testing.T, id, ip, pod string, fails int) (context.Context, *Agent, *recordingMaster, *changingPods) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	pods := &changingPods{}
	a, m := podAgent(ctx, t, &qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}}, pods, id, ip, pod)
	m.mu.Lock()
	m.fail = fails
	m.mu.Unlock()
	return ctx, a, m, pods
}

// TestPodBandwidthRecordRetried: a pod's new bandwidth whose record write fails once
// (netmaster unreachable for a moment) is recorded by a retry, not only when the
// informer lists the pod again or the agent restarts (which read the old QoS from the
// record meanwhile).
func TestPodBandwidthRecordRetried(t *testing.T) {
	const id = "n.t-rec"
	ctx, a, m, pods := retryAgent(t, id, "10.5.0.8", "prod/rec", 1)
	pods.change("prod", "rec", map[string]string{netprofile.AnnotationEgress: "3M"})
	want := dataplane.QoS{EgressRate: 3e6}
	a.mu.Lock()
	applied := a.rec.local[id].PodQoS
	a.mu.Unlock()
	if applied != want {
		t.Fatalf("pod QoS %+v, want %+v", applied, want)
	}
	for m.record(id).PodQoS != want {
		if ctx.Err() != nil {
			t.Fatalf("the record was not written again after a failed write: %+v", m.record(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPodBandwidthRetryWritesCurrentRecord: a retried record write writes the
// endpoint's record as it stands when the retry runs, not the copy taken when the
// annotations changed. Before, the retry wrote that copy: an endpoint attached again
// meanwhile (same id and bandwidth, another network namespace) had its new record,
// written by the attach, overwritten with the old one by the late retry.
func TestPodBandwidthRetryWritesCurrentRecord(t *testing.T) {
	const id = "n.t-cur"
	ctx, a, m, pods := retryAgent(t, id, "10.5.0.9", "prod/cur", 1)
	pods.change("prod", "cur", map[string]string{netprofile.AnnotationEgress: "3M"}) // its write fails: retried
	// Attached again before the retry: the attach records the endpoint as it is now.
	a.attachMu.Lock()
	a.mu.Lock()
	l := a.rec.local[id]
	l.NetNS = "/run/netns/again"
	a.rec.setLocal(id, &l)
	a.mu.Unlock()
	m.mu.Lock()
	m.recs[id] = l
	calls := m.calls
	m.mu.Unlock()
	a.attachMu.Unlock()
	for {
		m.mu.Lock()
		retried := m.calls > calls
		m.mu.Unlock()
		if retried {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the failed record write was not tried again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := m.record(id); got.NetNS != l.NetNS || got.PodQoS != l.PodQoS {
		t.Errorf("record after the retry: netns %q, PodQoS %+v; want the endpoint's current %q, %+v", got.NetNS, got.PodQoS, l.NetNS, l.PodQoS)
	}
}

// TestPodBandwidthOneRetryPerEndpoint: while netmaster keeps failing, a pod's changes
// (the gate lets one a second through) leave one retry of the endpoint's record, not
// one per change. Before, each failed write started a retry of its own that lived while
// the endpoint had its QoS: 6 changes to the same value (5 others between them) made 6
// retries, each writing (and holding the attach lock for up to masterTimeout) at every
// step of its backoff.
func TestPodBandwidthOneRetryPerEndpoint(t *testing.T) {
	const id = "n.t-one"
	ctx, a, m, _ := retryAgent(t, id, "10.5.0.10", "prod/one", 1<<30)
	for i := range 11 {
		a.podBandwidth(ctx, "prod", "one", map[string]string{netprofile.AnnotationEgress: fmt.Sprintf("%dM", 1+i%2)})
	}
	m.mu.Lock()
	calls := m.calls
	m.mu.Unlock()
	// One retry waits 0.2 s, then 0.4 s, then 0.8 s (±20 %): at most 2 writes in 1 s.
	time.Sleep(time.Second)
	m.mu.Lock()
	retried := m.calls - calls
	m.mu.Unlock()
	if retried < 1 || retried > 3 {
		t.Errorf("%d record writes in 1 s after 11 failed ones, want 1 to 3 (one retry of the endpoint)", retried)
	}
}

// TestPodBandwidthRetryOutlivesAttach: a record write that fails after the CNI ADD read
// the annotations again (recheckPodBandwidth, under the ADD's context) is retried after
// the ADD returned. Before, the retry ran under the ADD's context and ended with it: the
// record kept the old QoS until the informer listed the pod again or the agent
// restarted.
func TestPodBandwidthRetryOutlivesAttach(t *testing.T) {
	const id = "n.t-add"
	_, a, m, pods := retryAgent(t, id, "10.5.0.11", "prod/add", 1)
	pods.mu.Lock()
	pods.ann = map[string]string{netprofile.AnnotationEgress: "4M"}
	pods.mu.Unlock()
	addCtx, addDone := context.WithCancel(context.Background())
	a.recheckPodBandwidth(addCtx, "prod", "add") // its write fails
	addDone()                                    // the ADD returned
	want := dataplane.QoS{EgressRate: 4e6}
	deadline := time.Now().Add(3 * time.Second)
	for m.record(id).PodQoS != want {
		if time.Now().After(deadline) {
			t.Fatalf("record after the ADD returned: PodQoS %+v, want %+v (not retried)", m.record(id).PodQoS, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPodBandwidthRetryNotHeldUpByOne: an endpoint whose record netmaster keeps
// refusing does not hold up the retry of another's. Before, a round of retries stopped
// at the first failure, and the refused endpoint (first in order) was tried first in
// every round: the other record was never written.
func TestPodBandwidthRetryNotHeldUpByOne(t *testing.T) {
	const id, refused = "n.t-b", "n.t-a"
	ctx, a, m, _ := retryAgent(t, id, "10.5.0.12", "prod/b", 0)
	a.mu.Lock()
	a.rec.setEp(refused, &model.CfgEndpointState{ID: refused, NetID: "n.t", IPAddress: "10.5.0.13", HomingHost: "h0", K8sPod: "prod/a"})
	a.rec.setLocal(refused, &LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: refused, IntfName: "eth0", PortName: HostIfName(refused)}, NetNS: "/run/netns/a"})
	a.mu.Unlock()
	m.mu.Lock()
	m.refuse, m.fail = refused, 1
	m.mu.Unlock()
	a.podBandwidth(ctx, "prod", "a", map[string]string{netprofile.AnnotationEgress: "1M"}) // refused, for good
	a.podBandwidth(ctx, "prod", "b", map[string]string{netprofile.AnnotationEgress: "2M"}) // fails once
	want := dataplane.QoS{EgressRate: 2e6}
	deadline := time.Now().Add(3 * time.Second)
	for m.record(id).PodQoS != want {
		if time.Now().After(deadline) {
			t.Fatalf("record of %s: PodQoS %+v, want %+v (its retry held up by %s's)", id, m.record(id).PodQoS, want, refused)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// changingPods is a pod cache whose bandwidth annotations of one pod change while an
// attach is under way: the watch is told of the change (fire) before the endpoint is
// recorded, and the cache answers the new annotations from then on.
type changingPods struct {
	mu  sync.Mutex
	ann map[string]string
	fn  func(namespace, name string, ann map[string]string)
}

func (p *changingPods) PodLabels(context.Context, string, string) (map[string]string, error) {
	return map[string]string{}, nil
}

func (p *changingPods) PodAnnotations(context.Context, string, string) (map[string]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.ann), nil
}

func (p *changingPods) WatchBandwidth(fn func(namespace, name string, ann map[string]string)) error {
	p.fn = fn
	return nil
}

func (p *changingPods) change(ns, name string, ann map[string]string) {
	p.mu.Lock()
	p.ann = ann
	p.mu.Unlock()
	p.fn(ns, name, maps.Clone(ann)) // (the informer's handler runs after its cache has it)
}

// attachMaster creates endpoints of network n.t and keeps the records; then runs after
// the create (an annotation changing in the window of the attach).
type attachMaster struct {
	recordingMaster
	then func()
}

func (m *attachMaster) CreateEndpoint(_ context.Context, req model.CreateEndpointRequest) (model.CfgEndpointState, error) {
	m.then()
	return model.CfgEndpointState{ID: model.EndpointStateID(req.NetworkName, req.TenantName, req.EndpointID), NetID: "n.t",
		IPAddress: "10.5.0.9", MacAddress: "02:02:0a:05:00:09", K8sPod: req.K8sPod}, nil
}

// TestPodBandwidthChangedDuringAttach: annotations that change after the CNI ADD read
// them but before its endpoint is recorded (the watch's event finds no endpoint of the
// pod yet) still reach the endpoint: the attach reads them again once the endpoint is
// recorded. Before, the endpoint kept the annotations of the ADD until the informer
// listed the pod again (a reconnect or a restart): a limit changed right after a pod
// started was not applied.
func TestPodBandwidthChangedDuringAttach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := &qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}}
	a := testAgent(t, d, dataplane.FwdBridge)
	close(a.ready)
	pods := &changingPods{ann: map[string]string{netprofile.AnnotationEgress: "50M"}}
	m := &attachMaster{recordingMaster: recordingMaster{recs: map[string]model.LocalEndpointRecord{}}}
	m.then = func() { pods.change("prod", "web", map[string]string{netprofile.AnnotationEgress: "5M"}) }
	a.cfg.Master, a.cfg.Pods = m, pods
	a.watchPodBandwidth(ctx)
	res, err := a.CNIBackend().AddPod(ctx, cniapi.PodRequest{Name: "web", Namespace: "prod", InfraContainerID: "web1",
		Tenant: "t", Network: "n", NetNS: "/run/netns/x"})
	if err != nil {
		t.Fatal(err)
	}
	if errs := a.reconcile(ctx); len(errs) != 0 {
		t.Fatalf("pass after attach: %v", errs)
	}
	want := dataplane.QoS{EgressRate: 5e6}
	if got := a.applied.Endpoints[res.EndpointID].QoS; got != want {
		t.Errorf("endpoint %s after the annotation changed during its attach: QoS %+v, want %+v", res.EndpointID, got, want)
	}
	if got := m.record(res.EndpointID).PodQoS; got != want {
		t.Errorf("local record: PodQoS %+v, want %+v", got, want)
	}
}

func (m *recordingMaster) ForgetEndpoint(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, id)
	return nil
}

// gatedMaster holds each RecordEndpoint until released, telling entered when one waits.
type gatedMaster struct {
	recordingMaster
	entered, release chan struct{}
}

func (m *gatedMaster) RecordEndpoint(ctx context.Context, rec model.LocalEndpointRecord) error {
	m.entered <- struct{}{}
	<-m.release
	return m.recordingMaster.RecordEndpoint(ctx, rec)
}

// TestPodBandwidthRacingDetach: a pod's annotations changing while its endpoint is
// detached (a CNI DEL) never write the endpoint's local record back after the detach
// removed it. Before, the watch wrote the record outside the attach lock: a detach in
// between forgot the endpoint, then the late write left a record of an endpoint that no
// longer exists on the host in the store.
func TestPodBandwidthRacingDetach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := &qosDriver{failingDriver: failingDriver{fail: map[string]bool{}}}
	a := testAgent(t, d, dataplane.FwdBridge)
	m := &gatedMaster{recordingMaster: recordingMaster{recs: map[string]model.LocalEndpointRecord{}},
		entered: make(chan struct{}), release: make(chan struct{})}
	a.cfg.Master = m
	const id = "n.t-web"
	a.rec.setEp(id, &model.CfgEndpointState{ID: id, NetID: "n.t", IPAddress: "10.5.0.2", HomingHost: "h0", K8sPod: "prod/web"})
	a.rec.setLocal(id, &LocalEndpoint{OperEndpointState: model.OperEndpointState{ID: id, EndpointID: "web", IntfName: "eth0",
		PortName: HostIfName(id)}, NetNS: "/run/netns/x", Tenant: "t", Network: "n"})
	m.recs[id] = model.LocalEndpointRecord{}

	changed := make(chan struct{})
	go func() {
		defer close(changed)
		a.podBandwidth(ctx, "prod", "web", map[string]string{netprofile.AnnotationEgress: "5M"})
	}()
	<-m.entered // the change's record write is under way
	detached := make(chan error, 1)
	go func() { // DetachEndpoint's part for the local endpoint (the rest needs a store)
		a.attachMu.Lock()
		defer a.attachMu.Unlock()
		detached <- a.forget(ctx, id)
	}()
	select {
	case err := <-detached: // (without the fix the detach does not wait for the write)
		detached <- err
	case <-time.After(300 * time.Millisecond):
	}
	close(m.release)
	<-changed
	if err := <-detached; err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	rec, left := m.recs[id]
	m.mu.Unlock()
	if left {
		t.Errorf("local record of the detached endpoint written back by the annotation change: %+v", rec)
	}
	a.mu.Lock()
	_, local := a.rec.local[id]
	a.mu.Unlock()
	if local {
		t.Error("detached endpoint still local")
	}
}
