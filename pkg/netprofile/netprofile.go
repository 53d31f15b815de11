// Package netprofile turns Contiv netprofiles and Kubernetes pod bandwidth annotations
// into what an endpoint's traffic is held to (dataplane.QoS). It is the one place their
// units are read: netmaster validates with it, the agent converts with it.
//
// Units (docs/netprofiles.md):
//   - bandwidth: a positive integer and a unit k, m or g (any case), optionally followed
//     by "b", "bps", "ps" or "bit(s)": "10mbps", "10 Mbps", "1g", "500kb". Every form
//     means bits per second, decimal (1k = 1,000 bit/s). At most 1000g.
//   - burst: an integer in kilobits (1,000 bits), as Contiv wrote it to OVS's
//     ingress_policing_burst; 0 = the backend's default for the rate (dataplane.QoS).
//     Without a bandwidth it is ignored (Contiv accepted it).
//   - DSCP: 0-63; 0 leaves the packets' DSCP as the endpoint sent them (as Contiv did).
//   - Kubernetes kubernetes.io/{ingress,egress}-bandwidth: a resource quantity ("10M",
//     "1G", "500k", "1Mi"), bits per second, 1k to 1000G.
package netprofile

import (
	"fmt"
	"regexp"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// Limits of what can be enforced.
const (
	MaxRate  = 1_000_000_000_000 // bit/s (1000g): OVS meters count kbit/s in 32 bits
	MinRate  = 1_000             // bit/s (1k)
	MaxBurst = 10486             // kilobits, Contiv's limit
	MaxDSCP  = 63
)

// Kubernetes pod annotations of the CNI bandwidth capability.
const (
	AnnotationIngress = "kubernetes.io/ingress-bandwidth"
	AnnotationEgress  = "kubernetes.io/egress-bandwidth"
)

var reBandwidth = regexp.MustCompile(`^([1-9][0-9]*)\s*([kKmMgG])([bB]([pP][sS])?|[pP][sS]|[bB][iI][tT][sS]?)?$`)

// ParseBandwidth reads a netprofile bandwidth ("10mbps") in bits per second.
func ParseBandwidth(s string) (uint64, error) {
	m := reBandwidth.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a bandwidth like 10mbps, 1g or 500kb", s)
	}
	n, err := strconv.ParseUint(m[1], 10, 64)
	mult := map[byte]uint64{'k': 1e3, 'm': 1e6, 'g': 1e9}[m[2][0]|0x20]
	if err != nil || n > MaxRate/mult {
		return 0, fmt.Errorf("%q is more than 1000g", s)
	}
	return n * mult, nil
}

// BurstBytes converts a netprofile burst (kilobits) to bytes.
func BurstBytes(kbit int) uint64 { return uint64(kbit) * 1000 / 8 }

// CheckProfile validates a netprofile's bandwidth, DSCP and burst; the error names the
// field (Contiv's JSON names).
func CheckProfile(bandwidth string, dscp, burst int) error {
	if bandwidth != "" {
		if _, err := ParseBandwidth(bandwidth); err != nil {
			return fmt.Errorf("bandwidth: %w", err)
		}
	}
	switch {
	case dscp < 0 || dscp > MaxDSCP:
		return fmt.Errorf("DSCP: %d is out of range 0..%d", dscp, MaxDSCP)
	case burst < 0 || burst > MaxBurst:
		return fmt.Errorf("burst: %d is out of range 0..%d (kilobits)", burst, MaxBurst)
	case burst == 1:
		return fmt.Errorf("burst: 1 is too small (use 0 for the default or at least 2)")
	}
	return nil
}

// OfGroup is the QoS of the endpoints of an endpoint group with its netprofile's values
// (copied into the group's state record by netmaster): the bandwidth in both directions,
// the burst in both (0: the backend's default), the DSCP when not 0.
func OfGroup(g model.EndpointGroupState) (dataplane.QoS, error) {
	if err := CheckProfile(g.Bandwidth, g.DSCP, g.Burst); err != nil {
		return dataplane.QoS{}, fmt.Errorf("endpoint group %s: netprofile %w", g.ID, err)
	}
	var q dataplane.QoS
	if g.Bandwidth != "" {
		rate, _ := ParseBandwidth(g.Bandwidth)
		burst := BurstBytes(g.Burst)
		q.EgressRate, q.EgressBurst, q.IngressRate, q.IngressBurst = rate, burst, rate, burst
	}
	if g.DSCP != 0 {
		q.DSCP, q.SetDSCP = uint8(g.DSCP), true
	}
	return q, nil
}

// ParseQuantity reads a Kubernetes bandwidth annotation value in bits per second.
func ParseQuantity(s string) (uint64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity like 10M or 1G: %w", s, err)
	}
	if q.Cmp(*resource.NewQuantity(MinRate, resource.DecimalSI)) < 0 || q.Cmp(*resource.NewQuantity(MaxRate, resource.DecimalSI)) > 0 {
		return 0, fmt.Errorf("%q is outside 1k..1000G", s)
	}
	return uint64(q.Value()), nil
}

// OfPod is the QoS of a pod's bandwidth annotations (ingress: what it receives, egress:
// what it sends), each with the backend's default burst; the error names the annotation.
func OfPod(annotations map[string]string) (dataplane.QoS, error) {
	var q dataplane.QoS
	for _, d := range []struct {
		key  string
		rate *uint64
	}{{AnnotationIngress, &q.IngressRate}, {AnnotationEgress, &q.EgressRate}} {
		v, ok := annotations[d.key]
		if !ok {
			continue
		}
		r, err := ParseQuantity(v)
		if err != nil {
			return dataplane.QoS{}, fmt.Errorf("annotation %s: %w", d.key, err)
		}
		*d.rate = r
	}
	return q, nil
}

// Stricter combines a netprofile's QoS and a pod's: per direction the lower rate (0 is
// unlimited); the smaller burst when both set one, else the profile's when it sets one
// (0 is the backend's default for the rate: a pod annotation, which sets none,
// undercutting the profile's rate by a little must not trade the profile's burst for
// 200-250 ms of the rate), else the burst of the lower rate's side; DSCP from the
// netprofile (a pod annotation sets none).
func Stricter(profile, pod dataplane.QoS) dataplane.QoS {
	out := profile
	pick := func(rate, burst *uint64, r, b uint64) {
		switch {
		case r == 0:
		case *rate == 0:
			*rate, *burst = r, b
		case *burst != 0 && b != 0:
			*rate, *burst = min(*rate, r), min(*burst, b)
		case *burst == 0 && r < *rate:
			*rate, *burst = r, b
		default: // the profile's burst, or neither sets one and the profile's rate is lower
			*rate = min(*rate, r)
		}
	}
	pick(&out.EgressRate, &out.EgressBurst, pod.EgressRate, pod.EgressBurst)
	pick(&out.IngressRate, &out.IngressBurst, pod.IngressRate, pod.IngressBurst)
	if !out.SetDSCP && pod.SetDSCP {
		out.DSCP, out.SetDSCP = pod.DSCP, true
	}
	return out
}
