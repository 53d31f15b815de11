// Package k8s is netplugin's minimal Kubernetes API client: it reads Contiv's client
// configuration (/var/contiv/config/contiv.json: K8S_API_SERVER, K8S_CA, K8S_KEY,
// K8S_CERT, K8S_TOKEN) and fetches a pod's labels with GET
// <api>/api/v1/namespaces/<ns>/pods/<name> over net/http (no client-go).
//
// It knows the pod API's JSON and Contiv's pod labels, nothing about etcd or the agent.
package k8s

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultConfigPath is where Contiv keeps the Kubernetes client configuration.
const DefaultConfigPath = "/var/contiv/config/contiv.json"

// Contiv's pod labels.
const (
	LabelTenant  = "io.contiv.tenant"
	LabelNetwork = "io.contiv.network"
	LabelGroup   = "io.contiv.net-group"
)

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

// Client reads pods from one API server.
type Client struct {
	base  *url.URL
	hc    *http.Client
	token string
}

// New builds a client: TLS verified with K8S_CA (system roots if empty), client
// certificate K8S_CERT/K8S_KEY if set, bearer token K8S_TOKEN if set. Requests time out
// after 10 s unless their context ends first.
func New(c Config) (*Client, error) {
	if c.APIServer == "" {
		return nil, errors.New("kubernetes client: K8S_API_SERVER is empty")
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	base, _ := url.Parse(strings.TrimRight(c.APIServer, "/"))
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CA != "" {
		pem, err := os.ReadFile(c.CA)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: K8S_CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kubernetes client: K8S_CA %s: no PEM certificate in it", c.CA)
		}
		tc.RootCAs = pool
	}
	if c.Cert != "" {
		kp, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: K8S_CERT/K8S_KEY: %w", err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	token := strings.TrimSpace(c.Token)
	if strings.HasPrefix(token, "/") {
		b, err := os.ReadFile(token)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: K8S_TOKEN file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &Client{base: base, token: token, hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

// ErrPodNotFound is wrapped by PodLabels when the API server has no such pod.
var ErrPodNotFound = errors.New("pod not found")

// APIError is a non-2xx answer of the API server.
type APIError struct {
	Status  int
	Message string // the Status object's message, else the body
}

func (e *APIError) Error() string {
	return fmt.Sprintf("kubernetes API: HTTP %d: %s", e.Status, e.Message)
}

// PodLabels returns the labels of pod namespace/name (namespace "" = "default").
func (c *Client) PodLabels(ctx context.Context, namespace, name string) (map[string]string, error) {
	if name == "" {
		return nil, errors.New("kubernetes: pod name is empty")
	}
	if namespace == "" {
		namespace = "default"
	}
	u := *c.base
	u.Path = u.Path + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: get pod %s/%s: %w", namespace, name, err)
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: get pod %s/%s: %w", namespace, name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("kubernetes: get pod %s/%s: read body: %w", namespace, name, err)
	}
	if resp.StatusCode != http.StatusOK {
		ae := &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(body))}
		var st struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Message != "" {
			ae.Message = st.Message
		}
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("kubernetes: pod %s/%s: %w (%w)", namespace, name, ErrPodNotFound, ae)
		}
		return nil, fmt.Errorf("kubernetes: get pod %s/%s: %w", namespace, name, ae)
	}
	var pod struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &pod); err != nil {
		return nil, fmt.Errorf("kubernetes: pod %s/%s: decode: %w", namespace, name, err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("kubernetes: pod %s/%s: answer is a %q, not a Pod", namespace, name, pod.Kind)
	}
	if pod.Metadata.Labels == nil {
		pod.Metadata.Labels = map[string]string{}
	}
	return pod.Metadata.Labels, nil
}
