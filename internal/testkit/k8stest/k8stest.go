// Package k8stest runs a private, real kube-apiserver for tests, benchmarks and demos: the binary
// scripts/kube-apiserver.sh builds from the Go module proxy (cached outside the repo), on
// an embedded etcd, with TLS from a throw-away CA, token authentication and RBAC. The
// cluster's RBAC comes from deploy/kubernetes/rbac.yaml, so the agents' tokens have exactly
// the rights the shipped manifests give them.
package k8stest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/testroot"
)

// Identities the API server knows by token.
const (
	UserAdmin     = "admin"                                              // system:masters
	UserNetplugin = "system:serviceaccount:kube-system:contiv-netplugin" // bound by rbac.yaml
	UserNetmaster = "system:serviceaccount:kube-system:contiv-netmaster" // bound by rbac.yaml
	UserNobody    = "nobody"                                             // no rights
)

// APIServer is one running kube-apiserver.
type APIServer struct {
	URL    string
	CAFile string
	Dir    string
	// Admin is a clientset with the admin token.
	Admin kubernetes.Interface
	// Tokens maps the users above to their bearer tokens.
	Tokens  map[string]string
	cmd     *exec.Cmd
	done    chan struct{}
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	closers []func()
}

// inNetNS is a command run in namespace ns ("" = this one).
func inNetNS(ns, bin string, args ...string) *exec.Cmd {
	if ns == "" {
		return exec.Command(bin, args...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
}

// startEtcdIn runs Debian's etcd inside ns on ip (ports 12379/12380, private to the
// namespace) until Close and returns its client URL.
func (s *APIServer) startEtcdIn(ns, ip string) (string, error) {
	client := "http://" + net.JoinHostPort(ip, "12379")
	peer := "http://" + net.JoinHostPort(ip, "12380")
	logFile, err := os.Create(filepath.Join(s.Dir, "etcd.log"))
	if err != nil {
		return "", err
	}
	cmd := inNetNS(ns, "etcd", "--name", "k8stest", "--data-dir", filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "k8stest="+peer)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return "", fmt.Errorf("start etcd in %s: %w", ns, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	s.closers = append(s.closers, func() { _ = cmd.Process.Kill(); <-done })
	return client, nil
}

// Binary returns the kube-apiserver binary: $CONTIVBPF_KUBE_APISERVER, else the cached build
// of scripts/kube-apiserver.sh (built now if the cache is empty; `make test` builds it first).
func Binary() (string, error) {
	if p := os.Getenv("CONTIVBPF_KUBE_APISERVER"); p != "" {
		return p, nil
	}
	out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "kube-apiserver.sh")).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return "", fmt.Errorf("build kube-apiserver: %w\n%s", err, stderr)
	}
	return strings.TrimSpace(string(out)), nil
}

// repoRoot is the repository's top directory (found from this file's path).
func repoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// RBACManifest is deploy/kubernetes/rbac.yaml, applied to every API server started here.
func RBACManifest() string { return filepath.Join(repoRoot(), "deploy", "kubernetes", "rbac.yaml") }

// Options place the API server.
type Options struct {
	// NetNS, if set, runs the API server and a private etcd (Debian's etcd binary) inside
	// that network namespace (`ip netns exec`), listening on IP, so processes in simulated
	// hosts reach it; the test's own clients then connect through Dial.
	NetNS string
	// IP is the listen address (default 127.0.0.1; with NetNS, an address of that
	// namespace).
	IP string
	// Dial, with NetNS, opens connections from inside the namespace (e.g. sim.DialContext).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// freePort, if set, replaces the loopback port chooser (tests of the retry).
	freePort func() (int, error)
}

// NeedAPIServer skips the test when it cannot have a kube-apiserver: CI runs as root,
// builds the API server and runs the test; without root CONTIVBPF_KUBE_APISERVER must name
// an API server binary.
func NeedAPIServer(t testing.TB) {
	t.Helper()
	if os.Getenv("CONTIVBPF_KUBE_APISERVER") == "" {
		testroot.Need(t)
	}
}

// Start runs a kube-apiserver on loopback (and an embedded etcd) until the test ends and
// applies deploy/kubernetes/rbac.yaml.
func Start(t testing.TB) *APIServer { return StartWith(t, Options{}) }

// StartWith is Start placed by o.
func StartWith(t testing.TB, o Options) *APIServer {
	t.Helper()
	s, err := Launch(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Launch runs a kube-apiserver (and its etcd) placed by o, with deploy/kubernetes/rbac.yaml
// applied, until Close. Tools (make bench, demos) use it; tests use Start.
func Launch(ctx context.Context, o Options) (s *APIServer, err error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "k8stest-")
	if err != nil {
		return nil, err
	}
	s = &APIServer{Dir: dir, Tokens: map[string]string{}, done: make(chan struct{}), dial: o.Dial}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	ip := o.IP
	if ip == "" {
		ip = "127.0.0.1"
	}
	var etcdURL string
	port := 16443
	pick := o.freePort
	if pick == nil {
		pick = freePort
	}
	if o.NetNS == "" {
		port, err = pick()
		if err != nil {
			return s, err
		}
		e, cu, err := startLoopbackEtcd(ctx, filepath.Join(dir, "etcd"), pick)
		if err != nil {
			return s, err
		}
		s.closers = append(s.closers, e.Close)
		etcdURL = cu
	} else {
		if etcdURL, err = s.startEtcdIn(o.NetNS, ip); err != nil {
			return s, err
		}
	}
	ca, err := pki.NewCA("k8stest-ca")
	if err != nil {
		return s, err
	}
	caFile, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		return s, err
	}
	srv, err := ca.Issue(pki.Options{CommonName: "kube-apiserver", Hosts: []string{ip, "127.0.0.1", "localhost", "kubernetes.default.svc"}, Server: true})
	if err != nil {
		return s, err
	}
	srvCert, srvKey, err := srv.Write(dir, "apiserver")
	if err != nil {
		return s, err
	}
	sa, err := ca.Issue(pki.Options{CommonName: "service-accounts"})
	if err != nil {
		return s, err
	}
	_, saKey, err := sa.Write(dir, "sa")
	if err != nil {
		return s, err
	}
	var csv bytes.Buffer
	for i, u := range []struct{ name, groups string }{
		{UserAdmin, "system:masters"},
		{UserNetplugin, "system:serviceaccounts,system:serviceaccounts:kube-system"},
		{UserNetmaster, "system:serviceaccounts,system:serviceaccounts:kube-system"},
		{UserNobody, ""},
	} {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return s, err
		}
		s.Tokens[u.name] = hex.EncodeToString(b)
		fmt.Fprintf(&csv, "%s,%s,%d,\"%s\"\n", s.Tokens[u.name], u.name, 1000+i, u.groups)
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, csv.Bytes(), 0o600); err != nil {
		return s, err
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--etcd-prefix=/k8stest",
		"--bind-address=" + ip, "--advertise-address=" + ip,
		"--tls-cert-file=" + srvCert, "--tls-private-key-file=" + srvKey,
		"--client-ca-file=" + caFile,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey, "--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller manager runs: pods are created without a default service account.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true", // as kubeadm clusters run: CNI agents are privileged pods
		"--profiling=false",
		"--cert-dir=" + filepath.Join(dir, "certs"),
	}
	s.CAFile = caFile
	for attempt := 1; ; attempt++ {
		if err := s.run(o.NetNS, bin, ip, port, args); err != nil {
			return s, err
		}
		err := s.waitReady(ctx, 90*time.Second)
		if err == nil {
			break
		}
		// A loopback port found free can be taken by another process before the API server
		// binds it (seen in CI): choose another and start again.
		if o.NetNS == "" && attempt < bindAttempts && strings.Contains(s.LogTail(), "address already in use") {
			s.Stop()
			if port, err = pick(); err != nil {
				return s, err
			}
			continue
		}
		return s, fmt.Errorf("kube-apiserver not ready: %w\n%s", err, s.LogTail())
	}
	if _, err := s.applyFile(ctx, RBACManifest(), false); err != nil {
		return s, err
	}
	// The authorizer learns new bindings through its informers, a moment after they are
	// written: the agents' first calls would be refused (seen under load).
	if err := s.waitAuthorized(ctx, 30*time.Second, UserNetplugin, UserNetmaster); err != nil {
		return s, err
	}
	return s, nil
}

// waitAuthorized waits until each of users may list pods (rbac.yaml grants that to both
// agents), asking the API server's authorizer (SubjectAccessReview).
func (s *APIServer) waitAuthorized(ctx context.Context, d time.Duration, users ...string) error {
	deadline := time.Now().Add(d)
	for _, u := range users {
		for {
			r, err := s.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: u,
					ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods"}}}, metav1.CreateOptions{})
			if err == nil && r.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("rbac.yaml not in effect for %s after %v (review: %v %v)", u, d, err, r)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// bindAttempts is how many loopback ports a server is given before Launch gives up.
const bindAttempts = 5

// startLoopbackEtcd runs an embedded etcd on loopback ports found free, choosing again when
// one is taken before etcd binds it.
func startLoopbackEtcd(ctx context.Context, dataDir string, pick func() (int, error)) (*etcdembed.Server, string, error) {
	for attempt := 1; ; attempt++ {
		cp, err := pick()
		if err != nil {
			return nil, "", err
		}
		pp, err := pick()
		if err != nil {
			return nil, "", err
		}
		cu, pu := fmt.Sprintf("http://127.0.0.1:%d", cp), fmt.Sprintf("http://127.0.0.1:%d", pp)
		e, err := etcdembed.Start(ctx, etcdembed.Config{DataDir: dataDir, ClientURL: cu, PeerURL: pu, Name: "k8stest"})
		if err == nil {
			return e, cu, nil
		}
		if attempt >= bindAttempts || !strings.Contains(err.Error(), "address already in use") {
			return nil, "", fmt.Errorf("start etcd: %w", err)
		}
		if err := os.RemoveAll(dataDir); err != nil {
			return nil, "", fmt.Errorf("start etcd: clear %s: %w", dataDir, err)
		}
	}
}

// run starts the API server on ip:port with args, logging to kube-apiserver.log.
func (s *APIServer) run(netns, bin, ip string, port int, args []string) error {
	logFile, err := os.Create(filepath.Join(s.Dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	cmd := inNetNS(netns, bin, append([]string{fmt.Sprintf("--secure-port=%d", port)}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	s.URL = "https://" + net.JoinHostPort(ip, strconv.Itoa(port))
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	if s.Admin, err = kubernetes.NewForConfig(s.RESTConfig(UserAdmin)); err != nil {
		return err
	}
	return nil
}

// Stop kills the API server (idempotent); its etcd keeps running until Close.
func (s *APIServer) Stop() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Close stops the API server and its etcd and removes their files (idempotent).
func (s *APIServer) Close() {
	s.Stop()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
	if s.Dir != "" {
		os.RemoveAll(s.Dir)
	}
}

// LogTail is the end of the API server's log, for failure messages.
func (s *APIServer) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "kube-apiserver.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (s *APIServer) waitReady(ctx context.Context, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last error
	for {
		select {
		case <-s.done:
			return fmt.Errorf("kube-apiserver exited")
		default:
		}
		_, err := s.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil {
			if _, err = s.Admin.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{}); err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// RESTConfig is client-go's configuration for user.
func (s *APIServer) RESTConfig(user string) *rest.Config {
	// No client-side rate limit (client-go's default is 5 requests/s): the API server is
	// private, and tests and benchmarks must measure the system, not the limiter.
	return &rest.Config{Host: s.URL, BearerToken: s.Tokens[user], TLSClientConfig: rest.TLSClientConfig{CAFile: s.CAFile}, Dial: s.dial,
		QPS: -1}
}

// Clientset is a clientset acting as user.
func (s *APIServer) Clientset(t testing.TB, user string) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.RESTConfig(user))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// ContivConfig writes a contiv.json for user (token inline) and returns its path and content.
func (s *APIServer) ContivConfig(t testing.TB, user string) (string, k8s.Config) {
	t.Helper()
	p, c, err := s.WriteContivConfig(t.TempDir(), user)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// WriteContivConfig writes dir/contiv-<user>.json for user (token inline).
func (s *APIServer) WriteContivConfig(dir, user string) (string, k8s.Config, error) {
	c := k8s.Config{APIServer: s.URL, CA: s.CAFile, Token: s.Tokens[user], SvcSubnet: "10.96.0.0/16"}
	b, err := json.Marshal(c)
	if err != nil {
		return "", c, err
	}
	p := filepath.Join(dir, "contiv-"+strings.NewReplacer(":", "-", "/", "-").Replace(user)+".json")
	return p, c, os.WriteFile(p, b, 0o600)
}

// DryRun sends every object of a manifest with server-side dry-run: the API server
// validates and admits it completely but stores nothing (no controllers run here).
func (s *APIServer) DryRun(t testing.TB, path string) []runtime.Object {
	t.Helper()
	objs, err := s.applyFile(context.Background(), path, true)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func (s *APIServer) applyFile(ctx context.Context, path string, dry bool) ([]runtime.Object, error) {
	var objs []runtime.Object
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := serializer.NewCodecFactory(scheme.Scheme).UniversalDeserializer()
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := rd.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(doc)) == 0 || bytes.Equal(bytes.TrimSpace(doc), []byte("---")) {
			continue
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: decode: %w", path, err)
		}
		if err := s.create(ctx, obj, dry); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("%s: create %s: %w", path, gvk.Kind, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

func (s *APIServer) create(ctx context.Context, obj runtime.Object, dry bool) error {
	c := metav1.CreateOptions{}
	if dry {
		c.DryRun = []string{metav1.DryRunAll}
	}
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		_, err := s.Admin.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, c)
		return err
	case *appsv1.Deployment:
		_, err := s.Admin.AppsV1().Deployments(o.Namespace).Create(ctx, o, c)
		return err
	case *appsv1.DaemonSet:
		_, err := s.Admin.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, c)
		return err
	case *corev1.Namespace:
		_, err := s.Admin.CoreV1().Namespaces().Create(ctx, o, c)
		return err
	case *corev1.ServiceAccount:
		_, err := s.Admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, c)
		return err
	case *rbacv1.ClusterRole:
		_, err := s.Admin.RbacV1().ClusterRoles().Create(ctx, o, c)
		return err
	case *rbacv1.ClusterRoleBinding:
		_, err := s.Admin.RbacV1().ClusterRoleBindings().Create(ctx, o, c)
		return err
	case *rbacv1.Role:
		_, err := s.Admin.RbacV1().Roles(o.Namespace).Create(ctx, o, c)
		return err
	case *rbacv1.RoleBinding:
		_, err := s.Admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, c)
		return err
	}
	return fmt.Errorf("k8stest.Apply: kind %T not supported", obj)
}

// Pod creates a pod bound to node (no kubelet runs: it stays Pending) with labels.
func (s *APIServer) Pod(t testing.TB, namespace, name, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	p, err := s.CreatePod(context.Background(), namespace, name, node, labels)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// CreatePod is Pod returning its error (the namespace is created if missing).
func (s *APIServer) CreatePod(ctx context.Context, namespace, name, node string, labels map[string]string) (*corev1.Pod, error) {
	if namespace != "default" {
		_, err := s.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create namespace %s: %w", namespace, err)
		}
	}
	p, err := s.Admin.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "k8stest.invalid/pause:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}
