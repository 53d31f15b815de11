package model

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBitsetContivExamples(t *testing.T) {
	b := NewBitset(256)
	b.Set(0)
	b.Set(1)
	b.Set(255)
	if got, want := b.String(), "AAAAAAAAAQAAAAAAAAAAAwAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAA=="; got != want {
		t.Fatalf("encoding = %s, want %s", got, want)
	}
	n, ok := b.NextClear(0)
	if !ok || n != 2 {
		t.Fatalf("NextClear = %d %v, want 2", n, ok)
	}
	b.Set(n)
	if got, want := b.String(), "AAAAAAAAAQAAAAAAAAAABwAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAA=="; got != want {
		t.Fatalf("after alloc = %s, want %s", got, want)
	}
	var empty Bitset
	if got := empty.String(); got != "AAAAAAAAAAA=" {
		t.Fatalf("empty = %s", got)
	}
	// Round trip through JSON.
	js, err := json.Marshal(struct{ M Bitset }{b})
	if err != nil {
		t.Fatal(err)
	}
	var back struct{ M Bitset }
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.M.String() != b.String() || back.M.Count() != 4 || !back.M.Test(255) || back.M.Test(3) {
		t.Fatalf("round trip mismatch: %s", back.M.String())
	}
	if _, err := ParseBitset("AAAAAAAAAQAA"); err == nil {
		t.Fatal("truncated bitset accepted")
	}
}

func TestBitsetNext(t *testing.T) {
	b := NewBitset(130)
	b.SetRange(0, 129)
	if _, ok := b.NextClear(0); ok {
		t.Fatal("full set has a clear bit")
	}
	b.Clear(128)
	if n, ok := b.NextClear(5); !ok || n != 128 {
		t.Fatalf("NextClear = %d %v", n, ok)
	}
	c := NewBitset(130)
	if _, ok := c.NextSet(0); ok {
		t.Fatal("empty set has a set bit")
	}
	c.Set(70)
	if n, ok := c.NextSet(3); !ok || n != 70 {
		t.Fatalf("NextSet = %d %v", n, ok)
	}
	if c.Set(130) {
		t.Fatal("out of range Set succeeded")
	}
}

func TestKeysAndMAC(t *testing.T) {
	if NetworkID("contiv-net", "default") != "contiv-net.default" ||
		EndpointStateID("n", "t", "abc") != "n.t-abc" ||
		EPGStateID("web", "blue") != "web:blue" ||
		RuleKey("t", "p", "1") != "t:p:1" ||
		ModelKey(TypeBgp, "h1") != "/contiv.io/obj/modeldb/Bgp/h1" {
		t.Fatal("key helper mismatch")
	}
	m, err := MACFromIPv4("10.1.1.2")
	if err != nil || m != "02:02:0a:01:01:02" {
		t.Fatalf("mac = %s %v", m, err)
	}
	if _, err := MACFromIPv4("2001::1"); err == nil {
		t.Fatal("IPv6 accepted for MAC")
	}
}

func TestNetworkStateJSONShape(t *testing.T) {
	b := NewBitset(256)
	b.SetRange(0, 2)
	b.Set(255)
	s := CfgNetworkState{ID: "contiv-net.default", Tenant: "default", NetworkName: "contiv-net", NwType: "data",
		PktTagType: "vxlan", PktTag: 1, ExtPktTag: 1, SubnetIP: "10.1.1.0", SubnetLen: 24, Gateway: "10.1.1.1",
		IPAddrRange: "10.1.1.0-10.1.1.255", EpAddrCount: 1, EpCount: 1, IPAllocMap: b, NetworkTag: "contiv-net.default"}
	got, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"contiv-net.default","tenant":"default","networkName":"contiv-net","nwType":"data","pktTagType":"vxlan",
 "pktTag":1,"extPktTag":1,"subnetIP":"10.1.1.0","subnetLen":24,"gateway":"10.1.1.1",
 "ipAddrRange":"10.1.1.0-10.1.1.255","epAddrCount":1,"epCount":1,
 "ipAllocMap":"AAAAAAAAAQAAAAAAAAAABwAAAAAAAAAAAAAAAAAAAACAAAAAAAAAAA==",
 "ipv6SubnetIP":"","ipv6SubnetLen":0,"ipv6Gateway":"","ipv6AllocMap":null,"ipv6LastHost":"",
 "networkTag":"contiv-net.default"}`
	want = strings.NewReplacer("\n", "", " ", "").Replace(want)
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
