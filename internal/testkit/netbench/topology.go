package netbench

import (
	"fmt"
	"os/exec"
	"strings"
)

// Topology is a set of namespaces and links made with iproute2, removed by Close.
type Topology struct {
	Namespaces []string
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func nsip(ns string, args ...string) error { return ip(append([]string{"-n", ns}, args...)...) }

func (t *Topology) addNS(name string) error {
	if err := ip("netns", "add", name); err != nil {
		return err
	}
	t.Namespaces = append(t.Namespaces, name)
	return nsip(name, "link", "set", "lo", "up")
}

// Close deletes every namespace of the topology (and with them their links).
func (t *Topology) Close() {
	for i := len(t.Namespaces) - 1; i >= 0; i-- {
		_ = ip("netns", "del", t.Namespaces[i])
	}
	t.Namespaces = nil
}

// VethPair builds the same-host baseline: two namespaces joined directly by one veth
// pair with a.IP=10.199.0.1/24 and b.IP=10.199.0.2/24 at the given MTU.
func VethPair(prefix string, mtu int) (*Topology, error) {
	t := &Topology{}
	a, b := prefix+"a", prefix+"b"
	steps := []func() error{
		func() error { return t.addNS(a) },
		func() error { return t.addNS(b) },
		func() error {
			return nsip(a, "link", "add", "eth0", "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", "eth0", "netns", b)
		},
		func() error { return nsip(b, "link", "set", "eth0", "mtu", fmt.Sprint(mtu)) },
		func() error { return nsip(a, "addr", "add", "10.199.0.1/24", "dev", "eth0") },
		func() error { return nsip(b, "addr", "add", "10.199.0.2/24", "dev", "eth0") },
		func() error { return nsip(a, "link", "set", "eth0", "up") },
		func() error { return nsip(b, "link", "set", "eth0", "up") },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Close()
			return nil, fmt.Errorf("build veth baseline: %w", err)
		}
	}
	return t, nil
}

// BridgeVXLAN builds the cross-host baseline: two host namespaces joined by a veth wire
// (underlay 10.198.0.1/.2), each with a Linux bridge, a kernel vxlan device (VNI 42,
// unicast to the peer) and one container namespace on the bridge. Containers are
// <prefix>c1 (10.197.0.1) and <prefix>c2 (10.197.0.2) with MTU 1450.
func BridgeVXLAN(prefix string) (*Topology, error) {
	t := &Topology{}
	h1, h2, c1, c2 := prefix+"h1", prefix+"h2", prefix+"c1", prefix+"c2"
	var steps []func() error
	add := func(f func() error) { steps = append(steps, f) }
	for _, n := range []string{h1, h2, c1, c2} {
		add(func() error { return t.addNS(n) })
	}
	add(func() error {
		return nsip(h1, "link", "add", "wire", "type", "veth", "peer", "name", "wire", "netns", h2)
	})
	hosts := []struct{ h, c, under, peer, cip string }{
		{h1, c1, "10.198.0.1", "10.198.0.2", "10.197.0.1"},
		{h2, c2, "10.198.0.2", "10.198.0.1", "10.197.0.2"},
	}
	for _, x := range hosts {
		add(func() error { return nsip(x.h, "addr", "add", x.under+"/24", "dev", "wire") })
		add(func() error { return nsip(x.h, "link", "set", "wire", "up") })
		add(func() error { return nsip(x.h, "link", "add", "br0", "type", "bridge") })
		add(func() error { return nsip(x.h, "link", "set", "br0", "up") })
		add(func() error {
			return nsip(x.h, "link", "add", "vx0", "type", "vxlan", "id", "42", "remote", x.peer, "local", x.under, "dstport", "4789", "nolearning")
		})
		add(func() error { return nsip(x.h, "link", "set", "vx0", "master", "br0", "up") })
		add(func() error {
			return nsip(x.h, "link", "add", "hv", "mtu", "1450", "type", "veth", "peer", "name", "eth0", "netns", x.c)
		})
		add(func() error { return nsip(x.h, "link", "set", "hv", "master", "br0", "up") })
		add(func() error { return nsip(x.c, "link", "set", "eth0", "mtu", "1450") })
		add(func() error { return nsip(x.c, "addr", "add", x.cip+"/24", "dev", "eth0") })
		add(func() error { return nsip(x.c, "link", "set", "eth0", "up") })
	}
	// Static FDB: flood to the peer so the first ARP finds its way (no multicast here).
	for _, x := range hosts {
		add(func() error {
			out, err := exec.Command("bridge", "-n", x.h, "fdb", "append", "00:00:00:00:00:00", "dev", "vx0", "dst", x.peer).CombinedOutput()
			if err != nil {
				return fmt.Errorf("bridge fdb: %w: %s", err, out)
			}
			return nil
		})
	}
	for _, s := range steps {
		if err := s(); err != nil {
			t.Close()
			return nil, fmt.Errorf("build bridge+vxlan baseline: %w", err)
		}
	}
	return t, nil
}

// Addresses of the Masquerade baseline.
const (
	MasqClientIP = "10.196.0.2"
	MasqServerIP = "10.195.0.254"
)

// Masquerade builds the egress baseline: the kernel's own NAT, in the shape the eBPF
// egress path has in the simulation (container → host → underlay bridge → outside).
// Namespaces, in order: client <prefix>c (10.196.0.2/24, MTU mtu, default via .1), router
// <prefix>r (ip_forward=1, `iptables -t nat -A POSTROUTING -o wire -j MASQUERADE`, wire
// 10.195.0.1/24), bridge <prefix>b (br0 joining router and server), server <prefix>s
// (10.195.0.254/24).
func Masquerade(prefix string, mtu int) (*Topology, error) {
	t, err := routerTopology(prefix, mtu, [][]string{{"iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wire", "-j", "MASQUERADE"}})
	if err != nil {
		return nil, fmt.Errorf("build masquerade baseline: %w", err)
	}
	return t, nil
}

// NodePortDNAT builds the node port baseline: kube-proxy's way, an iptables DNAT on the
// host the client reaches. The Masquerade shape with the roles turned: the client in
// <prefix>s (10.195.0.254, on the bridge side, standing for the outside) connects to the
// router's 10.195.0.1:nodePort, which `iptables -t nat -A PREROUTING -p tcp --dport
// nodePort -j DNAT --to-destination 10.196.0.2:port` sends to the server in <prefix>c
// (the "pod", MTU mtu); replies go back through the router (un-DNATed by conntrack).
func NodePortDNAT(prefix string, mtu int, nodePort, port uint16) (*Topology, error) {
	t, err := routerTopology(prefix, mtu, [][]string{{"iptables", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", fmt.Sprint(nodePort),
		"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", MasqClientIP, port)}})
	if err != nil {
		return nil, fmt.Errorf("build node port baseline: %w", err)
	}
	if err := nsip(prefix+"s", "route", "add", "default", "via", "10.195.0.1"); err != nil {
		t.Close()
		return nil, fmt.Errorf("build node port baseline: %w", err)
	}
	return t, nil
}

// routerTopology is the client–router–bridge–server shape of Masquerade with the router's
// netfilter rules given.
func routerTopology(prefix string, mtu int, rules [][]string) (*Topology, error) {
	t := &Topology{}
	c, r, b, s := prefix+"c", prefix+"r", prefix+"b", prefix+"s"
	steps := []func() error{
		func() error { return t.addNS(c) },
		func() error { return t.addNS(r) },
		func() error { return t.addNS(b) },
		func() error { return t.addNS(s) },
		func() error {
			return nsip(c, "link", "add", "eth0", "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", "cv", "netns", r)
		},
		func() error { return nsip(r, "link", "set", "cv", "mtu", fmt.Sprint(mtu)) },
		func() error { return nsip(r, "link", "add", "wire", "type", "veth", "peer", "name", "p1", "netns", b) },
		func() error { return nsip(s, "link", "add", "eth0", "type", "veth", "peer", "name", "p2", "netns", b) },
		func() error { return nsip(b, "link", "add", "br0", "type", "bridge") },
		func() error { return nsip(b, "link", "set", "p1", "master", "br0", "up") },
		func() error { return nsip(b, "link", "set", "p2", "master", "br0", "up") },
		func() error { return nsip(b, "link", "set", "br0", "up") },
		func() error { return nsip(c, "addr", "add", MasqClientIP+"/24", "dev", "eth0") },
		func() error { return nsip(c, "link", "set", "eth0", "up") },
		func() error { return nsip(c, "route", "add", "default", "via", "10.196.0.1") },
		func() error { return nsip(r, "addr", "add", "10.196.0.1/24", "dev", "cv") },
		func() error { return nsip(r, "addr", "add", "10.195.0.1/24", "dev", "wire") },
		func() error { return nsip(r, "link", "set", "cv", "up") },
		func() error { return nsip(r, "link", "set", "wire", "up") },
		func() error { return nsip(s, "addr", "add", MasqServerIP+"/24", "dev", "eth0") },
		func() error { return nsip(s, "link", "set", "eth0", "up") },
		func() error {
			_, err := Run(r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
			return err
		},
	}
	for _, rule := range rules {
		steps = append(steps, func() error {
			_, err := Run(r, rule...)
			return err
		})
	}
	for _, st := range steps {
		if err := st(); err != nil {
			t.Close()
			return nil, err
		}
	}
	return t, nil
}

// KubeProxy is the service-scale baseline: kube-proxy's iptables mode on the router of
// the Masquerade shape. The client in <prefix>c connects to a service VIP; the router's
// nat PREROUTING jumps to KUBE-SERVICES, which holds one rule per service (-d VIP -p tcp
// --dport port → KUBE-SVC-n → KUBE-SEP-n → DNAT), scanned in order for every new
// connection, as kube-proxy lays them out; conntrack carries the rest of the flow. Every
// service's endpoint is the server <prefix>s (10.195.0.254:targetPort), which routes back
// through the router. SetServices replaces the rule set.
type KubeProxy struct {
	*Topology
	port, targetPort uint16
}

// NewKubeProxy builds the topology with no service.
func NewKubeProxy(prefix string, mtu int, port, targetPort uint16) (*KubeProxy, error) {
	t, err := routerTopology(prefix, mtu, nil)
	if err != nil {
		return nil, fmt.Errorf("build kube-proxy baseline: %w", err)
	}
	if err := nsip(prefix+"s", "route", "add", "default", "via", "10.195.0.1"); err != nil {
		t.Close()
		return nil, fmt.Errorf("build kube-proxy baseline: %w", err)
	}
	return &KubeProxy{Topology: t, port: port, targetPort: targetPort}, nil
}

// KubeProxyVIP is the VIP of service i (0-based) in the baseline: 10.97.0.0/16 in order.
func KubeProxyVIP(i int) string { return fmt.Sprintf("10.97.%d.%d", i/250, i%250+1) }

// SetServices installs n services with one iptables-restore (the nat table replaced).
func (k *KubeProxy) SetServices(n int) error {
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, ":KUBE-SVC-%d - [0:0]\n:KUBE-SEP-%d - [0:0]\n", i, i)
	}
	b.WriteString("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"svc%d cluster IP\" -m tcp --dport %d -j KUBE-SVC-%d\n", KubeProxyVIP(i), i, k.port, i)
		fmt.Fprintf(&b, "-A KUBE-SVC-%d -j KUBE-SEP-%d\n", i, i)
		fmt.Fprintf(&b, "-A KUBE-SEP-%d -p tcp -m tcp -j DNAT --to-destination %s:%d\n", i, MasqServerIP, k.targetPort)
	}
	b.WriteString("COMMIT\n")
	cmd := NSCmd(k.Namespaces[1], "iptables-restore")
	cmd.Stderr = nil
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kube-proxy baseline: iptables-restore of %d services: %w: %s", n, err, strings.TrimSpace(string(out)))
	}
	return nil
}
