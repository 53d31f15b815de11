package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/contivbpf/contivbpf/pkg/k8s/k8stest"
)

// TestKubernetesManifests sends deploy/kubernetes/contiv.yaml to a real kube-apiserver with
// server-side dry-run (after rbac.yaml for real: the service accounts must exist), and runs
// the binaries with each container's arguments and environment names, so a renamed flag or
// variable breaks this test rather than a cluster.
func TestKubernetesManifests(t *testing.T) {
	if os.Geteuid() != 0 && os.Getenv("CONTIVBPF_KUBE_APISERVER") == "" {
		t.Skip("needs root (CI builds and runs a private kube-apiserver); not root")
	}
	bin := bins(t)
	api := k8stest.Start(t)
	objs := api.DryRun(t, filepath.Join("kubernetes", "contiv.yaml"))
	var containers []corev1.Container
	kinds := map[string]bool{}
	for _, o := range objs {
		switch w := o.(type) {
		case *appsv1.Deployment:
			kinds["Deployment"] = true
			containers = append(containers, w.Spec.Template.Spec.Containers...)
		case *appsv1.DaemonSet:
			kinds["DaemonSet"] = true
			containers = append(containers, w.Spec.Template.Spec.Containers...)
		case *corev1.ConfigMap:
			kinds["ConfigMap"] = true
		}
	}
	if !kinds["Deployment"] || !kinds["DaemonSet"] || !kinds["ConfigMap"] {
		t.Fatalf("manifest kinds %v", kinds)
	}
	for _, c := range containers {
		name := filepath.Base(c.Command[0])
		args := make([]string, 0, len(c.Args)+1)
		for _, a := range c.Args {
			args = append(args, strings.ReplaceAll(a, "$(POD_IP)", "10.0.0.5"))
		}
		// Flags parse (urfave/cli refuses unknown ones before --version is honoured).
		out, err := exec.Command(filepath.Join(bin, name), append(args, "--version")...).CombinedOutput()
		if err != nil {
			t.Errorf("%s %v: %v\n%s", name, c.Args, err, out)
		}
		help, _ := exec.Command(filepath.Join(bin, name), "--help").CombinedOutput()
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "CONTIV_") && !strings.Contains(string(help), "$"+e.Name) {
				t.Errorf("%s: environment variable %s is not one of its flags'", name, e.Name)
			}
		}
	}
}
