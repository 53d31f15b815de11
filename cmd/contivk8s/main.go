// Command contivk8s is the CNI plugin kubelet (or any CNI runtime) executes: it forwards
// ADD/DEL to netplugin's unix socket and prints CNI results (see pkg/cniplugin).
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/contivbpf/contivbpf/pkg/buildinfo"
	"github.com/contivbpf/contivbpf/pkg/cniplugin"
)

func main() {
	skel.PluginMainFuncs(cniplugin.Plugin{}.Funcs(), cniplugin.Versions,
		"contivk8s "+buildinfo.Get().String()+": Contiv CNI plugin (talks to netplugin over its CNI socket)")
}
