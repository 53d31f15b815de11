package sim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FRRDir is where Debian's frr package puts its daemons.
const FRRDir = "/usr/lib/frr"

// RouterASN is the top-of-rack router's AS; host i (from 1) gets RouterASN+i.
const RouterASN = 65000

// Router is the simulation's top-of-rack router (Config.BGPRouter): the namespace
// "<prefix>-tor" with one point-to-point link per host (the host end is named "bgp" and
// is the host's --vlan-if), forwarding on. StartFRR runs Debian's FRR (zebra + bgpd,
// private config, socket, pid and log files under the work dir) as its BGP speaker.
type Router struct {
	NS    string
	Links map[string]RouterLink // by host name
	dir   string
	procs []*Process
}

// RouterLink is one host's link to the router: what `netctl bgp create` needs.
type RouterLink struct {
	RouterIP netip.Prefix // the host's end (Contiv's router-ip; netplugin adds it)
	Neighbor netip.Addr   // the router's end
	HostAS   uint32
}

// HostIf is the name of a host's end of its router link.
const HostIf = "bgp"

func (c *Cluster) buildRouter(ctx context.Context) error {
	r := &Router{NS: c.Prefix + "-tor", Links: map[string]RouterLink{}, dir: filepath.Join(c.WorkDir, "tor")}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return fmt.Errorf("sim: router dir: %w", err)
	}
	if err := c.addNS(ctx, r.NS); err != nil {
		return err
	}
	if _, err := Exec(ctx, r.NS, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return err
	}
	for i, h := range c.Hosts {
		l := RouterLink{RouterIP: netip.MustParsePrefix(fmt.Sprintf("172.30.%d.2/24", i+1)),
			Neighbor: netip.MustParseAddr(fmt.Sprintf("172.30.%d.1", i+1)), HostAS: RouterASN + uint32(i) + 1}
		tor := fmt.Sprintf("h%d", i+1)
		if _, err := run(ctx, "ip", "link", "add", HostIf, "netns", h.Name, "type", "veth", "peer", "name", tor, "netns", r.NS); err != nil {
			return err
		}
		for _, argv := range [][]string{
			{r.NS, "ip", "addr", "add", fmt.Sprintf("%v/24", l.Neighbor), "dev", tor},
			{r.NS, "ip", "link", "set", tor, "up"},
			{h.Name, "ip", "link", "set", HostIf, "up"},
		} {
			if _, err := Exec(ctx, argv[0], argv[1:]...); err != nil {
				return err
			}
		}
		r.Links[h.Name] = l
	}
	c.Router = r
	return nil
}

// FRRInstalled says whether Debian's frr package is present.
func FRRInstalled() bool {
	_, err := os.Stat(filepath.Join(FRRDir, "bgpd"))
	return err == nil
}

// StartFRR runs zebra and bgpd in the router namespace: AS RouterASN, one eBGP neighbour
// per host link with keepalive 1s and hold time hold (whole seconds, at least 3).
func (c *Cluster) StartFRR(ctx context.Context, hold time.Duration) error {
	r := c.Router
	if r == nil {
		return errors.New("sim: no router (Config.BGPRouter)")
	}
	if !FRRInstalled() {
		return fmt.Errorf("sim: %s/bgpd missing (apt-get install frr)", FRRDir)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "hostname %s\nlog file %s\n!\nrouter bgp %d\n bgp router-id 172.30.0.1\n no bgp ebgp-requires-policy\n no bgp network import-check\n",
		r.NS, filepath.Join(r.dir, "bgpd.frr.log"), RouterASN)
	for _, h := range c.Hosts {
		l := r.Links[h.Name]
		ip := l.RouterIP.Addr()
		fmt.Fprintf(&b, " neighbor %v remote-as %d\n neighbor %v timers 1 %d\n neighbor %v timers connect 1\n", ip, l.HostAS, ip, int(hold/time.Second), ip)
	}
	b.WriteString("!\n")
	files := map[string]string{"zebra.conf": "hostname " + r.NS + "\n", "bgpd.conf": b.String()}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(r.dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("sim: frr config: %w", err)
		}
	}
	// The daemons drop to Debian's frr user (it must be in the frrvty group): it gets the
	// router directory, and the work dir above it lets it pass.
	u, err := user.Lookup("frr")
	if err != nil {
		return fmt.Errorf("sim: frr user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chmod(c.WorkDir, 0o711); err != nil {
		return fmt.Errorf("sim: work dir: %w", err)
	}
	if err := os.Chown(r.dir, uid, gid); err != nil {
		return fmt.Errorf("sim: router dir: %w", err)
	}
	zserv := filepath.Join(r.dir, "zserv.api")
	common := []string{"-u", "frr", "-g", "frr", "--vty_socket", r.dir, "-z", zserv}
	z, err := startProcess("zebra", r.NS, filepath.Join(r.dir, "zebra.log"),
		append([]string{filepath.Join(FRRDir, "zebra"), "-f", filepath.Join(r.dir, "zebra.conf"), "-i", filepath.Join(r.dir, "zebra.pid")}, common...))
	if err != nil {
		return err
	}
	r.procs = append(r.procs, z)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(zserv); err == nil {
			break
		}
		if done, perr := z.Exited(); done || time.Now().After(deadline) {
			return fmt.Errorf("sim: zebra did not start (%v): %s", perr, z.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	bg, err := startProcess("bgpd", r.NS, filepath.Join(r.dir, "bgpd.log"),
		append([]string{filepath.Join(FRRDir, "bgpd"), "-f", filepath.Join(r.dir, "bgpd.conf"), "-i", filepath.Join(r.dir, "bgpd.pid")}, common...))
	if err != nil {
		return err
	}
	r.procs = append(r.procs, bg)
	time.Sleep(200 * time.Millisecond)
	if done, perr := bg.Exited(); done {
		return fmt.Errorf("sim: bgpd exited (%v): %s", perr, bg.LogTail(20))
	}
	c.log.Info("sim: FRR up", "ns", r.NS, "as", RouterASN)
	return nil
}

// VTY runs an FRR vtysh command against the router's daemons.
func (r *Router) VTY(ctx context.Context, cmd string) (string, error) {
	out, err := exec.CommandContext(ctx, "vtysh", "--vty_socket", r.dir, "-c", cmd).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vtysh -c %q: %w: %s", cmd, err, out)
	}
	return string(out), nil
}

// Routes lists the routes FRR installed in the router's kernel (proto bgp).
func (r *Router) Routes(ctx context.Context) (string, error) {
	return Exec(ctx, r.NS, "ip", "-4", "route", "show", "proto", "bgp")
}

func (r *Router) stop() error {
	var errs []error
	for i := len(r.procs) - 1; i >= 0; i-- {
		if err := r.procs[i].Stop(5 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	r.procs = nil
	return errors.Join(errs...)
}

// PausePlugin freezes h's netplugin (SIGSTOP), like a host that hangs: its sockets stay
// open and silent. ResumePlugin lets it go on.
func (c *Cluster) PausePlugin(h *Host) error {
	if h.Plugin == nil {
		return errors.New("sim: no plugin")
	}
	return h.Plugin.cmd.Process.Signal(syscall.SIGSTOP)
}

// ResumePlugin continues a paused netplugin (SIGCONT).
func (c *Cluster) ResumePlugin(h *Host) error {
	if h.Plugin == nil {
		return errors.New("sim: no plugin")
	}
	return h.Plugin.cmd.Process.Signal(syscall.SIGCONT)
}
