package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/k8stest"
	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/k8s"
)

// TestPodTarget resolves tenant/network/group through netplugin's pod cache against a real
// kube-apiserver, with the netplugin identity of deploy/kubernetes/rbac.yaml.
func TestPodTarget(t *testing.T) {
	k8stest.NeedAPIServer(t)
	api := k8stest.Start(t)
	api.Pod(t, "prod", "web", "n1", map[string]string{k8s.LabelTenant: "blue", k8s.LabelNetwork: "net1", k8s.LabelGroup: "web"})
	api.Pod(t, "prod", "partial", "n1", map[string]string{k8s.LabelNetwork: "net2"})
	api.Pod(t, "prod", "none", "n1", nil)
	ctx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	c := runPodCache(ctx, t, api, "n1")
	req := cniapi.PodRequest{Name: "web", Namespace: "prod", InfraContainerID: "abc", Tenant: "cni-t", Network: "cni-n"}
	got, err := podTarget(ctx, c, req)
	if err != nil || got.Tenant != "blue" || got.Network != "net1" || got.Group != "web" || got.IfName != "eth0" {
		t.Fatalf("labelled pod: %+v %v", got, err)
	}
	// Labels the pod lacks come from the CNI args, then Contiv's defaults.
	got, err = podTarget(ctx, c, cniapi.PodRequest{Name: "partial", Namespace: "prod", Tenant: "cni-t"})
	if err != nil || got.Tenant != "cni-t" || got.Network != "net2" || got.Group != "" {
		t.Fatalf("partly labelled pod: %+v %v", got, err)
	}
	got, err = podTarget(ctx, c, cniapi.PodRequest{Name: "none", Namespace: "prod"})
	if err != nil || got.Tenant != cniapi.DefaultTenant || got.Network != cniapi.DefaultNetwork {
		t.Fatalf("unlabelled pod: %+v %v", got, err)
	}
	// No API configured: CNI args.
	got, err = podTarget(ctx, nil, req)
	if err != nil || got.Tenant != "cni-t" || got.Network != "cni-n" {
		t.Fatalf("without API: %+v %v", got, err)
	}
	// A pod the API does not know: a clear error, no attach.
	_, err = podTarget(ctx, c, cniapi.PodRequest{Name: "ghost", Namespace: "prod"})
	if !errors.Is(err, k8s.ErrPodNotFound) || !strings.Contains(err.Error(), "prod/ghost") {
		t.Fatalf("missing pod: %v", err)
	}
	// The CNI backend refuses it before attaching (this agent never runs: an attach would
	// wait for its first sync until the deadline).
	b := cniBackend{&Agent{cfg: Config{Pods: c}, ready: make(chan struct{})}}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.AddPod(actx, cniapi.PodRequest{Name: "ghost", Namespace: "prod", InfraContainerID: "x"}); !errors.Is(err, k8s.ErrPodNotFound) {
		t.Fatalf("AddPod of a missing pod: %v", err)
	}
	// API down: a pod never seen is an error, not a silent default.
	api.Stop()
	if got, err := podTarget(ctx, c, cniapi.PodRequest{Name: "new", Namespace: "prod"}); err == nil {
		t.Fatalf("API down: %+v, no error", got)
	}
}
