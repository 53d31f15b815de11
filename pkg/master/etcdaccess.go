package master

import (
	"errors"
	"net/http"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/etcdrbac"
	"github.com/contivbpf/contivbpf/pkg/model"
)

// etcdAccess enrolls a bound agent's service registration keys with etcd's RBAC (POST
// /plugin/etcdAccess): afterwards its etcd user may write exactly those registrations
// besides its host's own records. Without RBAC it answers Managed false and changes
// nothing. An identity not bound to a host gets no etcd user (403): unconfined agents need
// RBAC off.
func (m *Master) etcdAccess(w http.ResponseWriter, r *http.Request) {
	var req model.EtcdAccessRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if m.cfg.EtcdAccess == nil {
		writeJSON(w, model.EtcdAccessResponse{})
		return
	}
	switch err := m.cfg.EtcdAccess.Managing(r.Context()); {
	case errors.Is(err, etcdrbac.ErrNotManaged): // (a joined netmaster, etcd's auth off)
		writeJSON(w, model.EtcdAccessResponse{})
		return
	case err != nil:
		writeErr(w, errf(http.StatusServiceUnavailable, "etcd users: %v", err))
		return
	}
	host := boundHost(r)
	if host == "" {
		writeErr(w, errf(http.StatusForbidden, "etcd RBAC is on: only an agent identity bound to its host (%s<host>) gets an etcd user; bind this agent's credential or run netmaster with --etcd-rbac=false", auth.HostPrefix))
		return
	}
	if err := m.cfg.EtcdAccess.Enroll(r.Context(), host, req.Registrations); err != nil {
		switch {
		case errors.Is(err, etcdrbac.ErrNotManaged): // (auth went off meanwhile)
			writeJSON(w, model.EtcdAccessResponse{})
		case errors.Is(err, etcdrbac.ErrBadRegistration):
			writeErr(w, badReq("Registrations: %v", err))
		case errors.Is(err, etcdrbac.ErrRevoked):
			writeErr(w, errf(http.StatusForbidden, "etcd users: %v", err))
		case errors.Is(err, etcdrbac.ErrClaimed):
			writeErr(w, conflict("Registrations: %v", err))
		default:
			writeErr(w, errf(http.StatusServiceUnavailable, "etcd users: %v", err))
		}
		return
	}
	writeJSON(w, model.EtcdAccessResponse{Managed: true, User: etcdrbac.UserOf(host)})
}
