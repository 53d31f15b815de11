package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/contivbpf/contivbpf/pkg/bgp"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// BGPStatus is the speaker's state for /inspect/bgp and, published in etcd, for
// `netctl bgp inspect` (Contiv's Oper fields, plus what was advertised).
type BGPStatus = model.BgpOper

// bgpSession is the session a host's bgp record asks for.
func bgpSession(r *records, host string) (bgp.Config, bool, error) {
	st, ok := r.bgp[host]
	if !ok {
		return bgp.Config{}, false, nil
	}
	rip, err := netip.ParsePrefix(st.RouterIP)
	if err != nil {
		return bgp.Config{}, true, fmt.Errorf("bgp %s: router-ip %q: %w", host, st.RouterIP, err)
	}
	as, err := strconv.ParseUint(st.As, 10, 32)
	if err != nil {
		return bgp.Config{}, true, fmt.Errorf("bgp %s: as %q: %w", host, st.As, err)
	}
	nas, err := strconv.ParseUint(st.NeighborAs, 10, 32)
	if err != nil {
		return bgp.Config{}, true, fmt.Errorf("bgp %s: neighbor-as %q: %w", host, st.NeighborAs, err)
	}
	nb, err := netip.ParseAddr(st.Neighbor)
	if err != nil {
		return bgp.Config{}, true, fmt.Errorf("bgp %s: neighbor %q: %w", host, st.Neighbor, err)
	}
	c := bgp.Config{RouterIP: rip, ASN: uint32(as), NeighborAS: uint32(nas), Neighbor: nb}
	if err := c.Validate(); err != nil {
		return c, true, fmt.Errorf("bgp %s: %w", host, err)
	}
	if !rip.Contains(nb) {
		return c, true, fmt.Errorf("bgp %s: neighbor %v is not on router-ip's network %v", host, nb, rip.Masked())
	}
	return c, true, nil
}

// nativePrefixes are the routes this host advertises: the /32 of every local endpoint of
// a natively routed network (routing mode, VLAN encapsulation) inside allowed (nil: any),
// except addresses that endpoints of natively routed networks of two tenants hold
// (shared, computed by sharedNativeAddrs): the fabric has one table, and such an address
// would draw one tenant's traffic to the other.
func nativePrefixes(s dataplane.State, allowed []netip.Prefix, shared map[netip.Addr]bool) []netip.Prefix {
	native := map[string]bool{}
	for _, n := range s.Networks {
		if n.Encap == dataplane.EncapVLAN {
			native[n.ID] = true
		}
	}
	var out []netip.Prefix
	for _, ep := range s.Endpoints {
		if !native[ep.NetworkID] || !ep.IP.Is4() || shared[ep.IP] {
			continue
		}
		if allowed != nil && !slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(ep.IP) }) {
			continue
		}
		out = append(out, netip.PrefixFrom(ep.IP, 32))
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return slices.Compact(out)
}

// sharedNativeAddrs are the addresses endpoints of natively routed networks of more than
// one tenant hold, cluster-wide (networks created before netmaster refused such overlaps).
func sharedNativeAddrs(r *records) map[netip.Addr]bool {
	tenantOf := map[netip.Addr]string{}
	shared := map[netip.Addr]bool{}
	for _, e := range r.eps {
		n, ok := r.nets[e.NetID]
		if !ok || n.PktTagType != string(dataplane.EncapVLAN) {
			continue
		}
		ip, err := netip.ParseAddr(e.IPAddress)
		if err != nil {
			continue
		}
		if t, seen := tenantOf[ip]; seen && t != n.Tenant {
			shared[ip] = true
		}
		tenantOf[ip] = n.Tenant
	}
	return shared
}

// bgpLoop runs this host's speaker while a bgp record names the host (routing mode only):
// it advertises the local endpoints of natively routed networks and hands the routes it
// learns to the driver. Routes found in the datapath at start (a restarted agent) stay
// until the new session is established and has sent its table (or one hold time passed),
// so a restart does not interrupt forwarding.
func (a *Agent) bgpLoop(ctx context.Context) {
	nr, _ := a.driver.(dataplane.NativeRouter)
	var (
		sp         *bgp.Speaker
		cur        bgp.Config
		haveCur    bool
		staleTill  time.Time
		lastSet    []dataplane.Route
		setOnce    bool
		estSince   time.Time
		stale      []dataplane.Route // the datapath's routes when the speaker started
		tblSince   time.Time         // when the neighbour's End-of-RIB was first seen on this session
		offDone    bool              // native routing turned off (no bgp record for this host)
		lastShared int
	)
	stop := func(why string) {
		if sp != nil {
			a.log.Info("bgp: stopping the speaker", "why", why)
			sp.Stop(context.WithoutCancel(ctx))
			sp = nil
		}
	}
	// The agent stopping is not the host leaving: the datapath keeps forwarding, so the
	// neighbour keeps the routes (graceful restart) until the next agent is back.
	defer func() {
		if sp != nil {
			sp.Abandon()
		}
	}()
	// Nothing before the first reconcile: a speaker started earlier would advertise an
	// empty table (and, after a restart, make the neighbour drop this host's routes).
	select {
	case <-ctx.Done():
		return
	case <-a.ready:
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var changed <-chan struct{}
		if sp != nil {
			changed = sp.Changed()
		}
		select {
		case <-ctx.Done():
			return
		case <-a.bgpKick:
		case <-changed:
		case <-tick.C:
		}
		a.mu.Lock()
		want, has, err := bgpSession(a.rec, a.cfg.Host)
		a.mu.Unlock()
		if err == nil && has && a.cfg.FwdMode != dataplane.FwdRouting {
			err = errors.New("bgp: this host runs --fwdmode bridge; BGP needs routing")
		}
		if err == nil && has && nr == nil {
			err = fmt.Errorf("bgp: the %s dataplane cannot route natively", a.driver.Name())
		}
		if err != nil {
			a.setBGPStatus(ctx, BGPStatus{Error: err.Error()})
			has = false
		}
		if haveCur && (!has || want != cur) {
			stop("bgp config changed or removed")
			haveCur = false
			if !has && nr != nil {
				if err := nr.SetNativeRouting(ctx, dataplane.NativeRouting{}); err != nil {
					a.log.Warn("bgp: turn native routing off", "err", err)
				}
				lastSet, setOnce = nil, false
			}
		}
		if !has {
			if err == nil {
				a.setBGPStatus(ctx, BGPStatus{})
			}
			// A bgp record deleted while the agent was down: the pinned datapath may
			// still route natively.
			if !offDone && nr != nil {
				if err := nr.SetNativeRouting(ctx, dataplane.NativeRouting{}); err != nil {
					a.log.Warn("bgp: turn native routing off", "err", err)
				} else {
					offDone = true
				}
			}
			continue
		}
		offDone = false
		if !haveCur {
			// Keep the routes the datapath has (a restarted agent) until the session is back.
			var rerr error
			stale, rerr = nr.NativeRoutes()
			if rerr != nil {
				a.log.Warn("bgp: read the datapath's routes", "err", rerr)
			}
			stale = usableRoutes(stale, want.RouterIP)
			if err := nr.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: want.RouterIP, Routes: stale}); err != nil {
				a.setBGPStatus(ctx, BGPStatus{Error: err.Error()})
				continue
			}
			want.HoldTime, want.RestartTime, want.Restarting, want.Logger = a.cfg.BGPHoldTime, a.cfg.BGPRestartTime, len(stale) > 0, a.log
			s, err := bgp.Start(ctx, want)
			if err != nil {
				a.setBGPStatus(ctx, BGPStatus{Error: err.Error()})
				continue
			}
			want.HoldTime, want.RestartTime, want.Restarting, want.Logger = 0, 0, false, nil
			sp, cur, haveCur = s, want, true
			lastSet, setOnce = stale, true
			staleTill = time.Now().Add(max(a.cfg.BGPHoldTime, 9*time.Second))
			estSince, tblSince = time.Time{}, time.Time{}
		}
		a.mu.Lock()
		shared := sharedNativeAddrs(a.rec)
		a.mu.Unlock()
		a.applyMu.Lock()
		adv := nativePrefixes(a.applied.State(), a.cfg.BGPPrefixes, shared)
		a.applyMu.Unlock()
		if len(shared) != lastShared {
			lastShared = len(shared)
			if lastShared > 0 {
				a.log.Warn("bgp: addresses held by endpoints of two tenants are not advertised", "count", lastShared)
			}
		}
		advErr := sp.Advertise(ctx, adv)
		st, err := sp.Status(ctx)
		if err != nil {
			a.setBGPStatus(ctx, BGPStatus{Error: err.Error()})
			continue
		}
		if st.Established && estSince.IsZero() {
			estSince = time.Now()
		} else if !st.Established {
			estSince, tblSince = time.Time{}, time.Time{}
		}
		if st.TableReceived && tblSince.IsZero() {
			tblSince = time.Now()
		}
		learned := usableRoutes(st.Learned, cur.RouterIP)
		// A fresh session's table arrives right after it opens: the stale routes stay
		// until the neighbour's End-of-RIB (graceful restart) or, without one, 2 s; then
		// the session's own view rules (also when it is empty).
		// (A restarting speaker selects its best paths right after that End-of-RIB: a
		// moment's grace.)
		settled := !estSince.IsZero() && (!tblSince.IsZero() && time.Since(tblSince) > 300*time.Millisecond || time.Since(estSince) > 2*time.Second)
		// Until then the datapath gets the stale routes and the new ones together: a
		// route only ever appears early, never goes early.
		program := learned
		if !settled && time.Now().Before(staleTill) {
			program = usableRoutes(append(slices.Clone(stale), learned...), cur.RouterIP)
			program = slices.CompactFunc(program, func(a, b dataplane.Route) bool { return a.Prefix == b.Prefix })
		} else {
			stale = nil
		}
		if !setOnce || !slices.Equal(program, lastSet) {
			if err := nr.SetNativeRouting(ctx, dataplane.NativeRouting{RouterIP: cur.RouterIP, Routes: program}); err != nil {
				a.log.Warn("bgp: program learned routes", "err", err)
			} else {
				a.log.Info("bgp: routes programmed", "routes", len(program), "learned", len(learned), "session", st.NeighborStatus, "settled", stale == nil)
				lastSet, setOnce = program, true
			}
		}
		out := BGPStatus{AdminStatus: st.AdminStatus, NeighborStatus: st.NeighborStatus, NumRoutes: len(learned)}
		for _, r := range learned {
			out.Routes = append(out.Routes, r.Prefix.String()+" via "+r.NextHop.String())
		}
		for _, p := range st.Advertised {
			out.AdvertisedRoutes = append(out.AdvertisedRoutes, p.String())
		}
		if advErr != nil {
			out.Error = advErr.Error()
		}
		a.setBGPStatus(ctx, out)
	}
}

// usableRoutes keeps the IPv4 routes whose next hop is a neighbour on the router-ip's
// network (the only ones the uplink can forward to), sorted.
func usableRoutes(rs []dataplane.Route, rip netip.Prefix) []dataplane.Route {
	var out []dataplane.Route
	for _, r := range rs {
		if (dataplane.NativeRouting{RouterIP: rip, Routes: []dataplane.Route{r}}).Validate() == nil {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b dataplane.Route) int {
		if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
			return c
		}
		return a.Prefix.Bits() - b.Prefix.Bits()
	})
	return out
}

// setBGPStatus records the session state and publishes it (BgpOperKey) when it changed;
// a host without a bgp record removes its record.
func (a *Agent) setBGPStatus(ctx context.Context, s BGPStatus) {
	a.mu.Lock()
	same := a.bgpPublished && reflect.DeepEqual(a.bgpStatus, s)
	a.bgpStatus = s
	a.mu.Unlock()
	if same {
		return
	}
	var err error
	// Bounded: an etcd outage must not stop the loop from programming routes.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if reflect.DeepEqual(s, BGPStatus{}) {
		_, err = a.store.Delete(pctx, model.BgpOperKey(a.cfg.Host))
	} else {
		err = a.store.Put(pctx, model.BgpOperKey(a.cfg.Host), s)
	}
	if err != nil {
		a.log.Warn("bgp: publish session state", "err", err)
		return
	}
	a.mu.Lock()
	a.bgpPublished = true
	a.mu.Unlock()
}

// BGP returns the speaker's state (zero when this host has no bgp record).
func (a *Agent) BGP() BGPStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bgpStatus
}
