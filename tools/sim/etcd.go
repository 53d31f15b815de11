package sim

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// etcdURLs are the client and peer URLs of external etcd member i (Config.EtcdMembers):
// ports 2379+2i and 2380+2i on the first host's underlay address.
func (c *Cluster) etcdURLs(i int) (client, peer string) {
	return fmt.Sprintf("http://%s:%d", c.MasterIP, EtcdPort+2*i), fmt.Sprintf("http://%s:%d", c.MasterIP, EtcdPort+2*i+1)
}

// EtcdEndpoints is every etcd client URL netmaster and the agents are given: the embedded
// etcd's, or each member of the external cluster.
func (c *Cluster) EtcdEndpoints() []string {
	if c.cfg.EtcdMembers == 0 {
		return []string{c.EtcdURL()}
	}
	out := make([]string, c.cfg.EtcdMembers)
	for i := range out {
		out[i], _ = c.etcdURLs(i)
	}
	return out
}

// startEtcd runs the external etcd cluster (Debian's etcd, one process per member, data
// under the work dir) in the first host's namespace and waits until every member is
// healthy.
func (c *Cluster) startEtcd(ctx context.Context) error {
	var initial []string
	for i := 0; i < c.cfg.EtcdMembers; i++ {
		_, peer := c.etcdURLs(i)
		initial = append(initial, fmt.Sprintf("m%d=%s", i, peer))
	}
	for i := 0; i < c.cfg.EtcdMembers; i++ {
		client, peer := c.etcdURLs(i)
		name := fmt.Sprintf("m%d", i)
		p, err := startProcess("etcd "+name, c.Hosts[0].Name, filepath.Join(c.WorkDir, "etcd-"+name+".log"), []string{"etcd",
			"--name", name, "--data-dir", filepath.Join(c.WorkDir, "etcd-"+name),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", c.Prefix,
			"--initial-cluster-state", "new", "--max-txn-ops", "8192", "--quota-backend-bytes", "8589934592"})
		if err != nil {
			return err
		}
		c.etcd = append(c.etcd, p)
	}
	deadline := time.Now().Add(60 * time.Second)
	for i, p := range c.etcd {
		client, _ := c.etcdURLs(i)
		for {
			body, err := c.getText(ctx, c.Hosts[0].Name, client+"/health")
			if err == nil && strings.Contains(body, `"health":"true"`) {
				break
			}
			if ok, perr := p.Exited(); ok {
				return fmt.Errorf("sim: etcd member m%d exited: %v\n%s", i, perr, p.LogTail(20))
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sim: etcd member m%d not healthy after 60s: %v %s\n%s", i, err, body, p.LogTail(20))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	c.log.Info("sim: external etcd up", "members", len(c.etcd), "endpoints", strings.Join(c.EtcdEndpoints(), ","))
	return nil
}
