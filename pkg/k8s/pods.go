package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/contivbpf/contivbpf/pkg/netprofile"
)

// ErrPodNotFound is wrapped by PodLabels when the pod is not (yet) in the node's cache
// after the bounded wait.
var ErrPodNotFound = errors.New("pod not found")

// DefaultPodWait bounds how long a CNI ADD waits for a pod the cache has not seen yet (the
// kubelet calls CNI right after the pod was bound to the node, so its watch event is
// normally milliseconds behind at most).
const DefaultPodWait = 5 * time.Second

// PodCache is a shared informer over the pods bound to one node (field selector
// spec.nodeName), trimmed to their metadata. PodLabels reads it; nothing on the CNI ADD
// path talks to the API server.
type PodCache struct {
	node     string
	wait     time.Duration
	cs       kubernetes.Interface
	log      *slog.Logger
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
	// Namespaces (cluster-wide, their own factory: the pods' field selector does not apply
	// to them): a namespace's io.contiv.tenant label binds its pods (TenantOf).
	nsFactory  informers.SharedInformerFactory
	nsInformer cache.SharedIndexInformer
	nsLister   corelisters.NamespaceLister

	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) on every add or update
	lastErr error         // the watch's last error, nil once it lists again
}

// NewPodCache builds the cache for pods on node; wait <= 0 means DefaultPodWait. Run
// starts it.
func NewPodCache(cs kubernetes.Interface, node string, wait time.Duration, log *slog.Logger) (*PodCache, error) {
	if node == "" {
		return nil, errors.New("pod cache: node name is empty")
	}
	if wait <= 0 {
		wait = DefaultPodWait
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + node
	}))
	c := &PodCache{node: node, wait: wait, cs: cs, log: log, factory: f, changed: make(chan struct{})}
	c.informer = f.Core().V1().Pods().Informer()
	c.lister = f.Core().V1().Pods().Lister()
	if err := c.informer.SetTransform(trimPod); err != nil {
		return nil, fmt.Errorf("pod cache transform: %w", err)
	}
	c.nsFactory = informers.NewSharedInformerFactory(cs, 0)
	c.nsInformer = c.nsFactory.Core().V1().Namespaces().Informer()
	c.nsLister = c.nsFactory.Core().V1().Namespaces().Lister()
	if err := c.nsInformer.SetTransform(trimNamespace); err != nil {
		return nil, fmt.Errorf("namespace cache transform: %w", err)
	}
	if err := c.informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		c.mu.Lock()
		c.lastErr = err
		c.mu.Unlock()
		log.Warn("kubernetes pod watch failed; retrying", "node", node, "err", err)
	}); err != nil {
		return nil, fmt.Errorf("pod cache error handler: %w", err)
	}
	for _, inf := range []cache.SharedIndexInformer{c.informer, c.nsInformer} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.wake() },
			UpdateFunc: func(any, any) { c.wake() },
		}); err != nil {
			return nil, fmt.Errorf("pod cache handler: %w", err)
		}
	}
	return c, nil
}

// trimPod keeps what the agent reads (name, namespace, uid, labels, node, the bandwidth
// annotations): the cache holds one small object per local pod instead of full specs and
// managed fields.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var ann map[string]string
	for _, k := range []string{netprofile.AnnotationIngress, netprofile.AnnotationEgress} {
		if v, ok := p.Annotations[k]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels, Annotations: ann,
			ResourceVersion: p.ResourceVersion},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName},
	}, nil
}

// trimNamespace keeps a namespace's name and labels.
func trimNamespace(obj any) (any, error) {
	n, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, Labels: n.Labels, ResourceVersion: n.ResourceVersion}}, nil
}

func (c *PodCache) wake() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.lastErr = nil
	c.mu.Unlock()
}

// Run starts the informer; it stops when ctx ends.
func (c *PodCache) Run(ctx context.Context) {
	c.factory.Start(ctx.Done())
	c.nsFactory.Start(ctx.Done())
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced, c.nsInformer.HasSynced) {
			c.log.Info("kubernetes pod cache synced", "node", c.node, "pods", len(c.informer.GetStore().ListKeys()))
			c.wake()
		}
	}()
	go func() {
		<-ctx.Done()
		c.factory.Shutdown()
		c.nsFactory.Shutdown()
	}()
}

// Synced reports whether the first list of the node's pods has arrived.
func (c *PodCache) Synced() bool { return c.informer.HasSynced() && c.nsInformer.HasSynced() }

// PodLabels returns the labels of pod namespace/name (namespace "" = "default") from the
// cache, with io.contiv.tenant decided by TenantOf (a pod of a namespace bound to a tenant
// gets that tenant; a pod label naming another is an error). A pod (or its namespace) the
// cache has not seen yet is waited for, up to the cache's wait; then the error wraps
// ErrPodNotFound and says whether the API server is answering. A pod already seen is
// answered from the cache also while the API server is down (its labels as last watched).
func (c *PodCache) PodLabels(ctx context.Context, namespace, name string) (map[string]string, error) {
	p, ns, err := c.lookup(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	l := maps.Clone(p.Labels)
	if l == nil {
		l = map[string]string{}
	}
	t, err := TenantOf(p.Namespace, ns.Labels, l)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: pod %s/%s: %w", p.Namespace, name, err)
	}
	if t != "" {
		l[LabelTenant] = t
	}
	return l, nil
}

// PodAnnotations returns the pod's annotations the cache keeps (the bandwidth ones,
// kubernetes.io/{ingress,egress}-bandwidth), waiting for the pod like PodLabels.
func (c *PodCache) PodAnnotations(ctx context.Context, namespace, name string) (map[string]string, error) {
	p, _, err := c.lookup(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return maps.Clone(p.Annotations), nil
}

// WatchBandwidth calls fn with a pod's namespace, name and bandwidth annotations
// (kubernetes.io/{ingress,egress}-bandwidth, nil when it has none) for every pod of the
// node the cache lists (also after a watch is re-established) and whenever a watched
// pod's annotations change. fn runs on the informer's goroutine for this handler: it
// should not block for long.
func (c *PodCache) WatchBandwidth(fn func(namespace, name string, ann map[string]string)) error {
	call := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok {
			fn(p.Namespace, p.Name, maps.Clone(p.Annotations))
		}
	}
	_, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { call(obj) },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if ok1 && ok2 && maps.Equal(o.Annotations, n.Annotations) {
				return // (the cache keeps only the bandwidth annotations: trimPod)
			}
			call(newObj)
		},
	})
	if err != nil {
		return fmt.Errorf("pod cache: bandwidth handler: %w", err)
	}
	return nil
}

// lookup finds pod namespace/name (namespace "" = "default") and its namespace in the
// cache, waiting up to the cache's wait for one not seen yet (PodLabels).
func (c *PodCache) lookup(ctx context.Context, namespace, name string) (*corev1.Pod, *corev1.Namespace, error) {
	if name == "" {
		return nil, nil, errors.New("kubernetes: pod name is empty")
	}
	if namespace == "" {
		namespace = "default"
	}
	timer := time.NewTimer(c.wait)
	defer timer.Stop()
	for {
		c.mu.Lock()
		changed := c.changed
		c.mu.Unlock()
		p, err := c.lister.Pods(namespace).Get(name)
		var ns *corev1.Namespace
		if err == nil {
			ns, err = c.nsLister.Get(namespace)
		}
		switch {
		case err == nil:
			return p, ns, nil
		case !apierrors.IsNotFound(err):
			return nil, nil, fmt.Errorf("kubernetes: pod %s/%s: %w", namespace, name, err)
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil, nil, c.notFound(ctx, namespace, name)
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("kubernetes: pod %s/%s: %w", namespace, name, ctx.Err())
		}
	}
}

// notFound explains a pod that did not appear; on this (error) path only it asks the API
// server whether it answers at all, so a down API server is named as the cause.
func (c *PodCache) notFound(ctx context.Context, namespace, name string) error {
	c.mu.Lock()
	lastErr := c.lastErr
	c.mu.Unlock()
	if lastErr == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.cs.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(pctx)
		cancel()
		if err != nil {
			lastErr = fmt.Errorf("the API server is not answering: %w", err)
		}
	}
	switch {
	case !c.informer.HasSynced() && lastErr != nil:
		return fmt.Errorf("kubernetes: pod %s/%s: %w: the API server has not answered the pod list of node %s within %s: %v", namespace, name, ErrPodNotFound, c.node, c.wait, lastErr)
	case lastErr != nil:
		return fmt.Errorf("kubernetes: pod %s/%s: %w on node %s after %s, and the pod watch is failing: %v", namespace, name, ErrPodNotFound, c.node, c.wait, lastErr)
	case !c.informer.HasSynced():
		return fmt.Errorf("kubernetes: pod %s/%s: %w: the pod list of node %s has not arrived within %s", namespace, name, ErrPodNotFound, c.node, c.wait)
	}
	return fmt.Errorf("kubernetes: pod %s/%s: %w on node %s after %s (is it bound to this node?)", namespace, name, ErrPodNotFound, c.node, c.wait)
}
