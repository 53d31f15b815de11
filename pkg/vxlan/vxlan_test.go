package vxlan

import (
	"net/netip"
	"testing"
)

func TestPeers(t *testing.T) {
	tab := Table{}
	for k, v := range map[string]string{
		"/contiv.io/service/netplugin.vtep/10.0.0.1:4789": `{"ServiceName":"netplugin.vtep","HostAddr":"10.0.0.1","Port":4789,"Hostname":"h1"}`,
		"/contiv.io/service/netplugin.vtep/10.0.0.2:4789": `{"ServiceName":"netplugin.vtep","HostAddr":"10.0.0.2","Port":4789,"Hostname":"h2"}`,
		"/contiv.io/service/netplugin.vtep/10.0.0.3:4789": `{"ServiceName":"netplugin.vtep","HostAddr":"10.0.0.3","Port":4789}`,
		"/contiv.io/service/netplugin.vtep/bad:4789":      `{"ServiceName":"netplugin.vtep","HostAddr":"bad","Hostname":"h4"}`,
	} {
		r, err := Decode([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		tab[k] = r
	}
	got := tab.Peers("h1", netip.MustParseAddr("10.0.0.1"))
	if len(got) != 2 || got[0].Host != "10.0.0.3" || got[1].Host != "h2" || got[1].VTEP != netip.MustParseAddr("10.0.0.2") {
		t.Fatalf("peers = %+v", got)
	}
	if a, ok := tab.VTEPOf("h2"); !ok || a.String() != "10.0.0.2" {
		t.Fatalf("VTEPOf(h2) = %v %v", a, ok)
	}
	if _, ok := tab.VTEPOf("h4"); ok {
		t.Fatal("VTEPOf(h4) with a bad address must fail")
	}
	if _, err := Decode([]byte("{")); err == nil {
		t.Fatal("Decode accepted bad JSON")
	}
}
