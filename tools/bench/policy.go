package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"time"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/tools/sim"
)

// The policy stages measure the same paths as samehost/crosshost, but between containers
// in two endpoint groups that both have policies, so every packet is tracked by conntrack
// and the first packet of every connection is judged by the rules (docs/conntrack.md).
// Client group (pa): egress "deny tcp" (SYN only) and "deny udp" at priority 1, egress
// "allow tcp to the server group on the iperf3 and echo ports" at 10, ingress "deny tcp"
// at 1. Server group (pb, pc): ingress "deny tcp" and "deny udp" at 1, ingress "allow tcp
// from the client group on the iperf3 and echo ports" at 10.
const (
	groupCli   = "bench-cli"
	groupSrv   = "bench-srv"
	policyCli  = "bench-cli-pol"
	policySrv  = "bench-srv-pol"
	deniedPort = 7071 // no rule allows it: the SYN meets "deny tcp"
)

func benchRules() []model.Rule {
	r := func(pol, id, dir string, prio int, proto string, port int, action, from, to string) model.Rule {
		return model.Rule{TenantName: "default", PolicyName: pol, RuleID: id, Direction: dir, Priority: prio,
			Protocol: proto, Port: port, Action: action, FromEndpointGroup: from, ToEndpointGroup: to}
	}
	return []model.Rule{
		r(policyCli, "1", "out", 1, "tcp", 0, "deny", "", ""),
		r(policyCli, "2", "out", 1, "udp", 0, "deny", "", ""),
		r(policyCli, "3", "out", 10, "tcp", iperfPort, "allow", "", groupSrv),
		r(policyCli, "4", "out", 10, "tcp", echoPort, "allow", "", groupSrv),
		r(policyCli, "5", "in", 1, "tcp", 0, "deny", "", ""),
		r(policySrv, "1", "in", 1, "tcp", 0, "deny", "", ""),
		r(policySrv, "2", "in", 1, "udp", 0, "deny", "", ""),
		r(policySrv, "3", "in", 10, "tcp", iperfPort, "allow", groupCli, ""),
		r(policySrv, "4", "in", 10, "tcp", echoPort, "allow", groupCli, ""),
	}
}

// policySetup creates the groups, policies and rules through netmaster's REST API and
// attaches pa (host 1, client group), pb (host 1) and pc (host 2, server group) through
// the CNI socket with the group in the request (CONTIV_GROUP). Done once per cluster.
func (d *dpRun) policySetup(ctx context.Context) error {
	if d.pa != nil || d.policyErr != nil {
		return d.policyErr
	}
	d.policyErr = func() error {
		c := d.c
		for _, p := range []string{policyCli, policySrv} {
			if err := c.CreatePolicy(ctx, "default", p); err != nil {
				return err
			}
		}
		// Groups first (rules name them), then rules; a rule added to an attached policy
		// is expanded for its group at once.
		if err := c.CreateEndpointGroup(ctx, "default", benchNet, groupCli, policyCli); err != nil {
			return err
		}
		if err := c.CreateEndpointGroup(ctx, "default", benchNet, groupSrv, policySrv); err != nil {
			return err
		}
		for _, r := range benchRules() {
			if err := c.AddRule(ctx, r); err != nil {
				return fmt.Errorf("rule %s:%s: %w", r.PolicyName, r.RuleID, err)
			}
		}
		h1, h2 := c.Hosts[0], c.Hosts[1]
		pa, err := c.AddContainerInGroup(ctx, h1, "pa", "default", benchNet, groupCli)
		if err != nil {
			return err
		}
		pb, err := c.AddContainerInGroup(ctx, h1, "pb", "default", benchNet, groupSrv)
		if err != nil {
			return err
		}
		pc, err := c.AddContainerInGroup(ctx, h2, "pc", "default", benchNet, groupSrv)
		if err != nil {
			return err
		}
		// ICMP is not filtered: ping until both paths carry traffic.
		for _, dst := range []*sim.Container{pb, pc} {
			deadline := time.Now().Add(20 * time.Second)
			for {
				out, err := pa.Exec(ctx, "ping", "-c", "1", "-W", "1", dst.IP.Addr().String())
				if err == nil {
					break
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("%s cannot reach %s: %v: %s", pa.Name, dst.Name, err, out)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		d.pa, d.pb, d.pc = pa, pb, pc
		return nil
	}()
	if d.policyErr != nil {
		d.policyErr = fmt.Errorf("policy setup: %w", d.policyErr)
	}
	return d.policyErr
}

// policyCheck proves the policy is in force on cli -> srv before a measurement: a TCP
// connection to the echo port (allowed) works, a connection to deniedPort (a listener is
// there, so only a drop makes it fail) times out, and a UDP datagram to deniedPort does
// not arrive. Rules reach the agents through etcd asynchronously, so the denied probe is
// retried until it fails (20 s at most). It returns the drop_policy packets counted on
// the client's host across the check (-1 when the dataplane has no such metric).
func (d *dpRun) policyCheck(ctx context.Context, cli, srv *sim.Container) (drops float64, err error) {
	if err := cli.TCPCheck(ctx, srv, echoPort); err != nil {
		return 0, fmt.Errorf("allowed port %d: %w", echoPort, err)
	}
	if out, err := cli.Exec(ctx, "ping", "-c", "1", "-W", "2", srv.IP.Addr().String()); err != nil {
		return 0, fmt.Errorf("ping (not filtered) %s -> %s: %v: %s", cli.Name, srv.Name, err, out)
	}
	before := metricValue(ctx, cli.Host, dropPolicyRe)
	addr := net.JoinHostPort(srv.IP.Addr().String(), strconv.Itoa(deniedPort))
	l, err := sim.Listen(srv.Name, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		conn, err := sim.DialContext(dctx, cli.Name, "tcp", addr)
		cancel()
		if err != nil && isTimeout(err) && ctx.Err() == nil {
			break // the SYN was dropped
		}
		if conn != nil {
			conn.Close()
		}
		if err != nil && !isTimeout(err) {
			return 0, fmt.Errorf("denied port %d: want a dropped SYN, got %w", deniedPort, err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("policy not in force: %s -> %s still connects after 20s", cli.Name, addr)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err := udpDenied(ctx, cli, srv); err != nil {
		return 0, err
	}
	after := metricValue(ctx, cli.Host, dropPolicyRe)
	drops = -1
	if before >= 0 && after >= 0 {
		drops = after - before
	}
	return drops, nil
}

// ctEntriesAfter reads h's conntrack entry count from the first collector pass after
// runs0 (ct_gc_runs_total), waiting up to 12 s for one (the collector runs every 10 s);
// -1 when there is no such metric or no pass came. The client's ping (an opener: 60 s
// entry) and the measured flows leave entries only if the groups' packets are tracked:
// the plain containers' traffic never creates any.
func ctEntriesAfter(ctx context.Context, h *sim.Host, runs0 float64) float64 {
	if runs0 < 0 {
		return -1
	}
	deadline := time.Now().Add(12 * time.Second)
	for metricValue(ctx, h, ctRunsRe) <= runs0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return -1
		}
		time.Sleep(250 * time.Millisecond)
	}
	return metricValue(ctx, h, ctEntriesRe)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// udpDenied sends datagrams from cli to srv:deniedPort; none may arrive.
func udpDenied(ctx context.Context, cli, srv *sim.Container) error {
	addr := net.JoinHostPort(srv.IP.Addr().String(), strconv.Itoa(deniedPort))
	pc, err := sim.ListenPacket(srv.Name, "udp", addr)
	if err != nil {
		return err
	}
	defer pc.Close()
	c, err := sim.DialContext(ctx, cli.Name, "udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; i < 3; i++ {
		_, _ = c.Write([]byte("bench-policy-udp"))
	}
	_ = pc.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	if n, _, err := pc.ReadFrom(buf); err == nil {
		return fmt.Errorf("policy not in force: UDP %q from %s reached %s", buf[:n], cli.Name, addr)
	}
	return nil
}

var (
	dropPolicyRe = regexp.MustCompile(`contiv_datapath_packets_total\{drop="true",reason="drop_policy"\} ([0-9.e+]+)`)
	ctEntriesRe  = regexp.MustCompile(`(?m)^contiv_datapath_ct_entries(?:\{[^}]*\})? ([0-9.e+]+)`)
	ctRunsRe     = regexp.MustCompile(`(?m)^contiv_datapath_ct_gc_runs_total(?:\{[^}]*\})? ([0-9.e+]+)`)
)

// metricValue reads one value from h's metrics; -1 when it is not there.
func metricValue(ctx context.Context, h *sim.Host, re *regexp.Regexp) float64 {
	text, err := h.Metrics(ctx)
	if err != nil {
		return -1
	}
	m := re.FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

func fmtCount(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// policyRows are the table rows the policy stages add: the check and, when the plain
// stage ran in this run, the ratio with policy over the ratio without.
func (d *dpRun) policyRows(plain string, drops, ct float64, got map[string]float64) [][]string {
	rows := [][]string{
		{"policy check before measuring", "", "", "",
			fmt.Sprintf("port %d allowed; port %d: TCP SYN dropped (timeout), UDP not delivered; drop_policy +%s on the client's host", echoPort, deniedPort, fmtCount(drops))},
		{"conntrack entries on the client's host after the run", "", fmtCount(ct), "", "first collector pass after the check (only grouped containers' flows are tracked)"},
	}
	for _, f := range []string{"tput_ratio", "crr_ratio"} {
		v, ok := got[f]
		base, okb := d.ratios[plain+"."+f]
		if ok && okb && base > 0 {
			rows = append(rows, []string{f + " with / without policy", "", "", fmt.Sprintf("%.3f", v/base),
				fmt.Sprintf("%s %.3f vs %s %.3f (same run, separate rounds)", plain+"_policy", v, plain, base)})
		}
	}
	return rows
}

// sameHostPolicy is samehost between pa (client group) and pb (server group) on host 1.
func (d *dpRun) sameHostPolicy(ctx context.Context) error {
	if err := d.policySetup(ctx); err != nil {
		return err
	}
	runs0 := metricValue(ctx, d.pa.Host, ctRunsRe)
	drops, err := d.policyCheck(ctx, d.pa, d.pb)
	if err != nil {
		return err
	}
	ct := -1.0
	if err := d.sameHostOf(ctx, "samehost_policy", d.pa, d.pb, " with policy on both groups", func(tput, crr float64) [][]string {
		ct = ctEntriesAfter(ctx, d.pa.Host, runs0)
		return d.policyRows("samehost", drops, ct, map[string]float64{"tput_ratio": tput, "crr_ratio": crr})
	}); err != nil {
		return err
	}
	d.reportPolicyCheck("samehost_policy", drops, ct)
	return nil
}

// crossHostPolicy is crosshost between pa (host 1, client group) and pc (host 2, server
// group).
func (d *dpRun) crossHostPolicy(ctx context.Context) error {
	if err := d.policySetup(ctx); err != nil {
		return err
	}
	runs0 := metricValue(ctx, d.pa.Host, ctRunsRe)
	drops, err := d.policyCheck(ctx, d.pa, d.pc)
	if err != nil {
		return err
	}
	ct := -1.0
	if err := d.crossHostOf(ctx, "crosshost_policy", d.pa, d.pc, " with policy on both groups", func(tput float64) [][]string {
		ct = ctEntriesAfter(ctx, d.pa.Host, runs0)
		return d.policyRows("crosshost", drops, ct, map[string]float64{"tput_ratio": tput})
	}); err != nil {
		return err
	}
	d.reportPolicyCheck("crosshost_policy", drops, ct)
	return nil
}

// reportPolicyCheck prints the check's figures (only where the dataplane has the metrics).
func (d *dpRun) reportPolicyCheck(stage string, drops, ct float64) {
	if drops >= 0 {
		d.r.add(d.dp+"."+stage+".check_policy_drops", drops, "packets")
	}
	if ct >= 0 {
		d.r.add(d.dp+"."+stage+".ct_entries", ct, "count")
	}
}
