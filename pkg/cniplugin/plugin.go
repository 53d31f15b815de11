package cniplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/cniapi"
)

// Versions are the CNI spec versions contivk8s speaks.
var Versions = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// ErrAgent is the CNI error code for a request netplugin refused (plugin-specific range).
const ErrAgent uint = 100

// Agent is netplugin's CNI socket API (*cniapi.Client satisfies it).
type Agent interface {
	AddPod(ctx context.Context, req cniapi.PodRequest) (cniapi.PodResponse, error)
	DelPod(ctx context.Context, req cniapi.PodRequest) (cniapi.PodResponse, error)
}

// Plugin holds the command implementations.
type Plugin struct {
	// NewAgent returns the client for a socket path (default: cniapi.NewClient).
	NewAgent func(socket string) Agent
}

// Funcs returns the skel callbacks for every CNI command.
func (p Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

func (p Plugin) agent(socket string) Agent {
	if p.NewAgent != nil {
		return p.NewAgent(socket)
	}
	return cniapi.NewClient(socket)
}

func load(args *skel.CmdArgs) (*NetConf, PodArgs, error) {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return nil, PodArgs{}, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	pa, err := ParseArgs(args.Args)
	if err != nil {
		return nil, PodArgs{}, types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	return conf, pa, nil
}

func (c *NetConf) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(c.TimeoutSeconds)*time.Second)
}

// agentError turns a socket failure into a CNI error: unreachable netplugin is "try again
// later" (11), a refusal is ErrAgent with netplugin's message.
func agentError(op string, resp cniapi.PodResponse, err error) *types.Error {
	if resp.Result != 0 || resp.ErrMsg != "" {
		return types.NewError(ErrAgent, "Contiv: "+resp.ErrMsg, resp.ErrInfo)
	}
	var ne net.Error
	var op2 *net.OpError
	if errors.As(err, &op2) || errors.As(err, &ne) || errors.Is(err, os.ErrNotExist) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: netplugin not reachable", op), err.Error())
	}
	return types.NewError(ErrAgent, fmt.Sprintf("%s: %v", op, err), "")
}

// Add attaches the pod and prints the result in conf's CNI version. If anything fails
// after netplugin attached the pod, the pod is detached again.
func (p Plugin) Add(args *skel.CmdArgs) error {
	conf, pa, err := load(args)
	if err != nil {
		return err
	}
	if args.Netns == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is empty", "")
	}
	req := podRequest(conf, pa, args.ContainerID, args.Netns, args.IfName)
	ctx, cancel := conf.ctx()
	defer cancel()
	ag := p.agent(conf.Socket)
	resp, err := ag.AddPod(ctx, req)
	if err != nil {
		// netplugin rolls back its own failures; a cut connection may still have left
		// an attachment behind, so ask for a detach (idempotent) before failing.
		return withUndo(agentError("add pod", resp, err), undo(ag, req))
	}
	res, err := result(conf, args, resp)
	if err != nil {
		return withUndo(types.NewError(ErrAgent, "build result", err.Error()), undo(ag, req))
	}
	if err := types.PrintResult(res, conf.CNIVersion); err != nil {
		return withUndo(types.NewError(types.ErrIOFailure, "print result", err.Error()), undo(ag, req))
	}
	return nil
}

// undo detaches the pod after a failed add; its error says why the detach failed.
func undo(ag Agent, req cniapi.PodRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := ag.DelPod(ctx, req)
	if err == nil && (resp.Result != 0 || resp.ErrMsg != "") {
		err = fmt.Errorf("netplugin refused: %s", resp.ErrMsg)
	}
	if err != nil {
		return fmt.Errorf("rollback: detach pod %s: %w", req.InfraContainerID, err)
	}
	return nil
}

// withUndo adds a failed rollback to the CNI error's details, keeping its code (the
// runtime must learn both why the add failed and that something may be left behind).
func withUndo(err *types.Error, undoErr error) *types.Error {
	if undoErr == nil {
		return err
	}
	if err.Details != "" {
		err.Details += "; "
	}
	err.Details += undoErr.Error()
	return err
}

// result builds a CNI 1.x result from netplugin's reply (converted by PrintResult).
func result(conf *NetConf, args *skel.CmdArgs, resp cniapi.PodResponse) (*current.Result, error) {
	ipn, err := netip.ParsePrefix(resp.IPAddress)
	if err != nil {
		return nil, fmt.Errorf("netplugin returned address %q: %w", resp.IPAddress, err)
	}
	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		DNS:        conf.DNS,
	}
	// Like the bridge and ptp plugins: the host side of the veth first (no sandbox), then
	// the pod's interface, which the addresses refer to; chained plugins (bandwidth) look
	// for the host side there.
	if resp.HostIfName != "" {
		res.Interfaces = append(res.Interfaces, &current.Interface{Name: resp.HostIfName, Mac: resp.HostMAC})
	}
	res.Interfaces = append(res.Interfaces, &current.Interface{Name: args.IfName, Mac: resp.MAC, Mtu: resp.MTU, Sandbox: args.Netns})
	if len(res.DNS.Nameservers) == 0 && resp.DNS != "" {
		// The host's DNS responder, reached at the network's gateway (docs/host-routing.md).
		res.DNS.Nameservers = []string{resp.DNS}
	}
	idx := len(res.Interfaces) - 1
	ipc := &current.IPConfig{Interface: &idx, Address: *prefixToIPNet(ipn)}
	if resp.Gateway != "" {
		gw, err := netip.ParseAddr(resp.Gateway)
		if err != nil {
			return nil, fmt.Errorf("netplugin returned gateway %q: %w", resp.Gateway, err)
		}
		ipc.Gateway = net.IP(gw.AsSlice())
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, GW: ipc.Gateway})
	}
	res.IPs = append(res.IPs, ipc)
	if resp.IPv6Address != "" {
		if p6, err := netip.ParsePrefix(resp.IPv6Address); err == nil {
			res.IPs = append(res.IPs, &current.IPConfig{Interface: &idx, Address: *prefixToIPNet(p6)})
		}
	}
	return res, nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Del detaches the pod; detaching a pod that is not attached succeeds.
func (p Plugin) Del(args *skel.CmdArgs) error {
	conf, pa, err := load(args)
	if err != nil {
		return err
	}
	req := podRequest(conf, pa, args.ContainerID, args.Netns, args.IfName)
	ctx, cancel := conf.ctx()
	defer cancel()
	if resp, err := p.agent(conf.Socket).DelPod(ctx, req); err != nil {
		return agentError("delete pod", resp, err)
	}
	return nil
}

// Check verifies, in the pod's namespace, that the interface of the previous result exists
// with its MAC and addresses.
func (p Plugin) Check(args *skel.CmdArgs) error {
	conf, _, err := load(args)
	if err != nil {
		return err
	}
	if conf.RawPrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK: prevResult is missing", "")
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "CHECK: prevResult", err.Error())
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "CHECK: prevResult", err.Error())
	}
	if args.Netns == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is empty", "")
	}
	err = ns.WithNetNSPath(args.Netns, func(ns.NetNS) error {
		link, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return fmt.Errorf("interface %s: %w", args.IfName, err)
		}
		for _, itf := range prev.Interfaces {
			if itf.Name == args.IfName && itf.Mac != "" && itf.Mac != link.Attrs().HardwareAddr.String() {
				return fmt.Errorf("interface %s has MAC %s, want %s", args.IfName, link.Attrs().HardwareAddr, itf.Mac)
			}
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("addresses of %s: %w", args.IfName, err)
		}
		for _, ipc := range prev.IPs {
			found := false
			for _, a := range addrs {
				if a.IPNet.IP.Equal(ipc.Address.IP) && a.IPNet.Mask.String() == ipc.Address.Mask.String() {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("interface %s lacks address %s", args.IfName, ipc.Address.String())
			}
		}
		return nil
	})
	if err != nil {
		return types.NewError(types.ErrInternal, "CHECK failed", err.Error())
	}
	return nil
}

// Status reports whether netplugin's socket accepts connections.
func (p Plugin) Status(args *skel.CmdArgs) error {
	conf, err := ParseConf(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	c, err := net.DialTimeout("unix", conf.Socket, 5*time.Second)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "netplugin is not reachable", err.Error())
	}
	c.Close()
	return nil
}

// GC has nothing to collect here: netplugin owns every attachment and removes it on DEL
// (or when netmaster deletes the endpoint); the binary keeps no state of its own.
func (p Plugin) GC(args *skel.CmdArgs) error {
	if _, err := ParseConf(args.StdinData); err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	return nil
}
