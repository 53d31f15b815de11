package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/contivbpf/contivbpf/internal/testkit/k8stest"
)

// TestKubernetesManifests sends deploy/kubernetes/contiv.yaml to a real kube-apiserver with
// server-side dry-run (after rbac.yaml for real: the service accounts must exist), and runs
// the binaries with each container's arguments and environment names, so a renamed flag or
// variable breaks this test rather than a cluster.
func TestKubernetesManifests(t *testing.T) {
	k8stest.NeedAPIServer(t)
	bin := bins(t)
	api := k8stest.Start(t)
	objs := api.DryRun(t, filepath.Join("kubernetes", "contiv.yaml"))
	var containers []corev1.Container
	kinds := map[string]bool{}
	config := map[string]string{}
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
			for k, v := range w.Data {
				config[w.Name+"/"+k] = v
			}
		}
	}
	if !kinds["Deployment"] || !kinds["DaemonSet"] || !kinds["ConfigMap"] {
		t.Fatalf("manifest kinds %v", kinds)
	}
	// Files the containers get from Secrets and the ConfigMap: stand-ins under a temp dir
	// (mode 0600, as the Secrets' defaultMode 0400 gives root).
	files := t.TempDir()
	for _, c := range containers {
		name := filepath.Base(c.Command[0])
		// netplugin's /healthz fails for objects tenants and pod owners control (a
		// malformed bandwidth annotation): a liveness probe on it restarts the agent in a
		// loop that fixes nothing. /livez answers while the agent serves.
		if p := c.LivenessProbe; name == "netplugin" && (p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/livez") {
			t.Errorf("netplugin's liveness probe %+v: want GET /livez", p)
		}
		args := make([]string, 0, len(c.Args)+1)
		for _, a := range c.Args {
			a = strings.ReplaceAll(a, "$(POD_IP)", "10.0.0.5")
			if strings.HasPrefix(a, "/etc/contiv/") {
				local := filepath.Join(files, a)
				if err := os.MkdirAll(filepath.Dir(local), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(local, []byte("stand-in-0123456789abcdef\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				a = local
			}
			args = append(args, a)
		}
		// The binary's own validation with the container's arguments and environment
		// (downward-API values made up, ConfigMap values from the manifest).
		cmd := exec.Command(filepath.Join(bin, name), append(args, "--check-config")...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for _, e := range c.Env {
			v := e.Value
			switch {
			case e.ValueFrom == nil:
			case e.ValueFrom.ConfigMapKeyRef != nil:
				v = config[e.ValueFrom.ConfigMapKeyRef.Name+"/"+e.ValueFrom.ConfigMapKeyRef.Key]
			case e.ValueFrom.FieldRef != nil && strings.HasSuffix(e.ValueFrom.FieldRef.FieldPath, "IP"):
				v = "10.0.0.5"
			default:
				v = "node-1"
			}
			cmd.Env = append(cmd.Env, e.Name+"="+v)
		}
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "configuration ok") {
			t.Errorf("%s %v --check-config: %v\n%s", name, c.Args, err, out)
		}
		help, _ := exec.Command(filepath.Join(bin, name), "--help").CombinedOutput()
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "CONTIV_") && !strings.Contains(string(help), "$"+e.Name) {
				t.Errorf("%s: environment variable %s is not one of its flags'", name, e.Name)
			}
		}
	}
}
