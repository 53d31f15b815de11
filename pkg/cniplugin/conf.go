// Package cniplugin is the logic of the contivk8s CNI binary: it reads the CNI network
// config and arguments, asks netplugin over its unix socket (Contiv's /ContivCNI.AddPod and
// /ContivCNI.DelPod) to attach or detach the pod, and prints the result in the CNI version
// the runtime asked for. CHECK verifies the interface in the pod's namespace against the
// previous result; STATUS reports whether netplugin answers.
//
// It knows the CNI spec and the socket protocol (pkg/cniapi), nothing about etcd, netmaster
// or dataplanes.
package cniplugin

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/contivbpf/contivbpf/pkg/cniapi"
)

// Label/arg keys naming the pod's tenant, network and endpoint group (Contiv's pod labels).
const (
	KeyTenant  = "io.contiv.tenant"
	KeyNetwork = "io.contiv.network"
	KeyGroup   = "io.contiv.net-group"
)

// NetConf is the network configuration contivk8s reads from stdin.
type NetConf struct {
	types.PluginConf
	// Socket is netplugin's CNI socket (default /run/contiv/contiv-cni.sock).
	Socket string `json:"socket,omitempty"`
	// Tenant, Network and Group are used when CNI_ARGS and args.cni do not name them.
	Tenant  string `json:"tenant,omitempty"`
	Network string `json:"network,omitempty"`
	Group   string `json:"group,omitempty"`
	// TimeoutSeconds bounds each call to netplugin (default 60).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// Args is the conventional "args" block; args.cni may carry io.contiv.* keys.
	Args struct {
		CNI map[string]any `json:"cni,omitempty"`
	} `json:"args,omitempty"`
}

// ParseConf decodes and checks the network configuration.
func ParseConf(stdin []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	if conf.Name == "" {
		return nil, fmt.Errorf("network config: field \"name\" is empty")
	}
	if conf.Socket == "" {
		conf.Socket = cniapi.DefaultSocket
	}
	if !strings.HasPrefix(conf.Socket, "/") {
		return nil, fmt.Errorf("network config: field \"socket\" %q is not an absolute path", conf.Socket)
	}
	if conf.TimeoutSeconds < 0 {
		return nil, fmt.Errorf("network config: field \"timeoutSeconds\" %d is negative", conf.TimeoutSeconds)
	}
	if conf.TimeoutSeconds == 0 {
		conf.TimeoutSeconds = 60
	}
	for k, v := range conf.Args.CNI {
		if _, ok := v.(string); !ok && (k == KeyTenant || k == KeyNetwork || k == KeyGroup) {
			return nil, fmt.Errorf("network config: args.cni.%s must be a string", k)
		}
	}
	return conf, nil
}

// PodArgs are the CNI_ARGS this plugin understands.
type PodArgs struct {
	Name, Namespace, InfraContainerID string
	Tenant, Network, Group            string
}

// ParseArgs reads CNI_ARGS ("K=V;K=V"). Keys other than the Kubernetes pod keys, the
// io.contiv.* keys and CONTIV_TENANT/NETWORK/GROUP are refused unless IgnoreUnknown is true.
func ParseArgs(s string) (PodArgs, error) {
	var a PodArgs
	if s == "" {
		return a, nil
	}
	ignore := false
	var unknown []string
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return a, fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", kv)
		}
		switch k {
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.InfraContainerID = v
		case "K8S_POD_UID":
		case KeyTenant, "CONTIV_TENANT":
			a.Tenant = v
		case KeyNetwork, "CONTIV_NETWORK":
			a.Network = v
		case KeyGroup, "CONTIV_GROUP":
			a.Group = v
		case "IgnoreUnknown":
			ignore = strings.EqualFold(v, "true") || v == "1"
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 && !ignore {
		return a, fmt.Errorf("CNI_ARGS: unknown key(s) %s (set IgnoreUnknown=1 to ignore)", strings.Join(unknown, ", "))
	}
	return a, nil
}

// podRequest builds the socket request: CNI_ARGS win over args.cni, which win over the
// config's tenant/network/group; netplugin applies Contiv's defaults to what is left empty.
func podRequest(conf *NetConf, a PodArgs, containerID, netns, ifName string) cniapi.PodRequest {
	pick := func(vals ...string) string {
		for _, v := range vals {
			if v != "" {
				return v
			}
		}
		return ""
	}
	argStr := func(k string) string { s, _ := conf.Args.CNI[k].(string); return s }
	return cniapi.PodRequest{
		Name:             a.Name,
		Namespace:        a.Namespace,
		InfraContainerID: pick(a.InfraContainerID, containerID),
		NetNS:            netns,
		IfName:           ifName,
		Tenant:           pick(a.Tenant, argStr(KeyTenant), conf.Tenant),
		Network:          pick(a.Network, argStr(KeyNetwork), conf.Network),
		Group:            pick(a.Group, argStr(KeyGroup), conf.Group),
	}
}
