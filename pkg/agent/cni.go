package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/contivbpf/contivbpf/pkg/cniapi"
	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/k8s"
	"github.com/contivbpf/contivbpf/pkg/netprofile"
)

// PodLabeler reads a pod's labels from the Kubernetes API (pkg/k8s.Client implements it).
type PodLabeler interface {
	PodLabels(ctx context.Context, namespace, name string) (map[string]string, error)
}

// PodAnnotator reads the bandwidth annotations of a pod (pkg/k8s.PodCache implements
// it); a PodLabeler without it leaves pods unlimited by annotations.
type PodAnnotator interface {
	PodAnnotations(ctx context.Context, namespace, name string) (map[string]string, error)
}

// podQoS is what the pod's kubernetes.io/{ingress,egress}-bandwidth annotations ask for
// (netprofile.OfPod); a malformed one fails the request, naming the annotation.
func podQoS(ctx context.Context, pods PodLabeler, req cniapi.PodRequest) (dataplane.QoS, error) {
	pa, ok := pods.(PodAnnotator)
	if !ok {
		return dataplane.QoS{}, nil
	}
	ann, err := pa.PodAnnotations(ctx, req.Namespace, req.Name)
	if err != nil {
		return dataplane.QoS{}, fmt.Errorf("read annotations of pod %s/%s: %w", req.Namespace, req.Name, err)
	}
	q, err := netprofile.OfPod(ann)
	if err != nil {
		return dataplane.QoS{}, fmt.Errorf("pod %s/%s: %w", req.Namespace, req.Name, err)
	}
	return q, nil
}

// CNIBackend adapts the agent to the CNI socket protocol (cniapi.Backend): AddPod attaches
// the pod's infra container, DelPod detaches it. Tenant, network and group come from the
// pod's labels io.contiv.tenant / io.contiv.network / io.contiv.net-group when a
// Kubernetes API is configured (Config.Pods), else (or for a label the pod lacks) from
// the request's CONTIV_TENANT/CONTIV_NETWORK/CONTIV_GROUP, with Contiv's defaults
// default/default-net/none.
func (a *Agent) CNIBackend() cniapi.Backend { return cniBackend{a} }

type cniBackend struct{ a *Agent }

// podTarget fills the request's tenant, network and group from the pod's labels. An API
// error fails the request: attaching to a default network instead would be silently wrong.
func podTarget(ctx context.Context, pods PodLabeler, req cniapi.PodRequest) (cniapi.PodRequest, error) {
	if pods != nil {
		if req.Name == "" {
			return req, fmt.Errorf("pod labels: K8S_POD_NAME is empty (a Kubernetes API is configured)")
		}
		labels, err := pods.PodLabels(ctx, req.Namespace, req.Name)
		if err != nil {
			return req, fmt.Errorf("read labels of pod %s/%s: %w", req.Namespace, req.Name, err)
		}
		if v := labels[k8s.LabelTenant]; v != "" {
			req.Tenant = v
		}
		if v := labels[k8s.LabelNetwork]; v != "" {
			req.Network = v
		}
		if v := labels[k8s.LabelGroup]; v != "" {
			req.Group = v
		}
	}
	return req.WithDefaults(), nil
}

func (b cniBackend) AddPod(ctx context.Context, req cniapi.PodRequest) (cniapi.PodResponse, error) {
	req, err := podTarget(ctx, b.a.cfg.Pods, req)
	if err != nil {
		return cniapi.PodResponse{}, err
	}
	ar := AttachRequest{
		Tenant: req.Tenant, Network: req.Network, Group: req.Group,
		EndpointID: req.InfraContainerID, Name: req.Name, NetNS: req.NetNS, IfName: req.IfName,
	}
	if b.a.cfg.Pods != nil { // the pod was found in the API: Services may use it as a backend
		ns := req.Namespace
		if ns == "" {
			ns = "default"
		}
		ar.K8sPod = ns + "/" + req.Name
		if ar.PodQoS, err = podQoS(ctx, b.a.cfg.Pods, req); err != nil {
			return cniapi.PodResponse{}, err
		}
	}
	res, err := b.a.AttachEndpoint(ctx, ar)
	if err != nil {
		return cniapi.PodResponse{}, err
	}
	if ns, name, ok := strings.Cut(ar.K8sPod, "/"); ok {
		b.a.recheckPodBandwidth(ctx, ns, name)
	}
	resp := cniapi.PodResponse{EndpointID: res.ID, IPAddress: res.IP.String(), MAC: res.MAC, MTU: res.MTU, HostIfName: res.HostIfName}
	if l, err := netlink.LinkByName(res.HostIfName); err == nil {
		resp.HostMAC = l.Attrs().HardwareAddr.String()
	}
	if res.IPv6.IsValid() {
		resp.IPv6Address = res.IPv6.String()
	}
	if res.Gateway.IsValid() {
		resp.Gateway = res.Gateway.String()
		if b.a.cfg.DNS {
			resp.DNS = resp.Gateway
		}
	}
	return resp, nil
}

// DelPod detaches by infra container id; it needs no labels (a pod already deleted from
// the API must still be cleaned up).
func (b cniBackend) DelPod(ctx context.Context, req cniapi.PodRequest) (cniapi.PodResponse, error) {
	dr := DetachRequest{Tenant: req.Tenant, Network: req.Network, Group: req.Group, EndpointID: req.InfraContainerID}
	if err := b.a.DetachEndpoint(ctx, dr); err != nil {
		return cniapi.PodResponse{}, err
	}
	return cniapi.PodResponse{}, nil
}
