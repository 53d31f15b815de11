package k8s_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/k8s/k8stest"
)

func TestPodLabels(t *testing.T) {
	srv := k8stest.NewAPIServer(t, "s3cret", map[string]map[string]string{
		"prod/web":     {k8s.LabelTenant: "blue", k8s.LabelNetwork: "net1", k8s.LabelGroup: "web", "app": "web"},
		"default/bare": nil,
	})
	cfg, err := k8s.LoadConfig(srv.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := k8s.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.PodLabels(ctx, "prod", "web")
	if err != nil || l[k8s.LabelTenant] != "blue" || l[k8s.LabelNetwork] != "net1" || l[k8s.LabelGroup] != "web" {
		t.Fatalf("labels = %v, %v", l, err)
	}
	if l, err := c.PodLabels(ctx, "", "bare"); err != nil || len(l) != 0 {
		t.Fatalf("pod without labels: %v, %v", l, err)
	}

	// Unknown pod: a clear not-found error carrying the API's message.
	_, err = c.PodLabels(ctx, "prod", "ghost")
	var ae *k8s.APIError
	if !errors.Is(err, k8s.ErrPodNotFound) || !errors.As(err, &ae) || ae.Status != 404 || !strings.Contains(err.Error(), `pods "ghost" not found`) || !strings.Contains(err.Error(), "prod/ghost") {
		t.Fatalf("missing pod: %v", err)
	}

	// Wrong token: 401 with the API's message, not "not found".
	bad := cfg
	bad.Token = "wrong"
	cb, err := k8s.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.PodLabels(ctx, "prod", "web"); !errors.As(err, &ae) || ae.Status != 401 || errors.Is(err, k8s.ErrPodNotFound) {
		t.Fatalf("wrong token: %v", err)
	}
	// Token from a file.
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ftok := cfg
	ftok.Token = tf
	if cf, err := k8s.New(ftok); err != nil {
		t.Fatal(err)
	} else if _, err := cf.PodLabels(ctx, "prod", "web"); err != nil {
		t.Fatalf("token file: %v", err)
	}
	// No client certificate: the TLS handshake is refused.
	nocert := cfg
	nocert.Cert, nocert.Key = "", ""
	cn, err := k8s.New(nocert)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cn.PodLabels(ctx, "prod", "web"); err == nil {
		t.Fatal("request without client certificate succeeded")
	}
	// Not trusting the server's CA fails too.
	noca := cfg
	noca.CA = ""
	if cc, err := k8s.New(noca); err != nil {
		t.Fatal(err)
	} else if _, err := cc.PodLabels(ctx, "prod", "web"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted server: %v", err)
	}

	// API server down: an error, never empty labels.
	srv.Close()
	if l, err := c.PodLabels(ctx, "prod", "web"); err == nil || errors.Is(err, k8s.ErrPodNotFound) {
		t.Fatalf("API down: labels %v, err %v", l, err)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := k8s.LoadConfig(filepath.Join(dir, "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for name, body := range map[string]string{
		"json":   `{"K8S_API_SERVER": `,
		"scheme": `{"K8S_API_SERVER": "ftp://x"}`,
		"host":   `{"K8S_API_SERVER": "https://"}`,
		"pair":   `{"K8S_API_SERVER": "https://10.0.0.1:6443", "K8S_CERT": "/a.crt"}`,
	} {
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := k8s.LoadConfig(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want an error naming the file", name, err)
		}
	}
	// Contiv's installer leaves an empty API server on non-k8s hosts: not configured.
	p := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(p, []byte(`{"K8S_API_SERVER": "", "K8S_CA": "", "K8S_KEY": "", "K8S_CERT": "", "K8S_TOKEN": "", "SVC_SUBNET": "10.254.0.0/16"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := k8s.LoadConfig(p)
	if err != nil || c.APIServer != "" || c.SvcSubnet != "10.254.0.0/16" {
		t.Fatalf("empty config: %+v %v", c, err)
	}
	if _, err := k8s.New(c); err == nil {
		t.Fatal("client without API server")
	}
	if _, err := k8s.New(k8s.Config{APIServer: "https://127.0.0.1:1", CA: filepath.Join(dir, "empty.json")}); err == nil || !strings.Contains(err.Error(), "K8S_CA") {
		t.Fatalf("CA without PEM: %v", err)
	}
}
