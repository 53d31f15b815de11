package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/contivbpf/contivbpf/internal/testkit/statetest"
	"github.com/contivbpf/contivbpf/pkg/etcdembed"
)

// TestHealthzAndMetrics: /healthz says ok, warns once etcd's database passes 80% of the
// quota, answers 503 with etcd's NOSPACE alarm and 503 naming etcd when etcd is down;
// /metrics exports the sizes and alarms.
func TestHealthzAndMetrics(t *testing.T) {
	cu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	const quota = 16 << 20
	srv, err := etcdembed.Start(context.Background(), etcdembed.Config{DataDir: t.TempDir(), ClientURL: cu, PeerURL: pu, QuotaBytes: quota})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	p := startNetmaster(t, "nm-health", cu, "--etcd-quota-bytes", fmt.Sprint(quota))
	eventually(t, 30*time.Second, "healthz ok", func() error {
		st, body, err := call("GET", p.url+"/healthz", "")
		if err != nil || st != 200 || body != "ok\n" {
			return fmt.Errorf("%d %q %v", st, body, err)
		}
		return nil
	})
	st, body, err := call("GET", p.url+"/metrics", "")
	if err != nil || st != 200 || !strings.Contains(body, "contiv_netmaster_etcd_reachable 1") ||
		!strings.Contains(body, "contiv_netmaster_etcd_quota_bytes 1.6777216e+07") || !strings.Contains(body, "contiv_netmaster_etcd_db_size_bytes") {
		t.Fatalf("/metrics: %d %v\n%s", st, err, body)
	}
	// API, object and IPAM figures; hostile paths land in the bounded "other" route.
	mustCall(t, "POST", p.url+"/api/v1/networks/default:mnet/", `{"tenantName":"default","networkName":"mnet","encap":"vxlan","subnet":"10.77.0.0/24","gateway":"10.77.0.1"}`, 200)
	mustCall(t, "POST", p.url+"/plugin/allocAddress", `{"NetworkID":"mnet.default"}`, 200)
	mustCall(t, "GET", p.url+"/api/v1/networks/default:nope/", "", 404)
	for i := 0; i < 5; i++ {
		_, _, _ = call("GET", p.url+fmt.Sprintf("/api/v1/junk%d/x/", i), "")
	}
	_, body, _ = call("GET", p.url+"/metrics", "")
	for _, want := range []string{
		`contiv_netmaster_api_requests_total{code="200",method="POST",route="/api/v1/networks/{key}/"} 1`,
		`contiv_netmaster_api_requests_total{code="404",method="GET",route="/api/v1/networks/{key}/"} 1`,
		`contiv_netmaster_api_requests_total{code="200",method="POST",route="/plugin/allocAddress"} 1`,
		`route="other"} 5`,
		`contiv_netmaster_api_request_seconds_count{method="POST",route="/plugin/allocAddress"} 1`,
		`contiv_netmaster_objects{kind="network"} 1`,
		`contiv_netmaster_ipam_addresses{network="mnet.default",state="allocated"} 1`,
		`contiv_netmaster_ipam_addresses{network="mnet.default",state="capacity"} 253`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "junk") {
		t.Error("a request path became a metric label")
	}

	// Fill etcd: /healthz warns before the quota is hit, and says so once etcd raised
	// its NOSPACE alarm (every write fails from then on).
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// Small steps (256 KiB): the warning band (80-100% of 16 MiB) is several steps wide.
	big := strings.Repeat("x", 256<<10)
	warned := false
	for i := 0; ; i++ {
		if i > 200 {
			t.Fatal("etcd never ran out of space")
		}
		if _, err := cli.Put(context.Background(), fmt.Sprintf("/fill/%d", i), big); err != nil {
			if !strings.Contains(err.Error(), "space exceeded") {
				t.Fatalf("fill %d: %v", i, err)
			}
			break
		}
		if _, body, _ := call("GET", p.url+"/healthz", ""); strings.HasPrefix(body, "warning: etcd database") {
			warned = true
		}
		// netmaster reads etcd's size on its own schedule: once the database is inside the
		// warning band, give it the time to notice before filling on (the fill itself
		// takes well under a second).
		if st, err := cli.Status(context.Background(), cu); err == nil && !warned && st.DbSize >= 16<<20*85/100 {
			eventually(t, 10*time.Second, "healthz warns inside the band", func() error {
				_, body, _ := call("GET", p.url+"/healthz", "")
				if !strings.HasPrefix(body, "warning: etcd database") {
					return fmt.Errorf("%q", body)
				}
				warned = true
				return nil
			})
		}
	}
	if !warned {
		t.Error("/healthz never warned before etcd ran out of space")
	}
	eventually(t, 10*time.Second, "healthz reports the alarm", func() error {
		st, body, err := call("GET", p.url+"/healthz", "")
		if err != nil || st != 503 || !strings.Contains(body, "NOSPACE") {
			return fmt.Errorf("%d %q %v", st, body, err)
		}
		return nil
	})
	if _, body, _ := call("GET", p.url+"/metrics", ""); !strings.Contains(body, "contiv_netmaster_etcd_alarms 1") {
		t.Errorf("metrics without the alarm:\n%s", body)
	}

	srv.Close()
	eventually(t, 15*time.Second, "healthz 503 while etcd is down", func() error {
		st, body, err := call("GET", p.url+"/healthz", "")
		if err != nil || st != 503 || !strings.Contains(body, "etcd unreachable") {
			return fmt.Errorf("%d %q %v", st, body, err)
		}
		return nil
	})
	if !p.alive() {
		t.Fatal("netmaster exited while etcd was down")
	}
}

// TestEmbeddedEtcdDefrag: space freed by compaction stays in etcd's file (and counts
// against the quota) until defragmentation; netmaster defragments its embedded etcd when
// enough is wasted.
func TestEmbeddedEtcdDefrag(t *testing.T) {
	_, cli, cu := embeddedNetmaster(t, "nm-defrag", "--etcd-defrag-min-bytes", fmt.Sprint(2<<20))
	ctx := context.Background()
	big := strings.Repeat("y", 1<<20)
	for i := 0; i < 8; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/waste/%d", i), big); err != nil {
			t.Fatal(err)
		}
	}
	// The file grows when the backend commits its batch (every 100 ms), not with each put:
	// the size "with the data" is the one after that.
	var full int64
	eventually(t, 10*time.Second, "etcd file holds the data", func() error {
		st, err := cli.Status(ctx, cu)
		if err != nil {
			return err
		}
		if full = st.DbSize; full < 8<<20 {
			return fmt.Errorf("db size %d, want 8 MiB of data at least", full)
		}
		return nil
	})
	del, err := cli.Delete(ctx, "/waste/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, del.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "etcd file shrinks", func() error {
		st, err := cli.Status(ctx, cu)
		if err != nil {
			return err
		}
		if st.DbSize > full/2 {
			return fmt.Errorf("db size %d (was %d with the data, in use %d)", st.DbSize, full, st.DbSizeInUse)
		}
		return nil
	})
}

// TestEmbeddedEtcdRecoversFromNoSpace: a caller fills the embedded etcd's quota (NOSPACE:
// etcd takes only reads and deletes, every API write fails); once what it wrote is
// deleted, netmaster compacts the history, defragments and lifts the alarm by itself, and
// the API takes writes again, without an operator. Data that still fills the quota keeps
// the alarm (nothing is lifted that would trip again at once).
func TestEmbeddedEtcdRecoversFromNoSpace(t *testing.T) {
	p, cli, _ := embeddedNetmaster(t, "nm-nospace", "--etcd-quota-bytes", fmt.Sprint(16<<20), "--etcd-defrag-min-bytes", fmt.Sprint(64<<20))
	ctx := context.Background()
	// Fill it with live data: 1 MiB values under distinct keys, until etcd refuses. (Not
	// rewrites of a few keys: their history is waste netmaster's reclaim pass may compact
	// away on its own, lifting the alarm before the caller deleted anything.)
	// etcd trips NOSPACE on its file's size, which can hold pages of history netmaster's
	// own pass has not yet defragmented away: an alarm while the live data is still below
	// the room netmaster needs is lifted again (rightly). So after each NOSPACE the fill
	// waits for netmaster's verdict: the alarm lifted (fill on), or netmaster saying the
	// live data fills the quota (its log), after which it keeps the alarm.
	big := strings.Repeat("z", 1<<20)
	full := false
	verdict := func() bool {
		t.Helper()
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if b, _ := os.ReadFile(p.log); strings.Contains(string(b), "embedded etcd is full of live data") {
				return true
			}
			al, err := cli.AlarmList(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(al.Alarms) == 0 {
				return false
			}
		}
		t.Fatal("no verdict from netmaster on the NOSPACE alarm within 60 s")
		return false
	}
	for i := 0; i < 400 && !full; i++ {
		_, err := cli.Put(ctx, fmt.Sprintf("/fill/%d", i), big)
		if err != nil && !strings.Contains(err.Error(), "database space exceeded") {
			t.Fatalf("put %d: %v", i, err)
		}
		if err != nil {
			full = verdict()
		}
	}
	if !full {
		t.Fatal("400 MiB written into a 16 MiB quota without NOSPACE over live data")
	}
	tenant := func(name string) (int, string) {
		st, body, err := call("POST", p.url+"/api/v1/tenants/"+name+"/", `{"tenantName":"`+name+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		return st, body
	}
	// Writes fail until the caller deletes what filled it.
	if st, body := tenant("t-full"); st == 200 {
		t.Fatalf("tenant create while etcd is full: 200 %s", body)
	}
	if _, err := cli.Delete(ctx, "/fill/", clientv3.WithPrefix()); err != nil {
		t.Fatalf("delete under NOSPACE: %v", err)
	}
	eventually(t, 30*time.Second, "API writes again after the delete", func() error {
		if st, body := tenant("t-back"); st != 200 {
			return fmt.Errorf("tenant create: %d %s", st, body)
		}
		return nil
	})
	alarms, err := cli.AlarmList(ctx)
	if err != nil || len(alarms.Alarms) != 0 {
		t.Errorf("alarms after recovery: %v, %v", alarms.Alarms, err)
	}
	eventually(t, 10*time.Second, "healthz 200", func() error {
		if st, body, err := call("GET", p.url+"/healthz", ""); err != nil || st != 200 {
			return fmt.Errorf("%d %q %v", st, body, err)
		}
		return nil
	})
}

// embeddedNetmaster starts netmaster name on an embedded etcd of its own, looking after its
// space every 300 ms (extra: more flags), waits for /healthz 200 and returns it with a
// client of that etcd and the etcd's client URL.
func embeddedNetmaster(t *testing.T, name string, extra ...string) (*proc, *clientv3.Client, string) {
	t.Helper()
	cu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	pu := fmt.Sprintf("http://127.0.0.1:%d", statetest.FreePort(t))
	p := startNetmaster(t, name, "", append([]string{"--etcd-data-dir", t.TempDir(), "--etcd-listen-client-url", cu,
		"--etcd-listen-peer-url", pu, "--etcd-defrag-interval", "300ms"}, extra...)...)
	eventually(t, 30*time.Second, "netmaster up", func() error {
		st, body, err := call("GET", p.url+"/healthz", "")
		if err != nil || st != 200 {
			return fmt.Errorf("%d %q %v", st, body, err)
		}
		return nil
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{cu}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return p, cli, cu
}
