package sim

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestExternalEtcdCluster: netmaster and the agents on a 3-member external etcd cluster
// (--etcd-endpoints of all members) instead of netmaster's embedded etcd; containers on
// two hosts reach each other, and after the member every client listed first is killed
// the cluster keeps working: a new container is attached and reached. A failed attach
// leaves nothing behind.
func TestExternalEtcdCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := startCluster(t, ctx, Config{Hosts: 2, EtcdMembers: 3})
	if len(c.EtcdEndpoints()) != 3 {
		t.Fatalf("etcd endpoints %v, want 3 members", c.EtcdEndpoints())
	}
	if err := c.CreateNetwork(ctx, "default", "etnet", "vxlan", "10.106.1.0/24", "10.106.1.1"); err != nil {
		t.Fatal(err)
	}
	a, err := c.AddContainer(ctx, c.Hosts[0], "eta", "default", "etnet")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AddContainer(ctx, c.Hosts[1], "etb", "default", "etnet")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := a.Ping(ctx, b.IP.Addr(), 3); err != nil {
		t.Fatalf("a → b over the external etcd cluster: %v\n%s", err, out)
	}
	// A failed attach leaves no namespace behind, so the same pod can be tried again (as
	// below, where an attach during etcd's leader change may fail once).
	if _, err := c.AddContainer(ctx, c.Hosts[1], "etc", "default", "no-such-net"); err == nil {
		t.Fatal("attached to a network that does not exist")
	}
	if _, err := os.Stat(NetNSPath(c.Hosts[1].Name + "-etc")); !os.IsNotExist(err) {
		t.Errorf("the failed attach left its namespace: %v", err)
	}
	c.etcd[0].Kill()
	var late *Container
	eventually(t, "a container attached with one etcd member down", 60*time.Second, func() error {
		var err error
		if late == nil {
			late, err = c.AddContainer(ctx, c.Hosts[1], "etc", "default", "etnet")
		}
		return err
	})
	eventually(t, "the new container reached across hosts", 30*time.Second, func() error {
		if out, err := a.Ping(ctx, late.IP.Addr(), 1); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}
