package k8stest

import (
	"context"
	"net"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLaunchChoosesAnotherPortWhenTaken: a port found free and taken before the server
// binds it (CI saw kube-apiserver exit with "address already in use") costs a retry, not
// the test. The first ports offered to etcd and to the API server are held open.
func TestLaunchChoosesAnotherPortWhenTaken(t *testing.T) {
	NeedAPIServer(t)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	offered := 0
	pick := func() (int, error) {
		offered++
		// The API server's port is chosen first, then etcd's client and peer ports:
		// the first offer to each is the held port.
		if offered == 1 || offered == 2 || offered == 5 {
			return taken, nil
		}
		return freePort()
	}
	s, err := Launch(context.Background(), Options{freePort: pick})
	if err != nil {
		t.Fatalf("launch with a held port offered first: %v", err)
	}
	defer s.Close()
	if _, err := s.Admin.CoreV1().Namespaces().Get(context.Background(), "kube-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("API server after retries: %v", err)
	}
	if offered < 6 {
		t.Fatalf("ports offered = %d, want retries for both etcd and the API server", offered)
	}
}
