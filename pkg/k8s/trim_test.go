package k8s

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTrimPolicyPodKeepsNode: the NetworkPolicy cache keeps a pod's node (only that host's
// endpoints are the pod's, podEndpoints in pkg/k8ssync; without it no endpoint was and
// every NetworkPolicy was left without pods), its labels and its named ports.
func TestTrimPolicyPodKeepsNode(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "prod", Labels: map[string]string{"app": "db"}},
		Spec: corev1.PodSpec{NodeName: "h1", Containers: []corev1.Container{{Name: "c", Image: "x",
			Ports: []corev1.ContainerPort{{Name: "pg", ContainerPort: 5432}}}}}}
	got, err := trimPolicyPod(p)
	if err != nil {
		t.Fatal(err)
	}
	tp := got.(*corev1.Pod)
	if tp.Spec.NodeName != "h1" || tp.Labels["app"] != "db" || len(tp.Spec.Containers) != 1 || tp.Spec.Containers[0].Ports[0].Name != "pg" || tp.Spec.Containers[0].Image != "" {
		t.Errorf("trimmed pod %+v", tp)
	}
}

// TestTrimPodKeepsBandwidth: the node's pod cache keeps the bandwidth annotations the
// agent enforces (docs/netprofiles.md) and no other annotation.
func TestTrimPodKeepsBandwidth(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "prod", Annotations: map[string]string{
		"kubernetes.io/ingress-bandwidth": "10M", "kubernetes.io/egress-bandwidth": "1G", "big": "x"}}}
	got, err := trimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	a := got.(*corev1.Pod).Annotations
	if len(a) != 2 || a["kubernetes.io/ingress-bandwidth"] != "10M" || a["kubernetes.io/egress-bandwidth"] != "1G" {
		t.Errorf("trimmed annotations %v", a)
	}
}
