package sim

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/critest"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// TestKubernetesCRI: a real container runtime (a private containerd with its CRI plugin)
// creates pod sandboxes as the kubelet would and itself executes the CNI chain, contivk8s
// chained with containernetworking's portmap, against host 1's netplugin reading the pod's
// labels from a real kube-apiserver. The sandbox gets an address of the network its label
// names and is reached from a pod on the other host; removing the sandbox (CNI DEL)
// removes its endpoint. Both datapaths.
func TestKubernetesCRI(t *testing.T) {
	testroot.Need(t)
	for _, dp := range []string{"ebpf", "ovs"} {
		t.Run(dp, func(t *testing.T) { kubernetesCRI(t, dp) })
	}
}

func kubernetesCRI(t *testing.T, dp string) {
	bin := buildBins(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 2, BinDir: bin, Dataplane: dp, KubeAPI: true})
	if err := c.CreateNetwork(ctx, "default", "crinet", "vxlan", "10.107.0.0/24", "10.107.0.1"); err != nil {
		t.Fatal(err)
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pause, plugins, err := critest.Build(ctx, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h1, h2 := c.Hosts[0], c.Hosts[1]
	rt, err := critest.Start(ctx, critest.Options{Dir: filepath.Join(c.WorkDir, "containerd"), ConfList: critest.ConfList(h1.CNISocket),
		Pause: pause, Plugins: plugins})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close the runtime: %v", err)
		}
	})

	// The pod exists in the API (bound to node 1) before the runtime creates its sandbox.
	c.KubeAPI.Pod(t, "default", "cri-web", h1.Name, map[string]string{k8s.LabelNetwork: "crinet", "app": "web"})
	id, ip, err := rt.RunPod(ctx, "default", "cri-web", "uid-cri-web")
	if err != nil {
		t.Fatal(err)
	}
	if !netip.MustParsePrefix("10.107.0.0/24").Contains(ip) {
		t.Fatalf("sandbox address %v: not from the network the pod's label names", ip)
	}
	netns, err := rt.NetNS(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Host 1's agent attached it (the conflist names no network: the pod's label chose it).
	local := func() (bool, error) {
		var out struct {
			Local []struct {
				ID string
				IP netip.Addr `json:"ip"`
			} `json:"local"`
		}
		if err := h1.InspectGet(ctx, "/inspect/endpoints", &out); err != nil {
			return false, err
		}
		for _, e := range out.Local {
			if e.IP == ip {
				return true, nil
			}
		}
		return false, nil
	}
	if ok, err := local(); err != nil || !ok {
		t.Fatalf("host 1 has no local endpoint %v: %v", ip, err)
	}
	// A pod on the other host reaches the sandbox through the overlay.
	c.KubeAPI.Pod(t, "default", "cri-client", h2.Name, map[string]string{k8s.LabelNetwork: "crinet"})
	client, err := c.AddPod(ctx, h2, "default", "cri-client")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other host's pod pings the sandbox", 30*time.Second, func() error {
		out, err := client.Ping(ctx, ip, 1)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	// Inside the sandbox: eth0 holds the address (the runtime's namespace, set up by the chain).
	out, err := runIn(ctx, "/", "nsenter", "--net="+netns, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil || !strings.Contains(out, ip.String()+"/24") {
		t.Fatalf("sandbox eth0: %v\n%s", err, out)
	}

	// CNI DEL through the runtime: the endpoint and the address go.
	if err := rt.RemovePod(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "endpoint removed", 20*time.Second, func() error {
		if ok, err := local(); err != nil || ok {
			return fmt.Errorf("endpoint %v still on host 1 (%v)", ip, err)
		}
		return nil
	})
	if out, err := client.Ping(ctx, ip, 1); err == nil {
		t.Fatalf("the removed sandbox still answers: %s", out)
	}
}
