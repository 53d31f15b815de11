package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/cluster"
	"github.com/contivbpf/contivbpf/pkg/masterclient"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// fakeAccess answers EtcdAccess with errs in turn, then success.
type fakeAccess struct {
	errs  []error
	calls int
	got   model.EtcdAccessRequest
}

func (f *fakeAccess) EtcdAccess(_ context.Context, req model.EtcdAccessRequest) (model.EtcdAccessResponse, error) {
	f.calls++
	f.got = req
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return model.EtcdAccessResponse{}, err
	}
	return model.EtcdAccessResponse{Managed: true, User: "host:h1"}, nil
}

// TestEnrollEtcd: netplugin sends its registrations to netmaster's /plugin/etcdAccess
// before writing them; an unreachable netmaster is asked again, a refusal stops netplugin
// with netmaster's reason, and a netmaster without the route is no error.
func TestEnrollEtcd(t *testing.T) {
	regs := []cluster.ServiceInfo{{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}}
	f := &fakeAccess{errs: []error{errors.New("connection refused"), &masterclient.HTTPError{Status: 503}}}
	if err := enrollEtcd(context.Background(), f, regs, slog.Default()); err != nil || f.calls != 3 {
		t.Fatalf("after two failures: %v (%d calls), want success on the third", err, f.calls)
	}
	if len(f.got.Registrations) != 1 || f.got.Registrations[0] != (model.EtcdRegistration{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}) {
		t.Fatalf("sent %+v", f.got)
	}
	f = &fakeAccess{errs: []error{&masterclient.HTTPError{Status: 403, Message: "only an agent identity bound to its host"}}}
	if err := enrollEtcd(context.Background(), f, regs, slog.Default()); err == nil || !strings.Contains(err.Error(), "bound to its host") {
		t.Fatalf("refused: %v, want netmaster's reason", err)
	}
	f = &fakeAccess{errs: []error{&masterclient.HTTPError{Status: 404}}}
	if err := enrollEtcd(context.Background(), f, regs, slog.Default()); err != nil || f.calls != 1 {
		t.Fatalf("a netmaster without the route: %v (%d calls)", err, f.calls)
	}
}

// TestEnrollWhenAuthTurnsOn: a netplugin started on an etcd without auth enrolls its
// registrations once auth comes on (netmaster upgraded to, or restarted with, etcd RBAC),
// not before and only once: otherwise their keepalive is refused and they lapse.
func TestEnrollWhenAuthTurnsOn(t *testing.T) {
	regs := []cluster.ServiceInfo{{ServiceName: "netplugin", HostAddr: "10.0.0.1", Port: 9002}}
	var polls atomic.Int32
	authOn := func(context.Context) (bool, error) {
		switch polls.Add(1) {
		case 1:
			return false, errors.New("etcd unreachable")
		case 2, 3:
			return false, nil
		}
		return true, nil
	}
	f := &fakeAccess{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	enrollWhenAuthOn(ctx, authOn, f, regs, time.Millisecond, slog.Default())
	if f.calls != 1 || polls.Load() != 4 || len(f.got.Registrations) != 1 {
		t.Fatalf("%d enrollments after %d polls (%+v), want 1 after 4", f.calls, polls.Load(), f.got)
	}
}
