package master

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strings"

	"github.com/gorilla/mux"

	"github.com/contivbpf/contivbpf/pkg/auth"
	"github.com/contivbpf/contivbpf/pkg/model"
	"github.com/contivbpf/contivbpf/pkg/state"
)

const maxBody = 1 << 20

// Handler returns the HTTP API: /api/v1/..., /version, /services, /service/<id>, /plugin/*.
// Trailing slashes are mandatory on /api/v1 paths, as in Contiv.
func (m *Master) Handler() http.Handler {
	return recoverer(m, contivErrors(m.router()))
}

// Route is one route of the API: its path template ("/service/{id}") and methods (none:
// any method).
type Route struct {
	Path    string
	Methods []string
}

// Routes lists every route Handler serves, read from its router: for tests that walk
// them all, so that a route added later is covered too.
func Routes() ([]Route, error) {
	var out []Route
	err := (&Master{}).router().Walk(func(rt *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := rt.GetPathTemplate()
		if err != nil {
			return fmt.Errorf("route without a path template: %w", err)
		}
		methods, _ := rt.GetMethods() // (an error means: any method)
		out = append(out, Route{Path: tpl, Methods: methods})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk the API's routes: %w", err)
	}
	return out, nil
}

func (m *Master) router() *mux.Router {
	r := mux.NewRouter()
	registerObject(r, m, tenantOps())
	registerObject(r, m, networkOps())
	registerObject(r, m, epgOps())
	registerObject(r, m, policyOps())
	registerObject(r, m, ruleOps())
	registerObject(r, m, appProfileOps())
	registerObject(r, m, serviceLBOps())
	registerObject(r, m, globalOps())
	registerObject(r, m, netprofileOps())
	registerObject(r, m, bgpOps())
	registerObject(r, m, extContractsOps())
	registerObject(r, m, aciGwOps())
	r.HandleFunc("/api/v1/inspect/endpoints/{key}/", m.inspectEndpoint).Methods(http.MethodGet)
	registerQuotas(r, m)
	registerHostScopes(r, m)
	registerPrefilters(r, m)

	r.HandleFunc("/version", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, m.cfg.Version) }).Methods(http.MethodGet)
	r.HandleFunc("/services", m.listServices).Methods(http.MethodGet)
	r.HandleFunc("/service/{id}", m.getService).Methods(http.MethodGet)
	r.HandleFunc("/wireguard/hosts", m.listWireGuard).Methods(http.MethodGet)
	r.HandleFunc("/wireguard/hosts/{host}", m.deleteWireGuard).Methods(http.MethodDelete)
	r.HandleFunc("/wireguard/hosts/{host}/rotate", m.rotateWireGuard).Methods(http.MethodPost)

	plugin := []struct {
		path string
		h    http.HandlerFunc
	}{
		{"/plugin/allocAddress", m.allocAddress},
		{"/plugin/releaseAddress", m.releaseAddress},
		{"/plugin/createEndpoint", m.createEndpoint},
		{"/plugin/deleteEndpoint", m.deleteEndpoint},
		{"/plugin/updateEndpoint", m.updateEndpoint},
		{"/plugin/recordEndpoint", m.recordEndpoint},
		{"/plugin/forgetEndpoint", m.forgetEndpoint},
		{"/plugin/etcdAccess", m.etcdAccess},
		{"/plugin/publishWireGuard", m.publishWireGuard},
	}
	for _, p := range plugin {
		r.HandleFunc(p.path, p.h).Methods(http.MethodPost).HeadersRegexp("Content-Type", "^application/json")
		r.HandleFunc(p.path, func(w http.ResponseWriter, _ *http.Request) {
			writeErr(w, errf(http.StatusUnsupportedMediaType, "%s needs POST with Content-Type: application/json", p.path))
		})
	}
	return r
}

// hdrAPIError marks an error answer written by writeErr (and not, e.g., the router's 404
// for an unknown path) until contivErrors has seen it.
const hdrAPIError = "X-Contivbpf-Api-Error"

// ProblemJSON is the media type of RFC 7807 error bodies.
const ProblemJSON = "application/problem+json"

// Problem is an RFC 7807 error body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// contivErrors makes /api/v1 errors look as Contiv's netmaster made them: status 500 with
// the message as text/plain, which is the only status whose body Contiv's clients (its
// netctl, the contivmodel client) print. A client that asks for application/problem+json
// (our netctl does) gets the real status (400, 404, 409, 422, ...) with an RFC 7807 body.
// Other routes (/plugin/*, /version, ...) keep their real status as text.
func contivErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/v1/") {
			next.ServeHTTP(w, r)
			return
		}
		ew := &errWriter{ResponseWriter: w, problem: strings.Contains(r.Header.Get("Accept"), ProblemJSON)}
		next.ServeHTTP(ew, r)
		ew.finish()
	})
}

type errWriter struct {
	http.ResponseWriter
	problem   bool
	intercept bool
	code      int
	buf       bytes.Buffer
}

func (w *errWriter) WriteHeader(code int) {
	if code >= 400 && w.Header().Get(hdrAPIError) != "" {
		w.Header().Del(hdrAPIError)
		w.intercept, w.code = true, code
		if !w.problem {
			w.ResponseWriter.WriteHeader(http.StatusInternalServerError)
		}
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *errWriter) Write(b []byte) (int, error) {
	if w.intercept && w.problem {
		return w.buf.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

func (w *errWriter) finish() {
	if !w.intercept || !w.problem {
		return
	}
	w.Header().Set("Content-Type", ProblemJSON)
	w.ResponseWriter.WriteHeader(w.code)
	_ = json.NewEncoder(w.ResponseWriter).Encode(Problem{Type: "about:blank", Title: http.StatusText(w.code),
		Status: w.code, Detail: strings.TrimSpace(w.buf.String())})
}

func recoverer(m *Master, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				m.log.Error("panic serving request", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				writeErr(w, errf(http.StatusInternalServerError, "internal error: %v", v))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(hdrAPIError, "1")
	w.WriteHeader(statusOf(err))
	fmt.Fprintln(w, err.Error())
}

// decodeStrict decodes one JSON value into v, refusing unknown fields, wrong types and
// trailing data; the error names the offending field. Top-level keys listed in ignore are
// dropped first (server-owned link-sets/links that clients echo back on any object).
func decodeStrict(r *http.Request, v any, ignore ...string) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return badReq("read request body: %v", err)
	}
	if len(body) > maxBody {
		return errf(http.StatusRequestEntityTooLarge, "request body larger than %d bytes", maxBody)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badReq("empty request body: a JSON object is required")
	}
	if len(ignore) > 0 {
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) == nil && top != nil {
			dropped := false
			for _, k := range ignore {
				if _, ok := top[k]; ok {
					delete(top, k)
					dropped = true
				}
			}
			if dropped {
				if b, err := json.Marshal(top); err == nil {
					body = b
				}
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" {
			return badReq("malformed JSON: expected a JSON object, got JSON %s", te.Value)
		}
		if errors.As(err, &te) {
			return badReq("field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return badReq("malformed JSON: %v", err)
	}
	if dec.More() {
		return badReq("malformed JSON: trailing data after the object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return badReq("malformed JSON: trailing data after the object")
	}
	return nil
}

// objOps describes one model collection.
type objOps[T any] struct {
	coll, objType string
	// key is the key formula from the object's fields.
	key    func(*T) string
	setKey func(*T, string)
	// prepare fills defaults and checks fields (no store access); old is nil on create.
	validate func(*T) error
	// save writes the object and everything derived from it; old is nil on create. It
	// must copy server-owned links from old (if any).
	save func(m *Master, tx *state.Tx, obj, old *T) error
	// remove deletes the object and its derived state.
	remove func(m *Master, tx *state.Tx, old *T) error
	// inspect returns the inspect body; nil means {"Config": obj}.
	inspect func(m *Master, tx *state.Tx, obj *T) (any, error)
	// claim, when set, decides before a write whether the caller (ctx) may write obj (nil:
	// a delete) under key over old (nil: a create) and records what it needs.
	claim func(ctx context.Context, tx *state.Tx, key string, obj, old *T) error
	// links, when set, fills the derived link-sets (links.go) of objects read; created
	// holds each one's create revision. Records are stored with them empty.
	links func(src *linkSource, objs []*T, created []int64) error
}

// tenantOfKey is the tenant of the model object of objType at key ("" none).
func tenantOfKey(objType, key string) string {
	if objType == model.TypeTenant {
		return key
	}
	return scopedTenant(key)
}

// readOne reads the object of ops at key in tx, its derived link-sets filled.
func readOne[T any](tx *state.Tx, ops objOps[T], key string) (*T, bool, error) {
	kv, found, err := tx.GetKV(model.ModelKey(ops.objType, key))
	if err != nil || !found {
		return nil, found, err
	}
	var obj T
	if err := kv.Decode(&obj); err != nil {
		return nil, true, err
	}
	if ops.links != nil {
		if err := ops.links(newLinkSource(tx, []string{tenantOfKey(ops.objType, key)}), []*T{&obj}, []int64{kv.CreateRev}); err != nil {
			return nil, true, err
		}
	}
	return &obj, true, nil
}

// listLinked is the collection of ops the caller may see, as its records read (raw), or
// decoded with their derived link-sets filled when ops has any: one listing per
// collection a link-set is made of, whatever the number of objects.
func listLinked[T any](ctx context.Context, m *Master, ops objOps[T]) ([]json.RawMessage, error) {
	prefix := model.ModelKey(ops.objType, "")
	tenant, scoped := auth.TenantScope(ctx)
	visible := func(kv state.KV) bool {
		return !scoped || auth.Visible(ops.coll, strings.TrimPrefix(kv.Key, prefix), tenant)
	}
	if ops.links == nil {
		kvs, _, err := m.store.List(ctx, prefix)
		if err != nil {
			return nil, err
		}
		out := make([]json.RawMessage, 0, len(kvs))
		for _, kv := range kvs {
			if visible(kv) {
				out = append(out, kv.Value)
			}
		}
		return out, nil
	}
	var out []json.RawMessage
	err := m.read(ctx, func(tx *state.Tx) error {
		kvs, err := tx.List(prefix)
		if err != nil {
			return err
		}
		out = make([]json.RawMessage, 0, len(kvs))
		var objs []*T
		var created []int64
		var tenants []string
		var at []int // objs[i] answers out[at[i]]
		for _, kv := range kvs {
			if !visible(kv) {
				continue
			}
			out = append(out, kv.Value)
			var obj T
			if kv.Decode(&obj) != nil {
				continue // (served as stored, as before)
			}
			objs, created, at = append(objs, &obj), append(created, kv.CreateRev), append(at, len(out)-1)
			tenants = append(tenants, tenantOfKey(ops.objType, strings.TrimPrefix(kv.Key, prefix)))
		}
		if len(objs) == 0 {
			return nil
		}
		if err := ops.links(newLinkSource(tx, tenants), objs, created); err != nil {
			return err
		}
		for i, obj := range objs {
			b, err := json.Marshal(obj)
			if err != nil {
				return err
			}
			out[at[i]] = b
		}
		return nil
	})
	return out, err
}

func registerObject[T any](r *mux.Router, m *Master, ops objOps[T]) {
	base := "/api/v1/" + ops.coll + "/"
	r.HandleFunc(base, func(w http.ResponseWriter, req *http.Request) {
		// A tenant-admin lists only its tenant's objects (and global ones).
		out, err := listLinked(req.Context(), m, ops)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, out)
	}).Methods(http.MethodGet)

	r.HandleFunc(base+"{key}/", func(w http.ResponseWriter, req *http.Request) {
		key := mux.Vars(req)["key"]
		var obj *T
		err := m.read(req.Context(), func(tx *state.Tx) error {
			var found bool
			var err error
			if obj, found, err = readOne(tx, ops, key); err == nil && !found {
				err = notFound("%s %q not found", ops.objType, key)
			}
			return err
		})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, obj)
	}).Methods(http.MethodGet)

	r.HandleFunc(base+"{key}/", func(w http.ResponseWriter, req *http.Request) {
		key := mux.Vars(req)["key"]
		var obj T
		if err := decodeStrict(req, &obj, "link-sets", "links"); err != nil {
			writeErr(w, err)
			return
		}
		ops.setKey(&obj, key)
		if want := ops.key(&obj); want != key {
			writeErr(w, badReq("Invalid Key: %s key %q does not match its fields (expected %q)", ops.objType, key, want))
			return
		}
		if err := ops.validate(&obj); err != nil {
			writeErr(w, err)
			return
		}
		var saved T
		err := m.update(req.Context(), func(tx *state.Tx) error {
			cur := obj // fresh copy per attempt: save may modify it
			var old T
			found, err := tx.Get(model.ModelKey(ops.objType, key), &old)
			if err != nil {
				return err
			}
			var oldp *T
			if found {
				oldp = &old
			}
			if ops.claim != nil {
				if err := ops.claim(req.Context(), tx, key, &cur, oldp); err != nil {
					return err
				}
			}
			if err := ops.save(m, tx, &cur, oldp); err != nil {
				return err
			}
			saved = cur
			return nil
		})
		if err != nil {
			writeErr(w, err)
			return
		}
		if ops.links != nil {
			// The answer shows the derived link-sets as a GET would, read after the commit
			// (deriving them in the write's transaction would make it retry on every
			// concurrent create in the tenant).
			err := m.read(req.Context(), func(tx *state.Tx) error {
				kv, found, err := tx.GetKV(model.ModelKey(ops.objType, key))
				if err != nil || !found {
					return err
				}
				return ops.links(newLinkSource(tx, []string{tenantOfKey(ops.objType, key)}), []*T{&saved}, []int64{kv.CreateRev})
			})
			if err != nil {
				m.log.Warn("derive the link-sets of a saved object", "type", ops.objType, "key", key, "err", err)
			}
		}
		writeJSON(w, &saved)
	}).Methods(http.MethodPost, http.MethodPut)

	r.HandleFunc(base+"{key}/", func(w http.ResponseWriter, req *http.Request) {
		key := mux.Vars(req)["key"]
		err := m.update(withoutQuota(req.Context()), func(tx *state.Tx) error { // (a delete is never refused for quota)
			var old T
			found, err := tx.Get(model.ModelKey(ops.objType, key), &old)
			if err != nil {
				return err
			}
			if !found {
				return notFound("%s %q not found", ops.objType, key)
			}
			if ops.claim != nil {
				if err := ops.claim(req.Context(), tx, key, nil, &old); err != nil {
					return err
				}
			}
			return ops.remove(m, tx, &old)
		})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, key)
	}).Methods(http.MethodDelete)

	r.HandleFunc("/api/v1/inspect/"+ops.coll+"/{key}/", func(w http.ResponseWriter, req *http.Request) {
		key := mux.Vars(req)["key"]
		var out any
		err := m.read(req.Context(), func(tx *state.Tx) error {
			obj, found, err := readOne(tx, ops, key)
			if err != nil {
				return err
			}
			if !found {
				return notFound("%s %q not found", ops.objType, key)
			}
			if ops.inspect == nil {
				out = struct{ Config *T }{obj}
				return nil
			}
			if out, err = ops.inspect(m, tx, obj); err != nil {
				return err
			}
			if tenant, scoped := auth.TenantScope(req.Context()); scoped {
				out, err = scopedInspect(tx, out, tenant)
			}
			return err
		})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, out)
	}).Methods(http.MethodGet)
}

// getT reads key into a new T; found=false if absent.
func getT[T any](tx *state.Tx, key string) (*T, bool, error) {
	var v T
	found, err := tx.Get(key, &v)
	if err != nil || !found {
		return nil, found, err
	}
	return &v, true, nil
}

// tenantNetwork returns network name of tenant's state. Network ids are "<net>.<tenant>"
// and both may contain dots, so another tenant's network can spell the same id (network
// "x.a" of tenant "b" and network "x" of tenant "a.b"): a record that is not name's of
// tenant is not found, so no object of one tenant resolves to another tenant's network
// (found by review: a service or group bound to it took its addresses and its tag).
func tenantNetwork(tx *state.Tx, name, tenant string) (*model.CfgNetworkState, bool, error) {
	ns, found, err := getT[model.CfgNetworkState](tx, model.NetStateKey(model.NetworkID(name, tenant)))
	if err != nil || !found || !ns.Owns(name, tenant) {
		return nil, false, err
	}
	return ns, true, nil
}

// tenantEndpoints lists the endpoint records of tenant's networks, reading one key range
// per network of the tenant ("<net>.<tenant>-<container>") instead of every endpoint of
// the cluster. Endpoints created without a container are keyed "<host>-native-intf",
// outside those ranges: when a network counts more endpoints (its epCount) than its range
// holds, every endpoint record is read instead.
func tenantEndpoints(tx *state.Tx, tenant string) ([]*model.CfgEndpointState, error) {
	nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
	if err != nil {
		return nil, err
	}
	mine := map[string]bool{}
	var out []*model.CfgEndpointState
	outside := false
	for _, n := range nets {
		if n.Tenant != tenant || n.ID == "" {
			continue
		}
		mine[n.ID] = true
		eps, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix+n.ID+"-")
		if err != nil {
			return nil, err
		}
		k := 0
		for _, ep := range eps {
			if ep.NetID == n.ID { // "<net>.<tenant>-" may prefix another network's ids
				out = append(out, ep)
				k++
			}
		}
		outside = outside || k < n.EpCount
	}
	if !outside {
		return out, nil
	}
	all, err := listT[model.CfgEndpointState](tx, model.EpStatePrefix)
	if err != nil {
		return nil, err
	}
	out = out[:0]
	for _, ep := range all {
		if mine[ep.NetID] {
			out = append(out, ep)
		}
	}
	return out, nil
}

// listT decodes every record under prefix.
func listT[T any](tx *state.Tx, prefix string) ([]*T, error) {
	kvs, err := tx.List(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]*T, 0, len(kvs))
	for _, kv := range kvs {
		var v T
		if err := kv.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, &v)
	}
	return out, nil
}

// mutate applies f to the stored object at key (if it exists) and writes it back.
func mutate[T any](tx *state.Tx, key string, f func(*T)) error {
	v, found, err := getT[T](tx, key)
	if err != nil || !found {
		return err
	}
	f(v)
	return tx.Put(key, v)
}

func addLink(m *map[string]model.Link, objType, key string) {
	if *m == nil {
		*m = map[string]model.Link{}
	}
	(*m)[key] = model.Link{ObjType: objType, ObjKey: key}
}

func delLink(m *map[string]model.Link, key string) {
	delete(*m, key)
	if len(*m) == 0 {
		*m = nil
	}
}

// scopedInspect is a tenant-admin's view of a global object's inspect: the counts cover
// its own tenant, and other tenants' tags in use are left out (found by review: they told
// every tenant how many networks and which tags the others had).
// hideLocalTag drops a VXLAN network's host-local VLAN (pktTag; its VNI is
// externalPktTag) from what a tenant-admin sees: it comes from one pool for every tenant,
// so its value would count the other tenants' VXLAN networks, and neither datapath uses it.
func hideLocalTag(o model.NetworkOper) model.NetworkOper {
	if o.ExternalPktTag != 0 {
		o.PktTag = 0
	}
	return o
}

func scopedInspect(tx *state.Tx, out any, tenant string) (any, error) {
	switch v := out.(type) {
	case model.GlobalInspect:
		nets, err := listT[model.CfgNetworkState](tx, model.NetStatePrefix)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, ns := range nets {
			if ns.Tenant == tenant {
				n++
			}
		}
		v.Oper.NumNetworks, v.Oper.VlansInUse, v.Oper.VxlansInUse = n, "", ""
		return v, nil
	case model.NetworkInspect:
		v.Oper = hideLocalTag(v.Oper)
		return v, nil
	case model.TenantInspect:
		nets := make([]model.NetworkOper, len(v.Oper.Networks))
		for i, no := range v.Oper.Networks {
			nets[i] = hideLocalTag(no)
		}
		v.Oper.Networks = nets
		return v, nil
	case model.AciGwInspect:
		kvs, err := tx.List(model.ModelKey(model.TypeAppProfile, model.ScopedKey(tenant, "")))
		if err != nil {
			return nil, err
		}
		v.Oper.NumAppProfiles = len(kvs)
		return v, nil
	}
	return out, nil
}
