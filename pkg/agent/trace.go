package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// TraceQuery is POST /inspect/trace: from is a local endpoint (id or a unique part of it),
// to an address or an endpoint id; proto tcp, udp or icmp; port for tcp/udp.
type TraceQuery struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Proto string `json:"proto"`
	Port  uint16 `json:"port"`
	SPort uint16 `json:"sport"`
}

func (a *Agent) serveTrace(w http.ResponseWriter, req *http.Request) {
	tr, ok := a.cfg.Driver.(dataplane.Tracer)
	if !ok {
		http.Error(w, "this dataplane cannot trace packets", http.StatusNotImplemented)
		return
	}
	var q TraceQuery
	dec := json.NewDecoder(io.LimitReader(req.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		http.Error(w, "trace request: "+err.Error(), http.StatusBadRequest)
		return
	}
	r, err := a.traceRequest(q)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	res, err := tr.Trace(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// traceRequest resolves names: the source among this host's endpoints, the destination
// among all endpoints it knows (or an address).
func (a *Agent) traceRequest(q TraceQuery) (dataplane.TraceRequest, error) {
	var r dataplane.TraceRequest
	switch strings.ToLower(q.Proto) {
	case "tcp", "":
		r.Proto = 6
	case "udp":
		r.Proto = 17
	case "icmp":
		r.Proto = 1
	default:
		return r, fmt.Errorf("proto: %q: want tcp, udp or icmp", q.Proto)
	}
	r.DstPort, r.SrcPort = q.Port, q.SPort
	if q.From == "" || q.To == "" {
		return r, fmt.Errorf("from and to are required")
	}
	s := a.Inspect()
	var matches []string
	for _, ep := range s.Endpoints {
		if ep.ID == q.From {
			matches = []string{ep.ID}
			break
		}
		if strings.Contains(ep.ID, q.From) {
			matches = append(matches, ep.ID)
		}
	}
	switch len(matches) {
	case 0:
		return r, fmt.Errorf("from: no local endpoint of host %s matches %q", a.cfg.Host, q.From)
	case 1:
		r.From = matches[0]
	default:
		return r, fmt.Errorf("from: %q matches %d local endpoints (%s): be more precise", q.From, len(matches), strings.Join(matches, ", "))
	}
	if ip, err := netip.ParseAddr(q.To); err == nil {
		r.Dst = ip
		return r, nil
	}
	for _, ep := range s.Endpoints {
		if ep.ID == q.To {
			r.Dst = ep.IP
			return r, nil
		}
	}
	for _, ep := range s.RemoteEndpoints {
		if ep.ID == q.To {
			r.Dst = ep.IP
			return r, nil
		}
	}
	return r, fmt.Errorf("to: %q is neither an address nor an endpoint id this host knows", q.To)
}

// serveTraceReceive is POST /inspect/trace-receive: a TraceTunnel (another host's trace
// result) run through this host's VXLAN receive path.
func (a *Agent) serveTraceReceive(w http.ResponseWriter, req *http.Request) {
	tr, ok := a.cfg.Driver.(dataplane.Tracer)
	if !ok {
		http.Error(w, "this dataplane cannot trace packets", http.StatusNotImplemented)
		return
	}
	var t dataplane.TraceTunnel
	dec := json.NewDecoder(io.LimitReader(req.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		http.Error(w, "trace-receive request: "+err.Error(), http.StatusBadRequest)
		return
	}
	res, err := tr.TraceReceive(t)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	writeJSON(w, http.StatusOK, res)
}
