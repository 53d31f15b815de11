package netprofile

import (
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

func TestParseBandwidth(t *testing.T) {
	good := map[string]uint64{
		"10mbps": 10e6, "10 Mbps": 10e6, "1g": 1e9, "500kb": 500e3, "2Kbit": 2e3, "3Mbits": 3e6,
		"7KPS": 7e3, "1000g": 1e12, "1k": 1e3,
	}
	for s, want := range good {
		if got, err := ParseBandwidth(s); err != nil || got != want {
			t.Errorf("ParseBandwidth(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "10", "0mbps", "-1m", "10tbps", "1.5m", "10 mbps x", "1001g",
		"99999999999999999999g", "18446744073709551616k", "10mB/s"} {
		if got, err := ParseBandwidth(s); err == nil {
			t.Errorf("ParseBandwidth(%q) = %d, want an error", s, got)
		}
	}
}

func TestCheckProfile(t *testing.T) {
	for _, c := range []struct {
		bw          string
		dscp, burst int
		field       string // "" = valid
	}{
		{"10mbps", 0, 0, ""}, {"", 63, 0, ""}, {"1g", 46, 10486, ""}, {"", 0, 100, ""},
		{"10xbps", 0, 0, "bandwidth"}, {"10mbps", 64, 0, "DSCP"}, {"10mbps", -1, 0, "DSCP"},
		{"10mbps", 0, 10487, "burst"}, {"10mbps", 0, 1, "burst"}, {"10mbps", 0, -5, "burst"},
		{"5000g", 0, 0, "bandwidth"},
	} {
		err := CheckProfile(c.bw, c.dscp, c.burst)
		switch {
		case c.field == "" && err != nil:
			t.Errorf("CheckProfile(%q, %d, %d): %v", c.bw, c.dscp, c.burst, err)
		case c.field != "" && (err == nil || !strings.HasPrefix(err.Error(), c.field+":")):
			t.Errorf("CheckProfile(%q, %d, %d) = %v, want an error naming %s", c.bw, c.dscp, c.burst, err, c.field)
		}
	}
}

func TestOfGroup(t *testing.T) {
	q, err := OfGroup(model.EndpointGroupState{ID: "web:default", Bandwidth: "10mbps", Burst: 800, DSCP: 46})
	want := dataplane.QoS{EgressRate: 10e6, EgressBurst: 100_000, IngressRate: 10e6, IngressBurst: 100_000, DSCP: 46, SetDSCP: true}
	if err != nil || q != want {
		t.Fatalf("OfGroup = %+v, %v; want %+v", q, err, want)
	}
	if err := q.Validate(); err != nil {
		t.Fatal(err)
	}
	// No burst: 0, the backend's own default (each measured its policer).
	q, _ = OfGroup(model.EndpointGroupState{Bandwidth: "1g"})
	if q.EgressRate != 1e9 || q.EgressBurst != 0 || q.IngressBurst != 0 || q.SetDSCP {
		t.Fatalf("1g without a burst: %+v", q)
	}
	if q, err := OfGroup(model.EndpointGroupState{}); err != nil || !q.IsZero() {
		t.Fatalf("no netprofile: %+v, %v", q, err)
	}
	if _, err := OfGroup(model.EndpointGroupState{ID: "web:default", Bandwidth: "fast"}); err == nil ||
		!strings.Contains(err.Error(), "web:default") {
		t.Fatalf("bad bandwidth: %v", err)
	}
}

func TestOfPodAndStricter(t *testing.T) {
	q, err := OfPod(map[string]string{AnnotationIngress: "10M", AnnotationEgress: "1Gi", "other": "x"})
	if err != nil || q.IngressRate != 10e6 || q.EgressRate != 1<<30 || q.IngressBurst != 0 {
		t.Fatalf("OfPod = %+v, %v", q, err)
	}
	for _, v := range []string{"fast", "999", "2000G", "-10M"} {
		if _, err := OfPod(map[string]string{AnnotationEgress: v}); err == nil || !strings.Contains(err.Error(), AnnotationEgress) {
			t.Errorf("OfPod(%q) = %v, want an error naming the annotation", v, err)
		}
	}
	profile := dataplane.QoS{EgressRate: 20e6, EgressBurst: 1000, IngressRate: 5e6, IngressBurst: 2000, DSCP: 10, SetDSCP: true}
	pod := dataplane.QoS{EgressRate: 10e6, EgressBurst: 3000, IngressRate: 8e6, IngressBurst: 1500}
	want := dataplane.QoS{EgressRate: 10e6, EgressBurst: 1000, IngressRate: 5e6, IngressBurst: 1500, DSCP: 10, SetDSCP: true}
	if got := Stricter(profile, pod); got != want {
		t.Fatalf("Stricter = %+v, want %+v", got, want)
	}
	// A pod owner undercutting the profile's rate by a little does not trade the
	// profile's burst for the backend's default (annotations set none: 0, which is 250 ms
	// of the rate on OVS, 156 times the profile's 2,000 bytes at 10 Mbit/s).
	ann, err := OfPod(map[string]string{AnnotationEgress: "9990k", AnnotationIngress: "9990k"})
	if err != nil {
		t.Fatal(err)
	}
	tight := dataplane.QoS{EgressRate: 10e6, EgressBurst: 2000, IngressRate: 10e6, IngressBurst: 2000}
	want = dataplane.QoS{EgressRate: 9.99e6, EgressBurst: 2000, IngressRate: 9.99e6, IngressBurst: 2000}
	if got := Stricter(tight, ann); got != want {
		t.Fatalf("Stricter(profile with a burst, annotations) = %+v, want %+v (the profile's burst kept)", got, want)
	}
	// The profile's rate lower, its burst the default: a pod's burst does not replace it.
	if got := Stricter(dataplane.QoS{EgressRate: 10e6}, dataplane.QoS{EgressRate: 20e6, EgressBurst: 500}); got != (dataplane.QoS{EgressRate: 10e6}) {
		t.Fatalf("Stricter(profile without a burst, faster pod with one) = %+v", got)
	}
	if got := Stricter(dataplane.QoS{}, pod); got != pod {
		t.Fatalf("Stricter(none, pod) = %+v", got)
	}
	if got := Stricter(profile, dataplane.QoS{}); got != profile {
		t.Fatalf("Stricter(profile, none) = %+v", got)
	}
}
