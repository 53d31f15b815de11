package k8ssync

import (
	"net/netip"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/master"
)

// TestPodEndpointsOnTheirNode (found by review): an endpoint another host's agent recorded
// under a pod's name is not that pod (it would be admitted as the pod by other pods'
// NetworkPolicy ingress rules); the pod's endpoints on its own node are, all of them.
func TestPodEndpointsOnTheirNode(t *testing.T) {
	pods := []k8s.PolicyPod{{Namespace: "prod", Name: "db-0", Node: "h1"}, {Namespace: "prod", Name: "web", Node: "h2"}}
	eps := map[string][]master.K8sPodEndpoint{
		"prod/db-0": {
			{ID: "real", IP: netip.MustParseAddr("10.1.0.2"), Tenant: "t", Host: "h1"},
			{ID: "forged", IP: netip.MustParseAddr("10.1.0.9"), Tenant: "t", Host: "h2"},
			{ID: "stale", IP: netip.MustParseAddr("10.1.0.3"), Tenant: "t", Host: "h1"},
		},
		"prod/web": {{ID: "web", IP: netip.MustParseAddr("10.1.0.4"), Tenant: "t", Host: "h2"}},
	}
	got := podEndpoints(pods, eps)
	var ids []string
	for _, p := range got {
		ids = append(ids, p.Name+"="+p.EndpointID)
	}
	if len(ids) != 3 || ids[0] != "db-0=real" || ids[1] != "db-0=stale" || ids[2] != "web=web" {
		t.Errorf("pod endpoints %v, want db-0=real, db-0=stale, web=web (not the forged one)", ids)
	}
}
