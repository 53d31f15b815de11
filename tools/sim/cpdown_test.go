package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestControlPlaneDown: with netmaster and its etcd stopped, the agent's /healthz says
// "degraded" (the datapath keeps forwarding) and a CNI ADD fails with a message naming
// netmaster/etcd within seconds instead of hanging until the runtime gives up.
func TestControlPlaneDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 1})
	h := c.Hosts[0]
	if err := c.CreateNetwork(ctx, "default", "cpnet", "vxlan", "10.105.1.0/24", "10.105.1.1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Master.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "healthz degraded", 20*time.Second, func() error {
		body, err := h.HealthBody(ctx)
		if err != nil || !strings.HasPrefix(body, "degraded: etcd unreachable") {
			return fmt.Errorf("healthz %q %v", body, err)
		}
		return nil
	})
	start := time.Now()
	_, err := c.AddContainer(ctx, h, "late", "default", "cpnet")
	if err == nil {
		t.Fatal("CNI ADD succeeded with netmaster and etcd down")
	}
	if !strings.Contains(err.Error(), "did not answer within") {
		t.Errorf("CNI ADD error does not say what is unreachable: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second { // a hang detector, not a speed goal
		t.Errorf("CNI ADD took %s to fail", d)
	}
}
