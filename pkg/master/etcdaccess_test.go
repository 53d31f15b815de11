package master

import (
	"context"
	"strings"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/etcdrbac"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// unmanagedAccess is the etcdrbac.Manager of a netmaster that joined an etcd whose auth
// is off (etcdrbac.ErrNotManaged).
type unmanagedAccess struct{}

func (unmanagedAccess) Managing(context.Context) error { return etcdrbac.ErrNotManaged }

func (unmanagedAccess) Enroll(context.Context, string, []model.EtcdRegistration) error {
	return etcdrbac.ErrNotManaged
}

// TestEtcdAccessUnmanaged: a netmaster that joined an etcd whose auth is off answers
// /plugin/etcdAccess Managed false to every agent, bound to its host or not (an agent
// token shared by every host is fine without auth: a 403 would stop its netplugin).
func TestEtcdAccessUnmanaged(t *testing.T) {
	first := newEnv(t, "routing")
	e := newEnvOn(t, first.store, first.url, "routing", func(c *Config) { c.EtcdAccess = unmanagedAccess{} })
	code, body := e.do("POST", "/plugin/etcdAccess", `{"Registrations":[{"ServiceName":"netplugin","HostAddr":"10.0.0.1","Port":9002}]}`)
	if code != 200 || !strings.Contains(body, `"Managed":false`) {
		t.Errorf("unbound agent, auth off: %d %s, want 200 Managed false", code, body)
	}
}
