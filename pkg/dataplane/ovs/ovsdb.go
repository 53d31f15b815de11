package ovs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/ovn-org/libovsdb/client"
	"github.com/ovn-org/libovsdb/model"
	"github.com/ovn-org/libovsdb/ovsdb"

	"github.com/contivbpf/contivbpf/pkg/dataplane/ovs/ovsmodel"
)

// extOwner marks every Port/Interface/Bridge this driver created (external_ids key).
const extOwner = "contivbpf-owner"

// ovsDB is the OVSDB side of the driver: bridges, ports and interfaces.
type ovsDB struct {
	c client.Client
}

func connectOVSDB(ctx context.Context, endpoint string) (*ovsDB, error) {
	dbModel, err := ovsmodel.FullDatabaseModel()
	if err != nil {
		return nil, fmt.Errorf("ovsdb model: %w", err)
	}
	quiet := logr.Discard()
	c, err := client.NewOVSDBClient(dbModel, client.WithEndpoint(endpoint), client.WithLogger(&quiet))
	if err != nil {
		return nil, fmt.Errorf("ovsdb client %s: %w", endpoint, err)
	}
	if err := c.Connect(ctx); err != nil {
		return nil, fmt.Errorf("ovsdb connect %s: %w", endpoint, err)
	}
	if err := schemaCompatible(c.Schema(), ovsmodel.Schema()); err != nil {
		c.Close()
		return nil, fmt.Errorf("ovsdb %s: %w", endpoint, err)
	}
	if _, err := c.MonitorAll(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("ovsdb monitor %s: %w", endpoint, err)
	}
	return &ovsDB{c: c}, nil
}

// schemaCompatible refuses a server whose Open_vSwitch schema has another major version
// than the one the models were generated from: columns may have changed meaning. (libovsdb
// itself checks that every modelled column exists with its type.)
func schemaCompatible(server, built ovsdb.DatabaseSchema) error {
	major := func(v string) string { m, _, _ := strings.Cut(v, "."); return m }
	if server.Name != built.Name || major(server.Version) != major(built.Version) {
		return fmt.Errorf("server schema %s %s, this build knows %s %s.x (Open vSwitch 2.11 and later)",
			server.Name, server.Version, built.Name, major(built.Version))
	}
	return nil
}

func (o *ovsDB) Close() { o.c.Close() }

func (o *ovsDB) transact(ctx context.Context, what string, ops ...ovsdb.Operation) error {
	if len(ops) == 0 {
		return nil
	}
	res, err := o.c.Transact(ctx, ops...)
	if err != nil {
		return fmt.Errorf("ovsdb %s: %w", what, err)
	}
	if _, err := ovsdb.CheckOperationResults(res, ops); err != nil {
		return fmt.Errorf("ovsdb %s: %w", what, err)
	}
	return nil
}

func (o *ovsDB) root(ctx context.Context) (*ovsmodel.OpenvSwitch, error) {
	var rows []ovsmodel.OpenvSwitch
	if err := o.c.List(ctx, &rows); err != nil {
		return nil, fmt.Errorf("ovsdb list Open_vSwitch: %w", err)
	}
	if len(rows) == 0 {
		return nil, errors.New("ovsdb: Open_vSwitch table is empty (database not initialised)")
	}
	return &rows[0], nil
}

func (o *ovsDB) bridge(name string) *ovsmodel.Bridge {
	br := &ovsmodel.Bridge{Name: name}
	if err := o.c.Get(context.Background(), br); err != nil {
		return nil
	}
	return br
}

func (o *ovsDB) port(name string) *ovsmodel.Port {
	p := &ovsmodel.Port{Name: name}
	if err := o.c.Get(context.Background(), p); err != nil {
		return nil
	}
	return p
}

func (o *ovsDB) iface(name string) *ovsmodel.Interface {
	i := &ovsmodel.Interface{Name: name}
	if err := o.c.Get(context.Background(), i); err != nil {
		return nil
	}
	return i
}

// ensureBridge creates a netdev bridge with its LOCAL internal port. secure: fail_mode
// secure (no flows but ours); otherwise standalone (a learning switch when no flows).
func (o *ovsDB) ensureBridge(ctx context.Context, name string, secure bool, ext map[string]string) error {
	mode := ovsmodel.BridgeFailModeStandalone
	if secure {
		mode = ovsmodel.BridgeFailModeSecure
	}
	ext = maps.Clone(ext)
	if ext == nil {
		ext = map[string]string{}
	}
	ext[extOwner] = "contivbpf"
	if br := o.bridge(name); br != nil {
		changed := br.DatapathType != "netdev" || br.FailMode == nil || *br.FailMode != mode
		for k, v := range ext {
			if br.ExternalIDs[k] != v {
				changed = true
			}
		}
		if !changed {
			return nil
		}
		br.DatapathType, br.FailMode = "netdev", &mode
		if br.ExternalIDs == nil {
			br.ExternalIDs = map[string]string{}
		}
		maps.Copy(br.ExternalIDs, ext)
		ops, err := o.c.Where(br).Update(br, &br.DatapathType, &br.FailMode, &br.ExternalIDs)
		if err != nil {
			return fmt.Errorf("ovsdb update bridge %s: %w", name, err)
		}
		return o.transact(ctx, "update bridge "+name, ops...)
	}
	root, err := o.root(ctx)
	if err != nil {
		return err
	}
	iface := &ovsmodel.Interface{UUID: "newiface", Name: name, Type: "internal"}
	port := &ovsmodel.Port{UUID: "newport", Name: name, Interfaces: []string{"newiface"}}
	br := &ovsmodel.Bridge{
		UUID: "newbridge", Name: name, DatapathType: "netdev", FailMode: &mode,
		Protocols:   []ovsmodel.BridgeProtocols{ovsmodel.BridgeProtocolsOpenflow13},
		Ports:       []string{"newport"},
		OtherConfig: map[string]string{"disable-in-band": "true"},
		ExternalIDs: ext,
	}
	ops, err := o.c.Create(iface, port, br)
	if err != nil {
		return fmt.Errorf("ovsdb create bridge %s: %w", name, err)
	}
	mut, err := o.c.Where(root).Mutate(root, model.Mutation{Field: &root.Bridges, Mutator: ovsdb.MutateOperationInsert, Value: []string{"newbridge"}})
	if err != nil {
		return fmt.Errorf("ovsdb add bridge %s: %w", name, err)
	}
	return o.transact(ctx, "create bridge "+name, append(ops, mut...)...)
}

// portSpec is one port with a single interface.
type portSpec struct {
	Name          string
	Type          string // "" (system), "vxlan", "internal"
	Options       map[string]string
	ExternalIDs   map[string]string
	OfportRequest int
}

// ensurePort creates the port on bridge or updates its interface to match spec.
func (o *ovsDB) ensurePort(ctx context.Context, bridge string, spec portSpec) error {
	br := o.bridge(bridge)
	if br == nil {
		return fmt.Errorf("ovsdb: bridge %s does not exist", bridge)
	}
	ext := maps.Clone(spec.ExternalIDs)
	if ext == nil {
		ext = map[string]string{}
	}
	ext[extOwner] = "contivbpf"
	var req *int
	if spec.OfportRequest > 0 {
		req = &spec.OfportRequest
	}
	if p := o.port(spec.Name); p != nil {
		if !slices.Contains(br.Ports, p.UUID) {
			return fmt.Errorf("ovsdb: port %s exists on another bridge", spec.Name)
		}
		i := o.iface(spec.Name)
		if i == nil {
			return fmt.Errorf("ovsdb: port %s has no interface %s", spec.Name, spec.Name)
		}
		if i.Type == spec.Type && maps.Equal(i.Options, spec.Options) && maps.Equal(i.ExternalIDs, ext) {
			return nil
		}
		i.Type, i.Options, i.ExternalIDs = spec.Type, spec.Options, ext
		ops, err := o.c.Where(i).Update(i, &i.Type, &i.Options, &i.ExternalIDs)
		if err != nil {
			return fmt.Errorf("ovsdb update interface %s: %w", spec.Name, err)
		}
		return o.transact(ctx, "update interface "+spec.Name, ops...)
	}
	iface := &ovsmodel.Interface{UUID: "newiface", Name: spec.Name, Type: spec.Type, Options: spec.Options, ExternalIDs: ext, OfportRequest: req}
	port := &ovsmodel.Port{UUID: "newport", Name: spec.Name, Interfaces: []string{"newiface"}, ExternalIDs: ext}
	ops, err := o.c.Create(iface, port)
	if err != nil {
		return fmt.Errorf("ovsdb create port %s: %w", spec.Name, err)
	}
	mut, err := o.c.Where(br).Mutate(br, model.Mutation{Field: &br.Ports, Mutator: ovsdb.MutateOperationInsert, Value: []string{"newport"}})
	if err != nil {
		return fmt.Errorf("ovsdb add port %s: %w", spec.Name, err)
	}
	return o.transact(ctx, "create port "+spec.Name, append(ops, mut...)...)
}

// deletePort removes a port from bridge (Port and Interface rows are garbage collected).
func (o *ovsDB) deletePort(ctx context.Context, bridge, name string) error {
	br, p := o.bridge(bridge), o.port(name)
	if br == nil || p == nil {
		return nil
	}
	mut, err := o.c.Where(br).Mutate(br, model.Mutation{Field: &br.Ports, Mutator: ovsdb.MutateOperationDelete, Value: []string{p.UUID}})
	if err != nil {
		return fmt.Errorf("ovsdb delete port %s: %w", name, err)
	}
	return o.transact(ctx, "delete port "+name, mut...)
}

func (o *ovsDB) deleteBridge(ctx context.Context, name string) error {
	br := o.bridge(name)
	if br == nil {
		return nil
	}
	root, err := o.root(ctx)
	if err != nil {
		return err
	}
	mut, err := o.c.Where(root).Mutate(root, model.Mutation{Field: &root.Bridges, Mutator: ovsdb.MutateOperationDelete, Value: []string{br.UUID}})
	if err != nil {
		return fmt.Errorf("ovsdb delete bridge %s: %w", name, err)
	}
	return o.transact(ctx, "delete bridge "+name, mut...)
}

// ofport waits until vswitchd has assigned the interface an OpenFlow port number.
func (o *ovsDB) ofport(ctx context.Context, name string) (uint32, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		i := o.iface(name)
		if i != nil && i.Ofport != nil && *i.Ofport > 0 {
			return uint32(*i.Ofport), nil
		}
		if i != nil && i.Ofport != nil && *i.Ofport == -1 {
			msg := ""
			if i.Error != nil {
				msg = *i.Error
			}
			return 0, fmt.Errorf("ovs interface %s failed: %s", name, msg)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("ovs interface %s: no ofport after 5s (is ovs-vswitchd running?)", name)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// bridgePorts lists the port names and ofports of a bridge.
func (o *ovsDB) bridgePorts(name string) map[string]int {
	br := o.bridge(name)
	if br == nil {
		return nil
	}
	out := map[string]int{}
	for _, pu := range br.Ports {
		p := &ovsmodel.Port{UUID: pu}
		if o.c.Get(context.Background(), p) != nil {
			continue
		}
		n := -1
		if i := o.iface(p.Name); i != nil && i.Ofport != nil {
			n = *i.Ofport
		}
		out[p.Name] = n
	}
	return out
}

// freeOfport picks the lowest ofport_request >= min not used by any interface (on any
// bridge of the instance). It fails when the interfaces cannot be listed: guessing
// would hand out an ofport that is already taken.
func (o *ovsDB) freeOfport(ctx context.Context, min int) (int, error) {
	used := map[int]bool{}
	var ifaces []ovsmodel.Interface
	if err := o.c.List(ctx, &ifaces); err != nil {
		return 0, fmt.Errorf("ovsdb list Interface (to pick a free ofport): %w", err)
	}
	for _, i := range ifaces {
		if i.OfportRequest != nil {
			used[*i.OfportRequest] = true
		}
		if i.Ofport != nil {
			used[*i.Ofport] = true
		}
	}
	for n := min; ; n++ {
		if !used[n] {
			return n, nil
		}
	}
}
