// Package k8s is the agents' access to the Kubernetes API through client-go: it reads
// Contiv's client configuration (/var/contiv/config/contiv.json: K8S_API_SERVER, K8S_CA,
// K8S_KEY, K8S_CERT, K8S_TOKEN, SVC_SUBNET) or, inside a pod, the service account's
// in-cluster configuration, and keeps a node-scoped pod cache (a shared informer) that
// answers the CNI ADD path's label lookups without an API round trip.
//
// It knows Kubernetes' objects and Contiv's pod labels, nothing about etcd or the agent.
package k8s

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// DefaultConfigPath is where Contiv keeps the Kubernetes client configuration.
const DefaultConfigPath = "/var/contiv/config/contiv.json"

// Contiv's pod labels.
const (
	LabelTenant  = "io.contiv.tenant"
	LabelNetwork = "io.contiv.network"
	LabelGroup   = "io.contiv.net-group"
)

// TenantOf decides the tenant of a pod or Service from its namespace's labels and its own.
// A namespace labelled io.contiv.tenant binds everything in it to that tenant: an object
// label naming another tenant is refused (users who may create pods or Services in a
// namespace must not pick another tenant's networks, VIPs or endpoints). Without that
// namespace label the object's own label decides, as in Contiv; "" means the caller's
// default.
func TenantOf(namespace string, nsLabels, objLabels map[string]string) (string, error) {
	bound, own := nsLabels[LabelTenant], objLabels[LabelTenant]
	switch {
	case bound == "":
		return own, nil
	case own != "" && own != bound:
		return "", fmt.Errorf("label %s=%s: namespace %s is bound to tenant %q", LabelTenant, own, namespace, bound)
	}
	return bound, nil
}

// Config is Contiv's contiv.json.
type Config struct {
	APIServer string `json:"K8S_API_SERVER"` // https://host:port (http:// accepted)
	CA        string `json:"K8S_CA"`         // CA bundle file verifying the API server ("" = system roots)
	Key       string `json:"K8S_KEY"`        // client key file (with K8S_CERT)
	Cert      string `json:"K8S_CERT"`       // client certificate file (with K8S_KEY)
	Token     string `json:"K8S_TOKEN"`      // bearer token, or the path of a file holding it
	SvcSubnet string `json:"SVC_SUBNET,omitempty"`
}

// LoadConfig reads and checks a contiv.json. A missing file is returned as an error
// wrapping fs.ErrNotExist, so callers can tell "not configured" apart.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read kubernetes config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("kubernetes config %s: %w", path, err)
	}
	if c.APIServer != "" {
		if err := c.validate(); err != nil {
			return c, fmt.Errorf("kubernetes config %s: %w", path, err)
		}
	}
	return c, nil
}

func (c Config) validate() error {
	u, err := url.Parse(c.APIServer)
	switch {
	case err != nil:
		return fmt.Errorf("K8S_API_SERVER %q: %w", c.APIServer, err)
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Errorf("K8S_API_SERVER %q: scheme must be https or http", c.APIServer)
	case u.Host == "":
		return fmt.Errorf("K8S_API_SERVER %q: no host", c.APIServer)
	case (c.Cert == "") != (c.Key == ""):
		return errors.New("K8S_CERT and K8S_KEY must be set together")
	}
	return nil
}

// RESTConfig turns the contiv.json into client-go's configuration: TLS verified with
// K8S_CA (system roots if empty), client certificate K8S_CERT/K8S_KEY if set, bearer
// token K8S_TOKEN (or the file it names) if set. Files are read now, so a missing one is
// an error naming its key.
func (c Config) RESTConfig() (*rest.Config, error) {
	if c.APIServer == "" {
		return nil, errors.New("K8S_API_SERVER is empty")
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	rc := &rest.Config{Host: strings.TrimRight(c.APIServer, "/"), UserAgent: "contivbpf"}
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("K8S_CA: %w", err)
		}
		rc.TLSClientConfig.CAData = pem
	}
	if c.Cert != "" {
		cert, err := os.ReadFile(c.Cert)
		if err != nil {
			return nil, fmt.Errorf("K8S_CERT: %w", err)
		}
		key, err := os.ReadFile(c.Key)
		if err != nil {
			return nil, fmt.Errorf("K8S_KEY: %w", err)
		}
		rc.TLSClientConfig.CertData, rc.TLSClientConfig.KeyData = cert, key
	}
	token := strings.TrimSpace(c.Token)
	if strings.HasPrefix(token, "/") {
		b, err := os.ReadFile(token)
		if err != nil {
			return nil, fmt.Errorf("K8S_TOKEN file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	rc.BearerToken = token
	return rc, nil
}

// InCluster reports whether this process runs in a pod with a service account (the
// KUBERNETES_SERVICE_HOST variable and the mounted token), where client-go's in-cluster
// configuration applies.
func InCluster() bool {
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return false
	}
	_, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token")
	return err == nil
}

// ResolveConfig decides which API server a component talks to: the contiv.json at path
// when it names one; else, when that file is missing (and was not named explicitly) and the
// process runs in a pod, the service account (an empty Config: Clientset then uses the
// in-cluster configuration); else none (ok false, no error). A file named explicitly must
// exist; a file that does not parse is an error either way.
func ResolveConfig(path string, explicit bool) (cfg Config, ok bool, err error) {
	cfg, err = LoadConfig(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !explicit && InCluster():
		return Config{}, true, nil
	case errors.Is(err, fs.ErrNotExist) && !explicit:
		return cfg, false, nil
	case err != nil:
		return cfg, false, err
	}
	return cfg, cfg.APIServer != "", nil
}

// Clientset builds a client-go clientset for the configuration: contiv.json when it names an
// API server, else the in-cluster service account.
func Clientset(c Config) (kubernetes.Interface, *rest.Config, error) {
	var rc *rest.Config
	var err error
	if c.APIServer != "" {
		rc, err = c.RESTConfig()
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	// Informers watch; the few requests besides (Events) get room above client-go's
	// default 5/s so a burst of reports never stalls a caller.
	rc.QPS, rc.Burst = 20, 50
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes clientset: %w", err)
	}
	return cs, rc, nil
}
