package ovs

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/ovn-org/libovsdb/client"
	"github.com/ovn-org/libovsdb/model"
	"github.com/ovn-org/libovsdb/ovsdb"

	"github.com/contivbpf/contivbpf/pkg/dataplane/ovs/ovsmodel"
)

// TestFreeOfport: a free ofport skips requested ones, and a failed Interface listing is
// an error, not a guess (a guess can hand out an ofport already in use).
func TestFreeOfport(t *testing.T) {
	needOVS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns := newNS(t, testID(), "db")
	dir, err := os.MkdirTemp("", "cbo-ovs-")
	if err != nil {
		t.Fatal(err)
	}
	p := Private{Dir: dir, NetNS: nsPath(ns)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
		os.RemoveAll(dir)
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	db, err := connectOVSDB(ctx, p.DBSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.ensureBridge(ctx, "cbo-fbr", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.ensurePort(ctx, "cbo-fbr", portSpec{Name: "cbo-fp", Type: "internal", OfportRequest: 100}); err != nil {
		t.Fatal(err)
	}
	n, err := db.freeOfport(ctx, 100)
	if err != nil || n != 101 {
		t.Fatalf("freeOfport(100) = %d, %v; want 101 (100 is requested by cbo-fp)", n, err)
	}

	// A client whose model lacks the Interface table cannot list interfaces.
	dbModel, err := model.NewClientDBModel("Open_vSwitch", map[string]model.Model{"Open_vSwitch": &ovsmodel.OpenvSwitch{}})
	if err != nil {
		t.Fatal(err)
	}
	quiet := logr.Discard()
	c, err := client.NewOVSDBClient(dbModel, client.WithEndpoint(p.DBSocket()), client.WithLogger(&quiet))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := (&ovsDB{c: c}).freeOfport(ctx, 100); err == nil {
		t.Fatalf("freeOfport without an Interface listing = %d, nil; want an error", n)
	} else {
		t.Logf("freeOfport: %v", err)
	}
}

// TestSchemaCompatible: the models fit servers of the same schema major version only, and
// the refusal names both versions.
func TestSchemaCompatible(t *testing.T) {
	built := ovsmodel.Schema()
	if built.Name != "Open_vSwitch" || len(built.Tables) != 4 {
		t.Fatalf("built schema %s with %d tables, want Open_vSwitch with the 4 modelled ones", built.Name, len(built.Tables))
	}
	for _, c := range []struct {
		name, version string
		ok            bool
	}{
		{"Open_vSwitch", built.Version, true},
		{"Open_vSwitch", "8.5.0", true}, // Open vSwitch 3.3
		{"Open_vSwitch", "9.0.0", false},
		{"Open_vSwitch", "", false},
		{"OVN_Northbound", built.Version, false},
	} {
		err := schemaCompatible(ovsdb.DatabaseSchema{Name: c.name, Version: c.version}, built)
		if (err == nil) != c.ok {
			t.Errorf("%s %q: err %v, want ok=%v", c.name, c.version, err, c.ok)
		} else if err != nil && !strings.Contains(err.Error(), built.Version[:1]) {
			t.Errorf("%s %q: %v does not name the built version", c.name, c.version, err)
		}
	}
}
