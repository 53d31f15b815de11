package cpbench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// NetworksOptions says how many VXLAN networks Networks creates. Zero values take the
// defaults in brackets.
type NetworksOptions struct {
	// URL is netmaster's base URL. Required.
	URL string
	// Tenants [100] of PerTenant [100] networks each (at most 256 and 156: subnets are
	// NetworkSubnet's). The tenants, named TenantPrefix+index, must exist.
	Tenants, PerTenant int
	// TenantPrefix names the tenants ["bn"].
	TenantPrefix string
	// Workers is the number of creates in flight [8].
	Workers int
	// Window is the number of creates whose rate is measured at the start and at the end
	// [1000, at most half of all].
	Window int
	// ClientFor returns the client that creates tenant i's networks (a tenant-admin's
	// token, say); nil: one client with a 30 s timeout for all.
	ClientFor func(tenant int) *http.Client
	// CPU, if set, returns the CPU time netmaster has used so far (ProcessCPU of its pid,
	// say): Networks then also measures the CPU per create of the first and the last
	// Window creates, a figure machine load does not move as it moves the rates.
	CPU func() (time.Duration, error)
}

// NetworksResult is what Networks measured.
type NetworksResult struct {
	Created int
	Elapsed time.Duration
	// StartRate and EndRate are the creates per second of the first and the last Window
	// creates.
	StartRate, EndRate float64
	// StartCPU and EndCPU are netmaster's CPU time per create over the first and the last
	// Window creates (with NetworksOptions.CPU set): from before the first is sent to
	// when create Window is sent, and from when create total-Window is sent to after the
	// last has finished.
	StartCPU, EndCPU time.Duration
}

// SetVXLANs sets the global VXLAN range to rng ("1-16000": its widest) as c, keeping the
// global object's other fields: the default (1-10000) holds no more than 10,000 networks.
func SetVXLANs(ctx context.Context, c *http.Client, url, rng string) error {
	var g map[string]any
	if err := expect(ctx, c, url, http.MethodGet, "/api/v1/globals/global/", nil, &g); err != nil {
		return err
	}
	g["vxlans"] = rng
	return expect(ctx, c, url, http.MethodPost, "/api/v1/globals/global/", g, nil)
}

// CreateTenants creates tenants prefix+0 to prefix+(n-1) as c.
func CreateTenants(ctx context.Context, c *http.Client, url, prefix string, n int) error {
	for i := range n {
		tn := fmt.Sprintf("%s%d", prefix, i)
		if err := expect(ctx, c, url, http.MethodPost, "/api/v1/tenants/"+tn+"/", map[string]any{"tenantName": tn}, nil); err != nil {
			return err
		}
	}
	return nil
}

// NetworkSubnet is the subnet of network n of tenant t: 10.<100+n>.<t>.0/24.
func NetworkSubnet(t, n int) string { return fmt.Sprintf("10.%d.%d.0/24", 100+n, t) }

// NetworkName is the name of network n of a tenant.
func NetworkName(n int) string { return fmt.Sprintf("n%d", n) }

// Networks creates Tenants x PerTenant VXLAN networks through netmaster's REST API,
// Workers at once, tenants interleaved (create i is network i/Tenants of tenant
// i%Tenants), and measures the rate at the start and at the end. The first failed create
// stops it and is its error. It never asserts a rate: callers do.
func Networks(ctx context.Context, o NetworksOptions) (NetworksResult, error) {
	if o.URL == "" {
		return NetworksResult{}, errors.New("cpbench: NetworksOptions.URL is empty")
	}
	o.URL = strings.TrimSuffix(o.URL, "/")
	o.Tenants, o.PerTenant, o.Workers = orDefault(o.Tenants, 100), orDefault(o.PerTenant, 100), orDefault(o.Workers, 8)
	if o.TenantPrefix == "" {
		o.TenantPrefix = "bn"
	}
	total := o.Tenants * o.PerTenant
	o.Window = min(orDefault(o.Window, 1000), total/2)
	if o.Tenants > 256 || o.PerTenant > 156 || o.Window < 1 {
		return NetworksResult{}, fmt.Errorf("cpbench: %d tenants of %d networks: want 1-256 of 1-156, 2 or more in all", o.Tenants, o.PerTenant)
	}
	if o.ClientFor == nil {
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.Workers * 2}}
		o.ClientFor = func(int) *http.Client { return c }
	}
	done := make([]time.Time, total)
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		next.Store(int64(total))
	}
	// cpu[0..3]: netmaster's CPU before the first create, when create Window and create
	// total-Window are sent, and after the last.
	var cpu [4]time.Duration
	sample := func(at int) {
		if o.CPU == nil {
			return
		}
		c, err := o.CPU()
		if err != nil {
			fail(fmt.Errorf("cpbench: netmaster's CPU time: %w", err))
		}
		cpu[at] = c
	}
	sample(0)
	start := time.Now()
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				// (Both when the windows meet: Window is half of all.)
				if i == o.Window {
					sample(1)
				}
				if i == total-o.Window {
					sample(2)
				}
				t, n := i%o.Tenants, i/o.Tenants
				tn, name := fmt.Sprintf("%s%d", o.TenantPrefix, t), NetworkName(n)
				err := expect(ctx, o.ClientFor(t), o.URL, http.MethodPost, "/api/v1/networks/"+tn+":"+name+"/",
					map[string]any{"tenantName": tn, "networkName": name, "encap": "vxlan", "subnet": NetworkSubnet(t, n)}, nil)
				if err != nil {
					fail(fmt.Errorf("network %d of %d: %w", i+1, total, err))
					return
				}
				done[i] = time.Now()
			}
		}()
	}
	wg.Wait()
	res := NetworksResult{Elapsed: time.Since(start)}
	if firstErr == nil {
		sample(3)
	}
	for _, d := range done {
		if !d.IsZero() {
			res.Created++
		}
	}
	if firstErr != nil {
		return res, firstErr
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("cpbench: %d of %d networks created: %w", res.Created, total, err)
	}
	res.StartRate, res.EndRate = windowRate(done[:o.Window]), windowRate(done[total-o.Window:])
	res.StartCPU, res.EndCPU = (cpu[1]-cpu[0])/time.Duration(o.Window), (cpu[3]-cpu[2])/time.Duration(o.Window)
	return res, firstErr
}

// windowRate is the creates per second of a window of creates, by index (creates finish
// nearly in order): how many over the time from the first to finish to the last.
func windowRate(done []time.Time) float64 {
	var first, last time.Time
	for _, d := range done {
		if first.IsZero() || d.Before(first) {
			first = d
		}
		if d.After(last) {
			last = d
		}
	}
	return float64(len(done)) / max(last.Sub(first).Seconds(), 1e-3)
}

func orDefault(v, d int) int {
	if v <= 0 {
		return d
	}
	return v
}

// ProcessCPU is the user+system CPU time process pid has used so far
// (/proc/<pid>/stat's utime and stime).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start after the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime/stime", pid)
	}
	return time.Duration(ut+st) * time.Second / 100, nil // USER_HZ = 100
}
