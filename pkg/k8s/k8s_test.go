package k8s_test

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/contivbpf/contivbpf/internal/testkit/k8stest"
	"github.com/contivbpf/contivbpf/pkg/k8s"
)

// TestPodCache runs against a real kube-apiserver with the RBAC of deploy/kubernetes: the
// netplugin identity reads its node's pods from an informer cache, waits (bounded) for a
// pod created after the lookup started, never sees other nodes' pods, and keeps answering
// for known pods while the API server is down.
func TestPodCache(t *testing.T) {
	k8stest.NeedAPIServer(t)
	api := k8stest.Start(t)
	api.Pod(t, "prod", "web", "node1", map[string]string{k8s.LabelTenant: "blue", k8s.LabelNetwork: "net1", k8s.LabelGroup: "web", "app": "web"})
	api.Pod(t, "default", "bare", "node1", nil)
	api.Pod(t, "prod", "elsewhere", "node2", map[string]string{k8s.LabelTenant: "red"})
	// A namespace bound to a tenant: its pods get that tenant, a pod naming another is refused.
	if _, err := api.Admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bound",
		Labels: map[string]string{k8s.LabelTenant: "blue"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	api.Pod(t, "bound", "plain", "node1", map[string]string{k8s.LabelNetwork: "n"})
	api.Pod(t, "bound", "sneaky", "node1", map[string]string{k8s.LabelTenant: "red"})

	path, _ := api.ContivConfig(t, k8stest.UserNetplugin)
	cfg, err := k8s.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, _, err := k8s.Clientset(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := k8s.NewPodCache(cs, "node1", 3*time.Second, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc.Run(ctx)

	l, err := pc.PodLabels(ctx, "prod", "web")
	if err != nil || l[k8s.LabelTenant] != "blue" || l[k8s.LabelNetwork] != "net1" || l[k8s.LabelGroup] != "web" {
		t.Fatalf("labels = %v, %v", l, err)
	}
	if l, err := pc.PodLabels(ctx, "", "bare"); err != nil || len(l) != 0 {
		t.Fatalf("pod without labels: %v, %v", l, err)
	}
	if l, err := pc.PodLabels(ctx, "bound", "plain"); err != nil || l[k8s.LabelTenant] != "blue" || l[k8s.LabelNetwork] != "n" {
		t.Fatalf("pod of a bound namespace: %v, %v", l, err)
	}
	if l, err := pc.PodLabels(ctx, "bound", "sneaky"); err == nil || !strings.Contains(err.Error(), `bound to tenant "blue"`) {
		t.Fatalf("pod naming another tenant than its namespace's: %v, %v", l, err)
	}
	// Another node's pod is not in this node's cache: not found after the wait.
	start := time.Now()
	_, err = pc.PodLabels(ctx, "prod", "elsewhere")
	if !errors.Is(err, k8s.ErrPodNotFound) || !strings.Contains(err.Error(), "prod/elsewhere") || !strings.Contains(err.Error(), "node1") {
		t.Fatalf("other node's pod: %v", err)
	}
	if d := time.Since(start); d < 3*time.Second || d > 10*time.Second {
		t.Fatalf("bounded wait took %v, want about 3s", d)
	}
	// A pod created while the lookup waits is answered as soon as its watch event arrives.
	got := make(chan error, 1)
	go func() {
		l, err := pc.PodLabels(ctx, "prod", "late")
		if err == nil && l["app"] != "late" {
			err = errors.New("wrong labels")
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond)
	api.Pod(t, "prod", "late", "node1", map[string]string{"app": "late"})
	if err := <-got; err != nil {
		t.Fatalf("late pod: %v", err)
	}
	// Labels changed on the API are seen by the next lookup.
	p, err := api.Admin.CoreV1().Pods("prod").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels[k8s.LabelGroup] = "web2"
	if _, err := api.Admin.CoreV1().Pods("prod").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, _ := pc.PodLabels(ctx, "prod", "web")
		if l[k8s.LabelGroup] == "web2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("label update not seen: %v", l)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The API server goes away: known pods are still answered from the cache; an unknown
	// pod fails after the wait with an error that says the watch is failing.
	api.Stop()
	if l, err := pc.PodLabels(ctx, "prod", "web"); err != nil || l[k8s.LabelGroup] != "web2" {
		t.Fatalf("cached pod with the API down: %v %v", l, err)
	}
	_, err = pc.PodLabels(ctx, "prod", "ghost")
	if !errors.Is(err, k8s.ErrPodNotFound) || !strings.Contains(err.Error(), "not answering") {
		t.Fatalf("unknown pod with the API down: %v", err)
	}
	t.Logf("API down, unknown pod: %v", err)
}

// TestRBAC: the shipped roles give each agent what its code reads, and nothing else.
func TestRBAC(t *testing.T) {
	k8stest.NeedAPIServer(t)
	api := k8stest.Start(t)
	ctx := context.Background()
	one := metav1.ListOptions{Limit: 1}
	can := func(user, what string) bool {
		cs := api.Clientset(t, user)
		var err error
		switch what {
		case "pods":
			_, err = cs.CoreV1().Pods("").List(ctx, one)
		case "namespaces":
			_, err = cs.CoreV1().Namespaces().List(ctx, one)
		case "services":
			_, err = cs.CoreV1().Services("").List(ctx, one)
		case "endpointslices":
			_, err = cs.DiscoveryV1().EndpointSlices("").List(ctx, one)
		case "networkpolicies":
			_, err = cs.NetworkingV1().NetworkPolicies("").List(ctx, one)
		case "secrets":
			_, err = cs.CoreV1().Secrets("").List(ctx, one)
		case "delete pod":
			err = cs.CoreV1().Pods("default").Delete(ctx, "x", metav1.DeleteOptions{})
			if err != nil && !strings.Contains(err.Error(), "forbidden") {
				err = nil // allowed (not found)
			}
		}
		return err == nil
	}
	for user, allowed := range map[string][]string{
		k8stest.UserNetplugin: {"pods", "namespaces"},
		k8stest.UserNetmaster: {"pods", "namespaces", "services", "endpointslices", "networkpolicies"},
		k8stest.UserNobody:    nil,
	} {
		for _, what := range []string{"pods", "namespaces", "services", "endpointslices", "networkpolicies", "secrets", "delete pod"} {
			want := false
			for _, a := range allowed {
				want = want || a == what
			}
			if got := can(user, what); got != want {
				t.Errorf("%s %s: allowed=%v, want %v", user, what, got, want)
			}
		}
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := k8s.LoadConfig(filepath.Join(dir, "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for body, want := range map[string]string{
		`{`:                             "kubernetes config",
		`{"K8S_API_SERVER":"ftp://x"}`:  "scheme",
		`{"K8S_API_SERVER":"https://"}`: "no host",
		`{"K8S_API_SERVER":"https://a:6443","K8S_KEY":"k"}`: "K8S_CERT and K8S_KEY",
	} {
		if _, err := k8s.LoadConfig(write("c.json", body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
	// Files named by the config are read when the client is built, with the key in the error.
	c, err := k8s.LoadConfig(write("ok.json", `{"K8S_API_SERVER":"https://127.0.0.1:6443","K8S_CA":"`+filepath.Join(dir, "nope.crt")+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RESTConfig(); err == nil || !strings.Contains(err.Error(), "K8S_CA") {
		t.Fatalf("missing CA file: %v", err)
	}
	tok := write("token", "s3cret\n")
	c = k8s.Config{APIServer: "https://127.0.0.1:6443", Token: tok}
	rc, err := c.RESTConfig()
	if err != nil || rc.BearerToken != "s3cret" {
		t.Fatalf("token file: %+v %v", rc, err)
	}
	// Neither contiv.json nor a pod's service account: a clear error.
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		if _, _, err := k8s.Clientset(k8s.Config{}); err == nil {
			t.Fatal("no API server configured and not in a cluster: no error")
		}
	}
}
