package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/contivbpf/contivbpf/internal/testkit/cpbench"
	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/pki"
	"github.com/contivbpf/contivbpf/pkg/tlsconf"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// cpTLSStage compares the REST API over HTTPS with token authentication against plain
// HTTP in the same run: two netmasters, each leading its own embedded etcd in netns ns,
// measured round by round alternately (cp.tls_vs_plain_<op>_ratio; goal >= 0.8).
func cpTLSStage(ctx context.Context, cfg config, ns, dir string, w io.Writer, r *report) error {
	ca, err := pki.NewCA("cbk-ca")
	if err != nil {
		return err
	}
	caPath, err := ca.WriteCA(dir, "ca.crt")
	if err != nil {
		return err
	}
	srv, err := ca.Issue(pki.Options{CommonName: "netmaster", Hosts: []string{"127.0.0.1"}, Server: true})
	if err != nil {
		return err
	}
	sc, sk, err := srv.Write(dir, "netmaster")
	if err != nil {
		return err
	}
	tb := make([]byte, 16)
	_, _ = rand.Read(tb)
	token := hex.EncodeToString(tb)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(token+" admin bench\n"), 0o600); err != nil {
		return err
	}
	type node struct {
		name, url string
		client    *http.Client
		d         *daemon
	}
	plainClient := nsHTTPClient(ns)
	tc, err := tlsconf.Client(tlsconf.Files{CA: caPath}, "bench")
	if err != nil {
		return err
	}
	tlsTr := plainClient.Transport.(*http.Transport).Clone()
	tlsTr.TLSClientConfig = tc
	tlsClient := &http.Client{Timeout: 30 * time.Second, Transport: auth.Bearer(token, tlsTr)}
	nodes := []*node{
		{name: "plain", url: "http://127.0.0.1:9995", client: plainClient},
		{name: "tls", url: "https://127.0.0.1:9996", client: tlsClient},
	}
	for i, n := range nodes {
		addr := fmt.Sprintf("127.0.0.1:%d", 9995+i)
		args := []string{"--etcd-data-dir", filepath.Join(dir, "etcd-"+n.name),
			"--etcd-listen-client-url", fmt.Sprintf("http://127.0.0.1:%d", 2391+2*i), "--etcd-listen-peer-url", fmt.Sprintf("http://127.0.0.1:%d", 2392+2*i),
			"--listen-url", addr, "--control-url", addr, "--rpc-port", "0", "--mode", "kubernetes", "--log-level", "warn"}
		if n.name == "tls" {
			args = append(args, "--tls-cert", sc, "--tls-key", sk, "--auth-tokens", tokens)
		} else {
			args = append(args, "--insecure")
		}
		d, err := startDaemon(ns, "netmaster-"+n.name, filepath.Join(dir, "netmaster-"+n.name+".log"),
			append([]string{filepath.Join(cfg.bin, "netmaster")}, args...)...)
		if err != nil {
			return err
		}
		defer d.stop()
		n.d = d
		if err := waitState(ctx, n.client, n.url, "leader", 30*time.Second); err != nil {
			return fmt.Errorf("%s netmaster: %w (%s)", n.name, err, d.tail())
		}
	}
	sum := map[string]map[string]float64{"plain": {}, "tls": {}}
	const rounds = 3
	for round := 0; round < rounds; round++ {
		for _, n := range nodes {
			res, err := cpbench.Run(ctx, cpbench.Options{NetmasterURLs: []string{n.url}, Creates: cfg.cpCreates / rounds,
				Lists: cfg.cpCreates / rounds, Allocs: cfg.cpAllocs / rounds, Client: n.client, Tenant: "default"})
			if err != nil {
				return fmt.Errorf("%s round %d: %w (%s)", n.name, round, err, n.d.tail())
			}
			for op, o := range map[string]cpbench.Op{"create": res.Create, "list": res.List, "alloc": res.Alloc} {
				if o.Errors > 0 {
					return fmt.Errorf("%s round %d: %d %s errors, first %s", n.name, round, o.Errors, op, o.FirstErr)
				}
				sum[n.name][op] += o.PerSecond / rounds
			}
		}
	}
	var rows [][]string
	for _, op := range []string{"create", "list", "alloc"} {
		ratio := sum["tls"][op] / sum["plain"][op]
		rows = append(rows, []string{op, fmt.Sprintf("%.0f", sum["plain"][op]), fmt.Sprintf("%.0f", sum["tls"][op]), fmt.Sprintf("%.2f", ratio)})
		r.add("cp.tls."+op+"_per_s", float64(int64(sum["tls"][op]+0.5)), "ops/s")
		r.add("cp.tls_vs_plain_"+op+"_ratio", round2(ratio), "ratio")
	}
	table(w, fmt.Sprintf("control plane: HTTPS + bearer token vs plain HTTP (one netmaster each on its own embedded etcd, %d alternating rounds)", rounds),
		[]string{"request", "plain per s", "TLS+token per s", "ratio (goal >= 0.8)"}, rows)
	return unauthBodies(ctx, ns, "127.0.0.1:9996", tc, nodes[1].d, w, r)
}

// unauthBodies measures cp.unauth_body_rss_mb: the TLS netmaster's resident set while
// unauthBodyConns connections without credentials each announce and send a 1 MiB request
// body (goal <= 200 MB; before bodies were read after authentication, 1,500 of them took
// netmaster from 89 MB to 4 GB).
func unauthBodies(ctx context.Context, ns, addr string, tc *tls.Config, d *daemon, w io.Writer, r *report) error {
	const unauthBodyConns = 1500
	pid := d.cmd.Process.Pid
	before, err := processRSS(pid)
	if err != nil {
		return err
	}
	body := bytes.Repeat([]byte("{"), 1<<20)
	tlsFor := tc.Clone()
	tlsFor.ServerName, _, _ = net.SplitHostPort(addr)
	var firstOther atomic.Value
	var wg sync.WaitGroup
	var refused, other atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	for i := 0; i < unauthBodyConns; i++ {
		raw, err := sim.DialContext(ctx, ns, "tcp", addr)
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		c := tls.Client(raw, tlsFor)
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(c, "POST /api/v1/tenants/x/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
			go c.Write(body) // (the answer may come before the body is taken: it is not read)
			line, err := bufio.NewReader(c).ReadString('\n')
			if strings.Contains(line, " 401 ") {
				refused.Add(1)
			} else {
				other.Add(1)
				firstOther.CompareAndSwap(nil, fmt.Sprintf("%q %v", line, err))
			}
		}()
	}
	time.Sleep(2 * time.Second) // the connections open, their bodies on the way
	peak, err := processRSS(pid)
	if err != nil {
		return err
	}
	wg.Wait()
	mb := func(b int64) float64 { return float64(b) / (1 << 20) }
	r.add("cp.unauth_body_rss_mb", round1(mb(peak)), "MB")
	fmt.Fprintf(w, "control plane: %d unauthenticated connections announcing 1 MiB bodies: netmaster RSS %.0f MB (%.0f MB before; goal <= 200), %d answered 401, %d otherwise\n",
		unauthBodyConns, mb(peak), mb(before), refused.Load(), other.Load())
	if refused.Load() == 0 {
		return fmt.Errorf("no unauthenticated body request was answered 401 (%d otherwise, first: %v)", other.Load(), firstOther.Load())
	}
	return nil
}
