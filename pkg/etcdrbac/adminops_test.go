package etcdrbac

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// TestAgentUserRefusedAdminOps: beyond single keys, an agent's etcd user cannot reach
// another host's keys through a lease (revoke it, keep it alive, attach its own key to it),
// a transaction's else branch or a prefix/from-key range starting at its own key, nor run
// etcd's administrative operations (compaction, defragmentation, alarm disarm, snapshot,
// member add, leader move, auth disable, user and role changes).
func TestAgentUserRefusedAdminOps(t *testing.T) {
	ctx, open, _, m := rbacOn(t)
	for _, h := range []string{"h1", "h2"} {
		if err := m.EnsureHost(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	c2 := open(UserOf("h2")).Client()
	l2, err := c2.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Put(ctx, vxlan.HostVTEPKey("h2"), "x", clientv3.WithLease(l2.ID)); err != nil {
		t.Fatal(err)
	}
	c := open(UserOf("h1")).Client()
	r, err := c.Get(ctx, vxlan.HostVTEPKey("h1"))
	if err != nil {
		t.Fatal(err)
	}
	ep := c.Endpoints()[0]
	cmpOther := clientv3.Compare(clientv3.Version(model.BgpOperKey("h2")), "=", 0)
	for what, op := range map[string]func() error{
		"revoke h2's lease":     func() error { _, err := c.Revoke(ctx, l2.ID); return err },
		"keep h2's lease alive": func() error { _, err := c.KeepAliveOnce(ctx, l2.ID); return err },
		"attach its key to h2 lease": func() error {
			_, err := c.Put(ctx, vxlan.HostVTEPKey("h1"), "y", clientv3.WithLease(l2.ID))
			return err
		},
		"txn writing h2's key in else": func() error {
			_, err := c.Txn(ctx).If(cmpOther).Then(clientv3.OpPut(vxlan.HostVTEPKey("h1"), "z")).Else(clientv3.OpPut(model.BgpOperKey("h2"), "z")).Commit()
			return err
		},
		"delete prefix of its key": func() error { _, err := c.Delete(ctx, vxlan.HostVTEPKey("h1"), clientv3.WithPrefix()); return err },
		"delete from its key":      func() error { _, err := c.Delete(ctx, vxlan.HostVTEPKey("h1"), clientv3.WithFromKey()); return err },
		"compact":                  func() error { _, err := c.Compact(ctx, r.Header.Revision); return err },
		"defragment":               func() error { _, err := c.Defragment(ctx, ep); return err },
		"disarm alarms":            func() error { _, err := c.AlarmDisarm(ctx, &clientv3.AlarmMember{Alarm: 1}); return err },
		"member add":               func() error { _, err := c.MemberAdd(ctx, []string{"http://127.0.0.1:1"}); return err },
		"move leader":              func() error { _, err := c.MoveLeader(ctx, 1); return err },
		"auth disable":             func() error { _, err := c.AuthDisable(ctx); return err },
		"user add":                 func() error { _, err := c.UserAdd(ctx, "evil", "pw"); return err },
		"grant itself root":        func() error { _, err := c.UserGrantRole(ctx, UserOf("h1"), "root"); return err },
		"widen its role": func() error {
			_, err := c.RoleGrantPermission(ctx, UserOf("h1"), "/", "\x00", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		"revoke h2's role": func() error {
			_, err := c.RoleRevokePermission(ctx, UserOf("h2"), vxlan.HostVTEPKey("h2"), "")
			return err
		},
		"snapshot": func() error {
			rc, err := c.Snapshot(ctx)
			if err == nil {
				defer rc.Close()
				_, err = rc.Read(make([]byte, 64))
			}
			return err
		},
	} {
		if err := op(); err == nil {
			t.Errorf("h1's etcd user may %s", what)
		}
	}
	if resp, err := c2.Get(ctx, vxlan.HostVTEPKey("h2")); err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(l2.ID) {
		t.Errorf("h2's leased key after h1's attempts: %v %v", resp, err)
	}
}
