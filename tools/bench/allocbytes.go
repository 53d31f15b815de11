package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
	"github.com/contivbpf/contivbpf/pkg/master"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// cpAllocBytesStage measures what one /plugin/allocAddress writes to etcd (keys and values
// of every put, read back from etcd's watch history) in a /24, whose allocation map is
// Contiv's inline bitmap, and in a /10, whose map is chunked (pkg/master/addrmap.go).
// Goal: equal (before chunks a /10 allocation wrote ~700 KB). netmaster runs in this
// process on a private embedded etcd on loopback.
func cpAllocBytesStage(ctx context.Context, cfg config, w io.Writer, r *report) error {
	hs, store, stop, err := inProcessMaster(ctx, cfg.prefix+"ab-", 0, master.Config{FwdMode: "routing", ClusterMode: "docker"})
	if err != nil {
		return err
	}
	defer stop()
	raw := store.Client()
	post := func(path string, body any) error {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hs.Client().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, strings.TrimSpace(string(out)))
		}
		return nil
	}
	const n = 500
	per := map[string]float64{}
	var rows [][]string
	for _, c := range []struct{ label, name, subnet, gw string }{
		{"24", "ab24", "10.61.1.0/24", "10.61.1.1"},
		{"10", "ab10", "10.128.0.0/10", "10.128.0.1"},
	} {
		if err := post("/api/v1/networks/default:"+c.name+"/", model.Network{TenantName: "default", NetworkName: c.name,
			Encap: "vxlan", Subnet: c.subnet, Gateway: c.gw, NwType: "data"}); err != nil {
			return err
		}
		count := n
		if c.label == "24" {
			count = 250
		}
		from, err := raw.Get(ctx, "/contiv.io/none")
		if err != nil {
			return err
		}
		for i := 0; i < count; i++ {
			if err := post("/plugin/allocAddress", model.AllocAddressRequest{NetworkID: c.name + ".default"}); err != nil {
				return err
			}
		}
		to, err := raw.Get(ctx, "/contiv.io/none")
		if err != nil {
			return err
		}
		total, err := statetest.PutBytes(ctx, raw, "/contiv.io/", from.Header.Revision, to.Header.Revision)
		if err != nil {
			return err
		}
		per[c.label] = float64(total) / float64(count)
		rows = append(rows, []string{"/" + c.label, fmt.Sprint(count), fmt.Sprint(total), fmt.Sprintf("%.0f", per[c.label])})
		r.add("cp.alloc_bytes_"+c.label, float64(int64(per[c.label]+0.5)), "bytes")
	}
	ratio := per["10"] / per["24"]
	r.add("cp.alloc_bytes_10_vs_24_ratio", round2(ratio), "ratio")
	table(w, fmt.Sprintf("control plane: etcd bytes written per allocAddress (keys + values of every put); /10 vs /24 = %.2f (goal 1.0)", ratio),
		[]string{"subnet", "allocations", "bytes", "bytes per allocation"}, rows)
	return nil
}

// freeLoopback returns a loopback host:port that was free a moment ago.
// inProcessMaster runs a netmaster configured by mc in this process, on a private embedded
// etcd (backend quota etcdQuota, 0: etcd's default) in a temp dir named after prefix, and
// serves it on loopback; stop ends all and removes the dir.
func inProcessMaster(ctx context.Context, prefix string, etcdQuota int64, mc master.Config) (*httptest.Server, *state.Store, func(), error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, nil, nil, err
	}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	stops = append(stops, func() { os.RemoveAll(dir) })
	cu, pu := "http://"+freeLoopback(), "http://"+freeLoopback()
	srv, err := etcdembed.Start(ctx, etcdembed.Config{DataDir: dir, ClientURL: cu, PeerURL: pu, QuotaBytes: etcdQuota})
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	stops = append(stops, func() { srv.Close() })
	store, err := state.Open(ctx, []string{cu})
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	stops = append(stops, func() { store.Close() })
	mc.Store = store
	m, err := master.New(ctx, mc)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	hs := httptest.NewServer(m.Handler())
	stops = append(stops, hs.Close)
	return hs, store, stop, nil
}

func freeLoopback() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer l.Close()
	return l.Addr().String()
}
