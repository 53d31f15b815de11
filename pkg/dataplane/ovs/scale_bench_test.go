package ovs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// BenchmarkServiceChange measures one service change on a private OVS that holds 1,000
// services of one tenant, 3 backends each (as root: go test -run - -bench ServiceChange
// ./pkg/dataplane/ovs). create adds services beyond the 1,000, add_backend gives one a
// fourth backend, remove_backend takes it away again (its translations are flushed).
func BenchmarkServiceChange(b *testing.B) {
	d := serviceDriver(b, 1000)
	ctx := context.Background()
	b.Run("create", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := d.UpsertService(ctx, benchService(1000+i, 3)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("add_backend", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := d.UpsertService(ctx, benchService(i%1000, 4)); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := d.UpsertService(ctx, benchService(i%1000, 3)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("remove_backend", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			if err := d.UpsertService(ctx, benchService(i%1000, 4)); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := d.UpsertService(ctx, benchService(i%1000, 3)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchService(i int, backends int) dataplane.Service {
	s := dataplane.Service{ID: fmt.Sprintf("svc%d:default", i),
		VIP:   netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
		Ports: []dataplane.ServicePort{{Proto: 6, Port: 80, TargetPort: 8080}}}
	for k := 0; k < backends; k++ {
		s.Backends = append(s.Backends, netip.AddrFrom4([4]byte{10, 1, 0, byte(1 + (i+k)%200)}))
	}
	return s
}

// serviceDriver is a driver on a private OVS in a new namespace holding n services.
func serviceDriver(b *testing.B, n int) *Driver {
	needOVS(b)
	ns := newNS(b, testID(), "bh")
	dir := b.TempDir()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = Private{Dir: dir}.Stop(ctx)
	})
	ctx := context.Background()
	d, err := New(ctx, dataplane.HostConfig{Host: "bh", NetNS: nsPath(ns)}, Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close() })
	st := dataplane.State{Networks: []dataplane.Network{vxNet}}
	for i := 0; i < n; i++ {
		st.Services = append(st.Services, benchService(i, 3))
	}
	if err := d.Sync(ctx, st); err != nil {
		b.Fatal(err)
	}
	return d
}
