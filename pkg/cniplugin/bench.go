package cniplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// BenchConfig describes an ADD latency measurement: Pods pods attached one after another
// through the contivk8s binary (exec'd by libcni, as a runtime does), each into its own
// fresh network namespace.
type BenchConfig struct {
	BinDir     string // directory holding contivk8s
	Socket     string // netplugin's CNI socket
	Tenant     string // default "default"
	Network    string // must exist
	Pods       int    // default 100
	NSPrefix   string // namespace name prefix, at most 8 bytes (default "cbrb")
	CNIVersion string // default 1.0.0
}

// BenchResult is what BenchAdd measured.
type BenchResult struct {
	Pods     int
	P50, P99 time.Duration
	Max      time.Duration
	Total    time.Duration // wall time to attach all pods (ADDs only)
	DelTotal time.Duration // wall time to detach all pods
}

// BenchAdd attaches cfg.Pods pods, measures every ADD, then detaches them and removes the
// namespaces (also on failure).
func BenchAdd(ctx context.Context, cfg BenchConfig) (res BenchResult, err error) {
	if cfg.Pods <= 0 {
		cfg.Pods = 100
	}
	if cfg.NSPrefix == "" {
		cfg.NSPrefix = "cbrb"
	}
	if cfg.Tenant == "" {
		cfg.Tenant = "default"
	}
	if cfg.CNIVersion == "" {
		cfg.CNIVersion = "1.0.0"
	}
	if cfg.Network == "" || cfg.Socket == "" || cfg.BinDir == "" {
		return res, errors.New("bench: BinDir, Socket and Network are required")
	}
	list, err := libcni.ConfListFromBytes([]byte(fmt.Sprintf(
		`{"cniVersion":%q,"name":"bench","plugins":[{"type":"contivk8s","socket":%q,"tenant":%q,"network":%q}]}`,
		cfg.CNIVersion, cfg.Socket, cfg.Tenant, cfg.Network)))
	if err != nil {
		return res, fmt.Errorf("bench: conf list: %w", err)
	}
	cache, err := os.MkdirTemp("", "cbr-cnicache-")
	if err != nil {
		return res, fmt.Errorf("bench: cache dir: %w", err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{cfg.BinDir}, cache, nil)
	var names []string
	var added []*libcni.RuntimeConf
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		start := time.Now()
		for _, rt := range added {
			if derr := cni.DelNetworkList(dctx, list, rt); derr != nil && err == nil {
				err = fmt.Errorf("bench: DEL %s: %w", rt.ContainerID, derr)
			}
		}
		res.DelTotal = time.Since(start)
		for _, n := range names {
			_ = exec.Command("ip", "netns", "del", n).Run()
		}
		_ = os.RemoveAll(cache)
	}()
	for i := 0; i < cfg.Pods; i++ {
		n := fmt.Sprintf("%s-%d", cfg.NSPrefix, i)
		if out, err := exec.CommandContext(ctx, "ip", "netns", "add", n).CombinedOutput(); err != nil {
			return res, fmt.Errorf("bench: ip netns add %s: %v: %s", n, err, strings.TrimSpace(string(out)))
		}
		names = append(names, n)
	}
	lat := make([]time.Duration, 0, cfg.Pods)
	all := time.Now()
	for i, n := range names {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprintf("%s-pod-%d", cfg.NSPrefix, i), NetNS: "/run/netns/" + n, IfName: "eth0",
			Args: [][2]string{{"K8S_POD_NAME", fmt.Sprintf("bench-%d", i)}, {"K8S_POD_NAMESPACE", "default"}}}
		start := time.Now()
		if _, err := cni.AddNetworkList(ctx, list, rt); err != nil {
			return res, fmt.Errorf("bench: ADD pod %d: %w", i, err)
		}
		lat = append(lat, time.Since(start))
		added = append(added, rt)
	}
	res.Total = time.Since(all)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	res.Pods = len(lat)
	res.P50 = lat[len(lat)/2]
	res.P99 = lat[(len(lat)*99+99)/100-1]
	res.Max = lat[len(lat)-1]
	return res, nil
}
