package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/dataplane/ebpf"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/gorilla/mux"
)

// TestInspectJSON checks the inspect API's shape: lowerCamel names, MACs and addresses as
// text, optional fields left out, and a lossless round trip.
func TestInspectJSON(t *testing.T) {
	ip := netip.MustParseAddr("10.1.1.2")
	s := Snapshot{
		Host:      "h1",
		Networks:  []dataplane.Network{{ID: "n.default", Encap: dataplane.EncapVXLAN, Tag: 7, Subnet: netip.MustParsePrefix("10.1.1.0/24"), MTU: 1450}},
		Endpoints: []dataplane.Endpoint{{ID: "n.default-a", NetworkID: "n.default", IP: ip, MAC: dataplane.ContivMAC(ip), HostIfName: "cbv0123456789ab", IfName: "eth0", NetNS: "/run/netns/a"}},
		RemoteEndpoints: []dataplane.RemoteEndpoint{{ID: "n.default-b", NetworkID: "n.default", IP: netip.MustParseAddr("10.1.1.3"),
			MAC: dataplane.ContivMAC(netip.MustParseAddr("10.1.1.3")), EPGID: 4, VTEP: netip.MustParseAddr("192.168.1.2"), Host: "h2"}},
		Peers:    []dataplane.Peer{{Host: "h2", VTEP: netip.MustParseAddr("192.168.1.2")}},
		Policies: []dataplane.PolicySet{{EPGID: 4, Rules: []dataplane.PolicyRule{{ID: "r:inRx", Priority: 5, Ingress: true, Proto: 6, Port: 80, Action: dataplane.ActionAllow}}}},
		Services: []dataplane.Service{{ID: "web:default", VIP: netip.MustParseAddr("10.1.1.100"), Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}},
			Backends: []netip.Addr{ip}}},
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{
		`"networks":[{"id":"n.default","encap":"vxlan","tag":7,"subnet":"10.1.1.0/24","mtu":1450}]`,
		`"endpoints":[{"id":"n.default-a","networkID":"n.default","ip":"10.1.1.2","hostIfName":"cbv0123456789ab","netNS":"/run/netns/a","ifName":"eth0","mac":"02:02:0a:01:01:02"}]`,
		`"remoteEndpoints":[{"id":"n.default-b","networkID":"n.default","ip":"10.1.1.3","epgID":4,"vtep":"192.168.1.2","host":"h2","mac":"02:02:0a:01:01:03"}]`,
		`"peers":[{"host":"h2","vtep":"192.168.1.2"}]`,
		`"policies":[{"epgID":4,"rules":[{"id":"r:inRx","priority":5,"ingress":true,"proto":6,"port":80,"action":"allow"}]}]`,
		`"services":[{"id":"web:default","vip":"10.1.1.100","ports":[{"proto":6,"port":80,"targetPort":8080}],"backends":["10.1.1.2"]}]`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect JSON lacks %s\nin %s", want, out)
		}
	}
	var back Snapshot
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Endpoints, s.Endpoints) || !reflect.DeepEqual(back.RemoteEndpoints, s.RemoteEndpoints) || !reflect.DeepEqual(back.Peers, s.Peers) {
		t.Errorf("round trip changed endpoints/peers:\n%+v\n%+v", back, s)
	}
	var bad dataplane.Endpoint
	if err := json.Unmarshal([]byte(`{"id":"x","mac":"zz"}`), &bad); err == nil || !strings.Contains(err.Error(), "mac") {
		t.Errorf("bad mac accepted: %v", err)
	}
}

// TestDebugRoutesNeedToken: the mutating debug route is off without a token (403) and,
// when on, refuses callers without the token (401).
func TestDebugRoutesNeedToken(t *testing.T) {
	for _, c := range []struct {
		token, sent string
		want        int
	}{
		{"", "", 403},
		{"", "anything-at-all-x", 403},
		{"debug-token-0123456789", "", 401},
		{"debug-token-0123456789", "wrong-token-0123456789", 401},
	} {
		a := &Agent{cfg: Config{DebugToken: c.token}}
		req := httptest.NewRequest(http.MethodDelete, "/debug/reclaimEndpoint/x", nil)
		if c.sent != "" {
			req.Header.Set("Authorization", "Bearer "+c.sent)
		}
		rec := httptest.NewRecorder()
		a.reclaimEndpoint(rec, req)
		if rec.Code != c.want {
			t.Errorf("token %q sent %q: %d %s, want %d", c.token, c.sent, rec.Code, rec.Body, c.want)
		}
	}
}

// TestListingRoute: a dataplane without decoded tables answers 501, and a bad limit is
// refused before any table is read.
func TestListingRoute(t *testing.T) {
	a := &Agent{cfg: Config{Driver: struct{ dataplane.Driver }{}}}
	rec := httptest.NewRecorder()
	a.listing(rec, httptest.NewRequest(http.MethodGet, "/inspect/bpf/ct", nil))
	if rec.Code != http.StatusNotImplemented || !strings.Contains(rec.Body.String(), "no decoded listings") {
		t.Errorf("listing without a lister: %d %s", rec.Code, rec.Body)
	}
	e := &Agent{cfg: Config{Driver: &ebpf.Driver{}}, rec: newRecords()}
	e.rec.epgs["web:blue"] = model.EndpointGroupState{ID: "web:blue", EndpointGroupID: 0}
	for _, c := range []struct {
		query string
		code  int
		says  string
	}{
		{"ct?limit=0", 400, "limit"}, {"ct?limit=x", 400, "limit"}, {"ct?limit=1000001", 400, "limit"},
		{"policy?epg=0", 400, "epg"}, {"policy?epg=65536", 400, "epg"}, {"policy?epg=x", 400, "epg"},
		{"policy?group=nosuch:blue", 404, `no endpoint group "nosuch:blue"`},
		{"policy?group=web:blue", 404, "no endpoint group"}, // a record without an id
		{"ct?epg=3", 400, "only the policy table"}, {"ct?group=nosuch:blue", 400, "only the policy table"},
		{"policy?epg=3&group=web:blue", 400, "give one of them"},
	} {
		rec := httptest.NewRecorder()
		kind, _, _ := strings.Cut(c.query, "?")
		req := mux.SetURLVars(httptest.NewRequest(http.MethodGet, "/inspect/bpf/"+c.query, nil), map[string]string{"kind": kind})
		e.listing(rec, req)
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.says) {
			t.Errorf("%s: %d %s, want %d %q", c.query, rec.Code, rec.Body, c.code, c.says)
		}
	}
}

// TestMonitorFilter: every set field must match; endpoints match by id substring or
// exact address; tenant is the network's.
func TestMonitorFilter(t *testing.T) {
	l := MonitorLine{MonitorEvent: dataplane.MonitorEvent{Reason: "drop_policy", Src: netip.MustParseAddr("10.1.1.2"),
		Dst: netip.MustParseAddr("10.1.1.3"), Network: "web.blue"}, SrcEndpoint: "web.blue-aaa", DstEndpoint: "web.blue-bbb"}
	for _, c := range []struct {
		f    monitorFilter
		want bool
	}{
		{monitorFilter{}, true},
		{monitorFilter{policy: true}, true},
		{monitorFilter{reason: "policy", tenant: "blue", endpoint: "bbb"}, true},
		{monitorFilter{endpoint: "10.1.1.2"}, true},
		{monitorFilter{endpoint: "10.1.1.20"}, false},
		{monitorFilter{tenant: "blu"}, false},
		{monitorFilter{reason: "unknown_dst"}, false},
	} {
		if got := c.f.match(l); got != c.want {
			t.Errorf("%+v: %v, want %v", c.f, got, c.want)
		}
	}
	allow := l
	allow.Reason = "policy_allow"
	if (monitorFilter{}).match(allow) || !(monitorFilter{allowed: true, policy: true}).match(allow) {
		t.Error("allowed verdicts must be asked for, and then pass the policy filter")
	}
	other := l
	other.Reason = "drop_unknown_dst"
	if (monitorFilter{policy: true}).match(other) {
		t.Error("policy-only filter passed another drop")
	}
	// Both drivers stream events; one without a stream answers 501.
	a := &Agent{cfg: Config{Driver: struct{ dataplane.Driver }{}}}
	rec := httptest.NewRecorder()
	a.serveMonitor(rec, httptest.NewRequest(http.MethodGet, "/monitor", nil))
	if rec.Code != http.StatusNotImplemented || !strings.Contains(rec.Body.String(), "no drop event stream") {
		t.Errorf("monitor on OVS: %d %s", rec.Code, rec.Body)
	}
}

// streamDriver is a driver with a drop event stream that stays open until its context
// ends.
type streamDriver struct{ dataplane.Driver }

func (streamDriver) MonitorEvents(ctx context.Context) (<-chan dataplane.MonitorEvent, error) {
	ch := make(chan dataplane.MonitorEvent)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, nil
}

func (streamDriver) SetAllowEvents(bool) error { return nil }

// TestMonitorStreamLimits (control plane issue, item 6): /monitor streams take at most a
// quarter of the inspect API's connections, and one host at most a quarter of those: a
// local process holding streams cannot keep /healthz and /metrics out. Beyond either
// limit a stream is refused with 429 and Retry-After; a closed stream frees its place.
func TestMonitorStreamLimits(t *testing.T) {
	a := &Agent{cfg: Config{Driver: streamDriver{}}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h, err := a.monitor()
	if err != nil {
		t.Fatal(err)
	}
	var subs []*monitorSub
	defer func() {
		for _, s := range subs {
			h.unsubscribe(s)
		}
	}()
	take := func(host string) error {
		s, err := h.subscribe(monitorFilter{}, host)
		if err == nil {
			subs = append(subs, s)
		}
		return err
	}
	for i := 0; i < maxMonitorStreamsPerHost; i++ {
		if err := take("127.0.0.1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := take("127.0.0.1"); !errors.Is(err, errTooManyStreams) {
		t.Fatalf("a host past its streams: %v", err)
	}
	for i := 0; len(subs) < maxMonitorStreams; i++ {
		if err := take(fmt.Sprintf("10.0.0.%d", i/maxMonitorStreamsPerHost+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := take("10.9.9.9"); !errors.Is(err, errTooManyStreams) {
		t.Fatalf("past the streams in all: %v", err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/monitor", nil)
	req.RemoteAddr = "10.9.9.9:4000"
	a.serveMonitor(rec, req)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Errorf("the stream past the limit got %d (Retry-After %q), want 429", rec.Code, rec.Header().Get("Retry-After"))
	}
	h.unsubscribe(subs[len(subs)-1])
	subs = subs[:len(subs)-1]
	if err := take("10.9.9.9"); err != nil {
		t.Errorf("a closed stream did not free its place: %v", err)
	}
}

// TestMonitorNamesCountedDrops: a counted drop at a receiver (MonitorEvent.Count, an OVS
// ingress meter's: no source known) is named by its destination endpoint, as one at a
// sender is by its source; a copied packet without a source stays unnamed as before.
func TestMonitorNamesCountedDrops(t *testing.T) {
	ip := netip.MustParseAddr("10.1.1.2")
	h := &monitorHub{a: &Agent{cfg: Config{Host: "h1"}}, namesTime: time.Now(), // names as read from what is applied
		names: map[netip.Addr][]nameEntry{ip: {{"blue.t-a", "blue.t"}}}}
	in := h.describe(dataplane.MonitorEvent{Reason: "drop_rate_ingress", Dst: ip, Network: "blue.t", Count: 3, Bytes: 4500})
	if in.DstEndpoint != "blue.t-a" || in.SrcEndpoint != "" || in.Network != "blue.t" {
		t.Errorf("counted ingress drop: %+v, want a named as the destination", in)
	}
	out := h.describe(dataplane.MonitorEvent{Reason: "drop_rate_egress", Src: ip, Network: "blue.t", Count: 2})
	if out.SrcEndpoint != "blue.t-a" || out.DstEndpoint != "" {
		t.Errorf("counted egress drop: %+v, want a named as the source", out)
	}
	if !(monitorFilter{tenant: "t", endpoint: "blue.t-a"}).match(in) {
		t.Error("the tenant's endpoint filter does not select its counted drop")
	}
}
