package master

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
	"github.com/contivbpf/contivbpf/pkg/vxlan"
)

// The deny list routes (model.Prefilter, issue 36): GET /api/v1/prefilters/ (every entry)
// and /api/v1/prefilters/<name>/, PUT or POST (an admin sets an entry: the whole record)
// and DELETE (an admin drops it). The entries name hosts and the prefixes an operator
// distrusts: they are for admins, operators and agents (which apply them); a tenant-admin
// reads none (auth.Authorize). Contiv has no such collection; its clients never call it.
func registerPrefilters(r *mux.Router, m *Master) {
	const base = "/api/v1/" + model.CollPrefilters + "/"
	r.HandleFunc(base, m.listPrefilters).Methods(http.MethodGet)
	r.HandleFunc(base+"{name}/", m.getPrefilter).Methods(http.MethodGet)
	r.HandleFunc(base+"{name}/", m.setPrefilter).Methods(http.MethodPost, http.MethodPut)
	r.HandleFunc(base+"{name}/", m.deletePrefilter).Methods(http.MethodDelete)
}

// checkPrefilter validates an admin's entry name (the URL's, which the body may repeat)
// and stores its fields canonical: the prefix masked, the host lowercase.
func checkPrefilter(name string, p *model.Prefilter) error {
	if err := checkName("name", name, 64); err != nil {
		return err
	}
	if p.Name != "" && p.Name != name {
		return badReq("name: %q differs from the URL's name %q", p.Name, name)
	}
	p.Name = name
	cidr, err := denyPrefix(p.CIDR)
	if err != nil {
		return err
	}
	p.CIDR = cidr.String()
	if p.Host != "" {
		if err := checkPluginFields(map[string]string{"host": p.Host}); err != nil {
			return err
		}
		if strings.TrimSpace(p.Host) != p.Host {
			return badReq("host: %q begins or ends with a space: no agent's host label does, so the entry would apply nowhere", p.Host)
		}
		p.Host = strings.ToLower(p.Host) // (as agents compare it: model.Prefilter.AppliesTo)
	}
	return nil
}

// denyPrefix parses a deny list prefix: IPv4 only (the datapath's list is), masked, and
// never /0, which would drop the hosts' own control plane (etcd, netmaster, peers) too.
func denyPrefix(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, badReq("cidr: required (an IPv4 prefix like 192.0.2.0/24)")
	}
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return p, badReq("cidr: %q is not an IPv4 prefix like 192.0.2.0/24", s)
	case !p.Addr().Is4():
		return p, badReq("cidr: %q is IPv6: the deny list holds IPv4 prefixes only for now", s)
	case p.Bits() == 0:
		return p, badReq("cidr: %q denies every source, the hosts' own control plane too: name a narrower prefix", s)
	}
	return p.Masked(), nil
}

// vtepOutside refuses (400 naming cidr and the host) a prefix holding a known host's VTEP
// (its durable record, vxlan.HostVTEPPrefix): denying it would cut the overlay to that
// host. A record that does not decode names no VTEP and is passed over.
func vtepOutside(tx *state.Tx, cidr string) error {
	p := netip.MustParsePrefix(cidr) // (checkPrefilter made it)
	kvs, err := tx.List(vxlan.HostVTEPPrefix)
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		h, vtep, err := vxlan.DecodeHostVTEP(kv.Value)
		if err == nil && p.Contains(vtep) {
			return badReq("cidr: %s holds the VTEP %s of host %q: denying it would cut the overlay to that host", cidr, vtep, h.Host)
		}
	}
	return nil
}

func (m *Master) listPrefilters(w http.ResponseWriter, r *http.Request) {
	listRecords[model.Prefilter](m, w, r, model.PrefilterPrefix) // (by key: by name)
}

func (m *Master) getPrefilter(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if _, scoped := auth.TenantScope(r.Context()); scoped { // (auth.Authorize refuses them first)
		writeErr(w, errf(http.StatusForbidden, "prefilters are for admins, operators and agents"))
		return
	}
	getRecord[model.Prefilter](m, w, r, model.PrefilterKey(name), notFound("prefilter %q not found", name))
}

func (m *Master) setPrefilter(w http.ResponseWriter, r *http.Request) {
	if err := adminOnly(r, "prefilters"); err != nil {
		writeErr(w, err)
		return
	}
	name := mux.Vars(r)["name"]
	var p model.Prefilter
	if err := decodeStrict(r, &p); err != nil {
		writeErr(w, err)
		return
	}
	if err := checkPrefilter(name, &p); err != nil {
		writeErr(w, err)
		return
	}
	err := m.update(r.Context(), func(tx *state.Tx) error {
		if err := vtepOutside(tx, p.CIDR); err != nil {
			return err
		}
		kvs, err := tx.List(model.PrefilterPrefix)
		if err != nil {
			return err
		}
		if _, ok, err := tx.GetRaw(model.PrefilterKey(name)); err != nil {
			return err
		} else if !ok && len(kvs) >= model.MaxPrefilters {
			return conflict("prefilters: the deny list holds %d entries, at most %d: drop one first", len(kvs), model.MaxPrefilters)
		}
		return tx.Put(model.PrefilterKey(name), &p)
	})
	if err == nil {
		m.log.Info("prefilter set", "name", name, "cidr", p.CIDR, "host", p.Host)
	}
	answer(w, p, err)
}

func (m *Master) deletePrefilter(w http.ResponseWriter, r *http.Request) {
	name := mux.Vars(r)["name"]
	if dropRecord(m, w, r, "prefilters", model.PrefilterKey(name), notFound("prefilter %q not found", name)) {
		m.log.Info("prefilter dropped", "name", name)
	}
}
