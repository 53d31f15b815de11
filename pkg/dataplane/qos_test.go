package dataplane

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

func TestQoSValidate(t *testing.T) {
	for _, c := range []struct {
		q    QoS
		want string // "" valid
	}{
		{QoS{}, ""},
		{QoS{EgressRate: 10e6, EgressBurst: 64 << 10, IngressRate: 10e6, DSCP: 46, SetDSCP: true}, ""},
		{QoS{SetDSCP: true}, ""}, // DSCP 0 set explicitly (best effort)
		{QoS{DSCP: 64, SetDSCP: true}, "outside 0-63"},
		{QoS{DSCP: 10}, "without setDSCP"},
		{QoS{EgressBurst: 1}, "egressBurst without egressRate"},
		{QoS{IngressBurst: 1}, "ingressBurst without ingressRate"},
	} {
		err := c.q.Validate()
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.q, err, c.want)
		}
	}
}

func TestEndpointQoSRoundTrip(t *testing.T) {
	ep := Endpoint{ID: "n.t-c", NetworkID: "n.t", HostIfName: "h", IfName: "eth0",
		QoS: QoS{EgressRate: 1e6, IngressRate: 2e6, IngressBurst: 3000, DSCP: 8, SetDSCP: true}}
	b, err := json.Marshal(ep)
	if err != nil {
		t.Fatal(err)
	}
	var back Endpoint
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.QoS != ep.QoS {
		t.Fatalf("QoS %+v came back as %+v (%s)", ep.QoS, back.QoS, b)
	}
	b, _ = json.Marshal(Endpoint{ID: "x"})
	if strings.Contains(string(b), "qos") {
		t.Fatalf("a zero QoS is written: %s", b)
	}
	bad := ep
	bad.IP = netip.MustParseAddr("10.0.0.2")
	bad.MAC = ContivMAC(bad.IP)
	bad.QoS.DSCP = 70
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "dscp") {
		t.Fatalf("endpoint with dscp 70: %v", err)
	}
}
