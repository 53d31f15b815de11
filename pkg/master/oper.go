package master

import (
	"net/http"

	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// recordEndpoint writes an agent's record of an endpoint it attached
// (/contiv.io/oper/eps/<id>, POST /plugin/recordEndpoint). Agents no longer write that
// key themselves, so their etcd credentials need no write access outside their own host's
// records (docs/security.md, "etcd RBAC"). The endpoint must exist and be homed on the
// record's host; a caller bound to a host writes only records of that host, and never
// replaces another host's record (403, nothing written). It runs in its own transaction,
// not behind the API's write lock: an attach writes it while its datapath is programmed.
func (m *Master) recordEndpoint(w http.ResponseWriter, r *http.Request) {
	var rec model.LocalEndpointRecord
	if err := decodeStrict(r, &rec); err != nil {
		writeErr(w, err)
		return
	}
	if rec.ID == "" || rec.HomingHost == "" {
		writeErr(w, badReq("id and homingHost: required"))
		return
	}
	if err := checkPluginFields(map[string]string{"id": rec.ID, "homingHost": rec.HomingHost}); err != nil {
		writeErr(w, err)
		return
	}
	if err := checkRecord(&rec); err != nil {
		writeErr(w, err)
		return
	}
	host := boundHost(r)
	if host != "" && rec.HomingHost != host {
		writeErr(w, errf(http.StatusForbidden, "homingHost: the agent of host %q may not record endpoints of host %q", host, rec.HomingHost))
		return
	}
	err := m.store.Update(r.Context(), func(tx *state.Tx) error {
		ep, found, err := getT[model.CfgEndpointState](tx, model.EpStateKey(rec.ID))
		if err != nil {
			return err
		}
		if !found {
			return unproc("id: endpoint %q does not exist", rec.ID)
		}
		if err := onHost(rec.HomingHost, ep); err != nil {
			return err
		}
		if err := operOnHost(tx, rec.ID, host); err != nil {
			return err
		}
		return tx.Put(model.EpOperKey(rec.ID), rec)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, struct{}{})
}

// forgetEndpoint removes an agent's record of an endpoint (POST /plugin/forgetEndpoint);
// removing one that does not exist succeeds. A caller bound to a host removes only records
// of that host (403, nothing removed).
func (m *Master) forgetEndpoint(w http.ResponseWriter, r *http.Request) {
	var req model.ForgetEndpointRequest
	if err := decodeStrict(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.ID == "" {
		writeErr(w, badReq("ID: required"))
		return
	}
	if err := checkPluginFields(map[string]string{"ID": req.ID}); err != nil {
		writeErr(w, err)
		return
	}
	host := boundHost(r)
	err := m.store.Update(r.Context(), func(tx *state.Tx) error {
		if err := operOnHost(tx, req.ID, host); err != nil {
			return err
		}
		tx.Delete(model.EpOperKey(req.ID))
		return nil
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, struct{}{})
}

// operOnHost refuses a caller bound to host ("": anyone) the existing record of endpoint
// id when another host wrote it.
func operOnHost(tx *state.Tx, id, host string) error {
	if host == "" {
		return nil
	}
	old, found, err := getT[model.LocalEndpointRecord](tx, model.EpOperKey(id))
	if err != nil {
		return err
	}
	if found && old.HomingHost != host {
		return errf(http.StatusForbidden, "endpoint %s is recorded on host %q: the agent of host %q may not change its record", id, old.HomingHost, host)
	}
	return nil
}

// maxNetNSField bounds a record's netNS (a path: PATH_MAX).
const maxNetNSField = 4096

// checkRecord bounds the free-text fields of an agent's endpoint record: netmaster writes
// it outside the API's quota, so without bounds each record of an agent could take a
// request body's worth (1 MiB) of etcd.
func checkRecord(rec *model.LocalEndpointRecord) error {
	if err := checkTextFields(map[string]string{"netNS": rec.NetNS}, maxNetNSField); err != nil {
		return err
	}
	if err := rec.PodQoS.Validate(); err != nil {
		return badReq("podQoS: %v", err)
	}
	return checkTextFields(map[string]string{
		"netID": rec.NetID, "endpointID": rec.EndpointID, "serviceName": rec.ServiceName,
		"contUUID": rec.ContUUID, "ipAddress": rec.IPAddress, "ipv6Address": rec.IPv6Address,
		"macAddress": rec.MacAddress, "intfName": rec.IntfName, "portName": rec.PortName,
		"vtepIP": rec.VtepIP, "tenant": rec.Tenant, "network": rec.Network, "group": rec.Group,
	}, maxPluginField)
}
