// Package cpbench measures netmaster's control-plane throughput over its real REST API:
// object creates, lists and /plugin/allocAddress per second, spreading requests over one or
// more netmaster URLs (followers proxy to the leader, so two URLs measure the proxied path).
// make bench calls Run with one and with two netmasters; it never asserts thresholds.
//
// It only speaks HTTP; it knows nothing about etcd or the master's internals.
package cpbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options says what to measure. Zero values take the defaults in brackets.
type Options struct {
	// NetmasterURLs are base URLs ("http://127.0.0.1:9999"); requests go round-robin. Required.
	NetmasterURLs []string
	// Creates is the number of networks created [200]; Lists the number of GET
	// /api/v1/networks/ [200]; Allocs the number of allocAddress calls [1000, at most 4000].
	Creates, Lists, Allocs int
	// Concurrency is the number of requests in flight [16].
	Concurrency int
	// Tenant the objects are created in ["default"].
	Tenant string
	// Client defaults to an http.Client with a 30 s timeout.
	Client *http.Client
}

// Op is the measurement of one kind of request.
type Op struct {
	Count     int
	Errors    int
	Elapsed   time.Duration
	PerSecond float64
	P50, P99  time.Duration
	FirstErr  string `json:",omitempty"`
}

func (o Op) String() string {
	return fmt.Sprintf("%d ok, %d errors in %s: %.0f/s (p50 %s, p99 %s)", o.Count, o.Errors,
		o.Elapsed.Round(time.Millisecond), o.PerSecond, o.P50.Round(10*time.Microsecond), o.P99.Round(10*time.Microsecond))
}

// Results of one Run.
type Results struct {
	Netmasters int
	Create     Op // POST /api/v1/networks/<tenant>:<name>/
	List       Op // GET /api/v1/networks/
	Alloc      Op // POST /plugin/allocAddress
	// Duplicates counts addresses handed out twice (must be 0).
	Duplicates int
	// CleanupErr is set when deleting the benchmark's networks failed.
	CleanupErr string `json:",omitempty"`
}

// Run creates Creates networks, lists networks Lists times, allocates Allocs addresses in
// one /20 network, then deletes everything it created. It fails only when the netmasters
// are unreachable or the setup requests fail; per-request failures are counted in Results.
func Run(ctx context.Context, o Options) (res Results, err error) {
	if len(o.NetmasterURLs) == 0 {
		return Results{}, errors.New("cpbench: NetmasterURLs is empty")
	}
	urls := make([]string, len(o.NetmasterURLs))
	for i, u := range o.NetmasterURLs {
		urls[i] = strings.TrimSuffix(u, "/")
	}
	o.NetmasterURLs = urls
	if o.Creates == 0 {
		o.Creates = 200
	}
	if o.Lists == 0 {
		o.Lists = 200
	}
	if o.Allocs == 0 {
		o.Allocs = 1000
	}
	if o.Allocs > 4000 || o.Allocs < 0 || o.Creates < 0 || o.Creates > 60000 || o.Lists < 0 {
		return Results{}, fmt.Errorf("cpbench: counts out of range (Allocs 0-4000, Creates 0-60000): %+v", o)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.Tenant == "" {
		o.Tenant = "default"
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency * 2}}
	}
	b := &bench{o: o, run: fmt.Sprintf("cpb%04x", rand.IntN(0x10000))}
	// Reachability check first, so a wrong URL is one clear error.
	for _, u := range o.NetmasterURLs {
		if st, body, err := b.do(ctx, u, http.MethodGet, "/api/v1/networks/", nil); err != nil || st != http.StatusOK {
			return Results{}, fmt.Errorf("cpbench: netmaster %s not serving: status %d %v %s", u, st, err, body)
		}
	}
	res = Results{Netmasters: len(o.NetmasterURLs)}
	var created []string
	var createdMu sync.Mutex
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := b.cleanup(cctx, created); err != nil {
			res.CleanupErr = err.Error()
		}
	}()

	res.Create = b.measure(ctx, o.Creates, func(i int, u string) error {
		name := fmt.Sprintf("%s-n%d", b.run, i)
		subnet := fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256)
		err := b.expect(ctx, u, http.MethodPost, "/api/v1/networks/"+o.Tenant+":"+name+"/", map[string]any{
			"tenantName": o.Tenant, "networkName": name, "encap": "vxlan", "subnet": subnet,
		}, nil)
		if err == nil {
			createdMu.Lock()
			created = append(created, name)
			createdMu.Unlock()
		}
		return err
	})
	res.List = b.measure(ctx, o.Lists, func(_ int, u string) error {
		return b.expect(ctx, u, http.MethodGet, "/api/v1/networks/", nil, nil)
	})

	if o.Allocs > 0 {
		pool := b.run + "-alloc"
		if err := b.expect(ctx, o.NetmasterURLs[0], http.MethodPost, "/api/v1/networks/"+o.Tenant+":"+pool+"/", map[string]any{
			"tenantName": o.Tenant, "networkName": pool, "encap": "vxlan", "subnet": "10.99.0.0/20", "gateway": "10.99.0.1",
		}, nil); err != nil {
			return res, fmt.Errorf("cpbench: create allocation network: %w", err)
		}
		createdMu.Lock()
		created = append(created, pool)
		createdMu.Unlock()
		var mu sync.Mutex
		seen := map[string]bool{}
		res.Alloc = b.measure(ctx, o.Allocs, func(_ int, u string) error {
			var out struct{ IPv4Address string }
			if err := b.expect(ctx, u, http.MethodPost, "/plugin/allocAddress", map[string]string{"NetworkID": pool + "." + o.Tenant}, &out); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[out.IPv4Address] {
				res.Duplicates++
			}
			seen[out.IPv4Address] = true
			return nil
		})
	}
	return res, ctx.Err()
}

type bench struct {
	o   Options
	run string
	rr  atomic.Uint64
}

func (b *bench) url() string {
	return b.o.NetmasterURLs[int(b.rr.Add(1)-1)%len(b.o.NetmasterURLs)]
}

// measure runs n calls of fn over Concurrency workers and summarises them.
func (b *bench) measure(ctx context.Context, n int, fn func(i int, url string) error) Op {
	if n == 0 {
		return Op{}
	}
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < b.o.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				errs[i] = fn(i, b.url())
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	op := Op{Elapsed: time.Since(start)}
	ok := make([]time.Duration, 0, n)
	for i := range n {
		if errs[i] != nil {
			op.Errors++
			if op.FirstErr == "" {
				op.FirstErr = errs[i].Error()
			}
			continue
		}
		if lat[i] > 0 {
			ok = append(ok, lat[i])
		}
	}
	op.Count = len(ok)
	if op.Elapsed > 0 {
		op.PerSecond = float64(op.Count) / op.Elapsed.Seconds()
	}
	if len(ok) > 0 {
		slices.Sort(ok)
		op.P50 = ok[len(ok)/2]
		op.P99 = ok[min(len(ok)-1, len(ok)*99/100)]
	}
	return op
}

func (b *bench) cleanup(ctx context.Context, names []string) error {
	var firstErr error
	failed := 0
	for _, name := range names {
		st, body, err := b.do(ctx, b.o.NetmasterURLs[0], http.MethodDelete, "/api/v1/networks/"+b.o.Tenant+":"+name+"/", nil)
		if err != nil || (st != http.StatusOK && st != http.StatusNotFound) {
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("delete network %s: status %d %v %s", name, st, err, body)
			}
		}
	}
	if firstErr != nil {
		return fmt.Errorf("%d of %d deletes failed, first: %w", failed, len(names), firstErr)
	}
	return nil
}

func (b *bench) expect(ctx context.Context, base, method, path string, in, out any) error {
	return expect(ctx, b.o.Client, base, method, path, in, out)
}

// expect is do that wants 200 and decodes the answer into out (nil: not decoded).
func expect(ctx context.Context, c *http.Client, base, method, path string, in, out any) error {
	st, body, err := do(ctx, c, base, method, path, in)
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		return fmt.Errorf("%s %s%s: status %d: %s", method, base, path, st, strings.TrimSpace(string(body)))
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			return fmt.Errorf("%s %s: decode response: %w", method, path, err)
		}
	}
	return nil
}

func (b *bench) do(ctx context.Context, base, method, path string, in any) (int, []byte, error) {
	return do(ctx, b.o.Client, base, method, path, in)
}

// do sends in (JSON; nil: no body) to base+path with c and returns the status and body.
func do(ctx context.Context, c *http.Client, base, method, path string, in any) (int, []byte, error) {
	var rd io.Reader
	if in != nil {
		buf, err := json.Marshal(in)
		if err != nil {
			return 0, nil, fmt.Errorf("encode %s body: %w", path, err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("build %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/problem+json") // real statuses (404 on cleanup)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s%s: %w", method, base, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
