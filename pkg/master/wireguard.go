package master

import (
	"net/http"
	"strings"

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
	if host := boundHost(r); host != "" && !strings.EqualFold(rec.Host, host) {
		writeErr(w, errf(http.StatusForbidden, "host: the agent of host %q may not publish the WireGuard key of host %q", host, rec.Host))
		return
	}
	rec.Host = strings.ToLower(rec.Host) // (as model.WireGuardKey spells it)
	err := m.store.Update(r.Context(), func(tx *state.Tx) error {
		kvs, err := tx.List(model.WireGuardPrefix)
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			var other model.WireGuardHost
			if kv.Key == model.WireGuardKey(rec.Host) || kv.Decode(&other) != nil {
				continue
			}
			if other.PublicKey == rec.PublicKey {
				return conflict("publicKey: host %q already published this key", other.Host)
			}
		}
		return tx.Put(model.WireGuardKey(rec.Host), rec)
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, struct{}{})
}
