package conformance

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// openerQuota is the HostConfig.CTQuota of ct-quota-opener's hosts: small, so a few
// dozen datagrams reach it.
const openerQuota = 8

// withOpenerQuota gives ct-quota-opener's hosts their quota.
func withOpenerQuota(c *dataplane.HostConfig) { c.CTQuota = openerQuota }

// ctQuotaOpener (Datapath v3 issue, hole 6): the conntrack quota charges a flow's opener.
// Host 2's address (a peer host, as one that limits nothing would) sends hand-made VXLAN
// to host 1: 8 × the quota new UDP flows from b1, an allowed remote peer, to a2 (pod P). Some
// must be refused (the quota on flows opened toward a2 is in force), and then P still opens
// its own new flows, to a1 on its host and to b1 across the wire (UDP and TCP), and so does
// a1: what others opened toward the host's endpoints does not take what its endpoints
// open. (OVS limits conntrack per zone: docs/ovs.md "Conntrack limits".)
func ctQuotaOpener(t *testing.T, e *Env) {
	a1, a2, b1 := adversaries(t, e)
	const flood, floodPort, echoPort = 8 * openerQuota, 7011, 7012
	// A rule for a2's and b1's group, which allows what it names as a miss would: the eBPF
	// datapath tracks (and counts) only flows of a group with rules.
	upsertPolicyAll(t, e, dataplane.PolicySet{EPGID: 2, Rules: []dataplane.PolicyRule{
		{ID: "udp-in", Priority: 1, Ingress: true, Proto: 17, Action: dataplane.ActionAllow}}})
	sink, err := StartUDPCount(a2.NS, a2.ip(), floodPort)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for _, c := range []*Container{a1, b1} {
		s, err := StartUDPEcho(c.NS, c.ip(), echoPort)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	echoServers(t, echoPort, b1)
	to := net.JoinHostPort(e.H1.Cfg.VTEP.String(), fmt.Sprint(vxlanPort))
	for i := 0; i < flood; i++ {
		inner := UDPFrame(a2.EP.MAC, b1.EP.MAC, b1.EP.IP, a2.EP.IP, uint16(20000+i), floodPort, marker("flood"))
		if err := SendUDP(e.H2.NS, e.H2.Cfg.VTEP.String(), to, VXLANPayload(e.Net.Tag, inner)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	n := sink.Flows()
	t.Logf("%d of %d flows b1 opened toward a2 were delivered (quota %d per endpoint)", n, flood, openerQuota)
	switch {
	case n == 0:
		t.Fatalf("none of b1's %d flows reached a2 (the probe does not work)", flood)
	case n == flood:
		t.Fatalf("all %d flows b1 opened toward a2 were delivered: no quota in force (the probe does not work)", flood)
	}
	for _, p := range []struct {
		from *Container
		to   string
	}{
		{a2, net.JoinHostPort(a1.ip(), fmt.Sprint(echoPort))},
		{a2, net.JoinHostPort(b1.ip(), fmt.Sprint(echoPort))},
		{a1, net.JoinHostPort(b1.ip(), fmt.Sprint(echoPort))},
	} {
		if _, err := UDPExchange(p.from.NS, p.to, marker("own"), time.Second); err != nil {
			t.Errorf("%s's own new UDP flow after b1 opened %d toward a2: %v", p.from.EP.ID, n, err)
		}
	}
	conn, err := DialTCPTimeout(a2.NS, net.JoinHostPort(b1.ip(), fmt.Sprint(echoPort)), 2*time.Second)
	if err != nil {
		t.Fatalf("a2's own new TCP connection after b1 opened %d flows toward it: %v", n, err)
	}
	defer conn.Close()
	if err := EchoRoundTrip(conn, 2048); err != nil {
		t.Errorf("a2's own TCP connection: %v", err)
	}
}
