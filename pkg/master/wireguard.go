package master

import (
	"net/http"
	"strings"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/etcdrbac"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

// publishWireGuard writes a host's WireGuard public key and endpoint
// (model.WireGuardKey, POST /plugin/publishWireGuard). Agents' etcd credentials may not
// write it (pkg/etcdrbac): a caller bound to a host publishes only that host's record
// (403, nothing written), so no agent can put its own key in place of another host's and
// receive that host's traffic. A public key another host already published is refused
// (409): peers would hold one WireGuard peer for two hosts.
func (m *Master) publishWireGuard(w http.ResponseWriter, r *http.Request) {
	var rec model.WireGuardHost
	if err := decodeStrict(r, &rec); err != nil {
		writeErr(w, err)
		return
	}
	if err := checkPluginFields(map[string]string{"host": rec.Host}); err != nil {
		writeErr(w, err)
		return
	}
	if err := rec.Check(); err != nil {
		writeErr(w, badReq("%v", err))
		return
	}
	switch {
	case rec.Rotate != 0:
		writeErr(w, badReq("rotate: set by netmaster on an admin's request (POST /wireguard/hosts/<host>/rotate), not by a publication"))
		return
	case rec.Rotated != 0:
		writeErr(w, badReq("rotated: set by netmaster when the host publishes a new key, not by a publication"))
		return
	}
	if host := boundHost(r); host != "" && !strings.EqualFold(rec.Host, host) {
		writeErr(w, errf(http.StatusForbidden, "host: the agent of host %q may not publish the WireGuard key of host %q", host, rec.Host))
		return
	}
	rec.Host = strings.ToLower(rec.Host) // (as model.WireGuardKey spells it)
	bound := boundHost(r)
	err := m.store.Update(r.Context(), func(tx *state.Tx) error {
		// A host whose token was removed has its record deleted (etcdrbac RemoveHost);
		// a publication authenticated before (or by a netmaster that has not reloaded
		// its token file) must not write it back. Read in the transaction: a removal
		// marked meanwhile makes it run again. Records are keyed by the lowercased
		// name, token hosts by their own spelling: a removed "H1" is also refused to
		// a certificate of "h1", whose record would be the same.
		if bound != "" {
			hosts, err := tx.List(etcdrbac.TokenHostsPrefix)
			if err != nil {
				return err
			}
			for _, kv := range hosts {
				name := strings.TrimPrefix(kv.Key, etcdrbac.TokenHostsPrefix)
				if strings.EqualFold(name, rec.Host) && etcdrbac.TokenRemoved(kv.Value) {
					return errf(http.StatusForbidden, "host: the token of host %q was removed", name)
				}
			}
		}
		kvs, err := tx.List(model.WireGuardPrefix)
		if err != nil {
			return err
		}
		var prev *model.WireGuardHost
		for _, kv := range kvs {
			var other model.WireGuardHost
			if kv.Decode(&other) != nil {
				continue
			}
			if kv.Key == model.WireGuardKey(rec.Host) {
				prev = &other
				continue
			}
			if other.PublicKey == rec.PublicKey {
				return conflict("publicKey: host %q already published this key", other.Host)
			}
		}
		return tx.Put(model.WireGuardKey(rec.Host), rec.Republished(prev))
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, struct{}{})
}

// deleteWireGuard removes a host's WireGuard record (DELETE /wireguard/hosts/<host>,
// admins only: 403 otherwise, 404 when the host has none). Every other host then removes
// that peer and its route, and its VTEP falls to their blackhole. A record that does not
// decode goes too. Revoking a host's token removes its record by itself
// (etcdrbac.Manager.RemoveHost); an agent that still runs publishes its record again.
func (m *Master) deleteWireGuard(w http.ResponseWriter, r *http.Request) {
	host, err := wireGuardHostOf(r, "WireGuard records")
	if err != nil {
		writeErr(w, err)
		return
	}
	err = m.store.Update(r.Context(), func(tx *state.Tx) error {
		return deleteExisting(tx, model.WireGuardKey(host), notFound("host: %q has no WireGuard record", host))
	})
	if err == nil {
		m.log.Info("wireguard record deleted: peers drop this host", "host", host)
	}
	answer(w, "success", err)
}

// wireGuardHostOf is the {host} of an admin's request on a host's WireGuard record (what
// names it in the 403 of other callers), checked as the agent's publication checks it.
func wireGuardHostOf(r *http.Request, what string) (string, error) {
	if err := adminOnly(r, what); err != nil {
		return "", err
	}
	host := mux.Vars(r)["host"]
	return host, checkPluginFields(map[string]string{"host": host})
}

// rotateWireGuard asks a host's agent for a new key (POST /wireguard/hosts/<host>/rotate,
// admins only: 403 otherwise, the host's own agent too; 404 naming host without a record):
// the record's rotation generation goes up by one and is pending until the agent, which
// follows the records by its watch, publishes a new key (model.WireGuardHost.Rotate,
// wgsteer). It answers the record as written.
func (m *Master) rotateWireGuard(w http.ResponseWriter, r *http.Request) {
	host, err := wireGuardHostOf(r, "WireGuard key rotations")
	if err != nil {
		writeErr(w, err)
		return
	}
	var rec model.WireGuardHost
	err = m.store.Update(r.Context(), func(tx *state.Tx) error {
		ok, err := tx.Get(model.WireGuardKey(host), &rec)
		if err != nil {
			return err
		}
		if !ok {
			return notFound("host: %q has no WireGuard record", host)
		}
		rec.Rotate = max(rec.Rotate, rec.Rotated) + 1
		return tx.Put(model.WireGuardKey(host), rec)
	})
	if err == nil {
		m.log.Info("wireguard key rotation requested", "host", host, "generation", rec.Rotate)
	}
	answer(w, rec, err)
}

// listWireGuard answers every host's WireGuard record as stored, sorted by key (GET
// /wireguard/hosts; a record that does not decode is left out): public keys, endpoints
// and rotation state, nothing secret. Tenant-scoped callers are refused by auth.
func (m *Master) listWireGuard(w http.ResponseWriter, r *http.Request) {
	out := []model.WireGuardHost{}
	err := m.read(r.Context(), func(tx *state.Tx) error {
		kvs, err := tx.List(model.WireGuardPrefix)
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			var rec model.WireGuardHost
			if kv.Decode(&rec) == nil {
				out = append(out, rec)
			}
		}
		return nil
	})
	answer(w, out, err)
}
