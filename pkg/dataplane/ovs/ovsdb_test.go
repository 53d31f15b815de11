package ovs

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/ovn-org/libovsdb/client"
	"github.com/ovn-org/libovsdb/model"

	"github.com/contivbpf/contivbpf/pkg/dataplane/ovs/ovsmodel"
)

// TestFreeOfport: a free ofport skips requested ones, and a failed Interface listing is
// an error, not a guess (a guess can hand out an ofport already in use).
func TestFreeOfport(t *testing.T) {
	needRoot(t)
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
