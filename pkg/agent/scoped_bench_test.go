package agent

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// BenchmarkEndpointEvent: one remote endpoint changing on a host that knows 10,000
// endpoints in 100 networks and 1,000 services, the records-to-driver-call part of the
// agent's cost per event (go test -bench EndpointEvent ./pkg/agent).
func BenchmarkEndpointEvent(b *testing.B) {
	r := newRecords()
	for n := 0; n < 100; n++ {
		id := fmt.Sprintf("n%d.t%d", n, n%5)
		r.nets[id] = model.CfgNetworkState{ID: id, PktTagType: "vxlan", ExtPktTag: n + 1, SubnetIP: fmt.Sprintf("10.%d.0.0", n), SubnetLen: 16}
	}
	for h := 0; h < 10; h++ {
		r.vteps[fmt.Sprintf("k%d", h)] = vxlan.Registration{HostAddr: fmt.Sprintf("192.168.1.%d", h+1), Hostname: fmt.Sprintf("h%d", h)}
	}
	for i := 0; i < 10000; i++ {
		n := i % 100
		id := fmt.Sprintf("n%d.t%d-%d", n, n%5, i)
		r.setEp(id, &model.CfgEndpointState{ID: id, NetID: fmt.Sprintf("n%d.t%d", n, n%5), IPAddress: fmt.Sprintf("10.%d.%d.%d", n, i/250, i%250+2), HomingHost: fmt.Sprintf("h%d", i%10)})
	}
	for i := 0; i < 1000; i++ {
		id := fmt.Sprintf("s%d:t", i)
		r.setSvc(id, &model.CfgServiceLBState{ID: id, IPAddress: fmt.Sprintf("10.200.%d.%d", i/250, i%250), Ports: []string{"80:8080:TCP"}})
	}
	h := hostView{host: "h0", vtep: netip.MustParseAddr("192.168.1.1"), uplinkMTU: 1500}
	ap := dataplane.NewIndex()
	bad := map[string]error{}
	d := &nopDriver{}
	pass(h, r, ap, bad, d, true)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("n%d.t%d-%d", i%100, (i%100)%5, 20000+i%50)
		r.setEp(id, &model.CfgEndpointState{ID: id, NetID: fmt.Sprintf("n%d.t%d", i%100, (i%100)%5), IPAddress: fmt.Sprintf("10.%d.200.%d", i%100, i%50+2), HomingHost: "h3", EndpointGroupID: i % 7})
		pass(h, r, ap, bad, d, false)
	}
}
