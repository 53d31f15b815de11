package dockerplugin

import "testing"

func TestDockerNetworkNames(t *testing.T) {
	cases := []struct {
		ref  NetRef
		name string
	}{
		{NetRef{"default", "contiv-net", ""}, "contiv-net"},
		{NetRef{"default", "contiv-net", "web"}, "web"},
		{NetRef{"blue", "contiv-net", ""}, "contiv-net/blue"},
		{NetRef{"blue", "contiv-net", "web"}, "web/blue"},
	}
	for _, c := range cases {
		if got := c.ref.DockerNetworkName(); got != c.name {
			t.Errorf("%+v name = %q, want %q", c.ref, got, c.name)
		}
	}
	for in, want := range map[string]NetRef{
		"contiv-net":          {"default", "contiv-net", ""},
		"contiv-net/blue":     {"blue", "contiv-net", ""},
		"web.contiv-net/blue": {"blue", "contiv-net", "web"},
	} {
		got, err := ParseDockerNetworkName(in)
		if err != nil || got != want {
			t.Errorf("parse %q = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "/blue", "net/"} {
		if _, err := ParseDockerNetworkName(bad); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}

func TestPoolIDRoundTrip(t *testing.T) {
	for _, s := range []string{"contiv-net.default|10.1.1.0/24", "net1:web.blue|10.2.0.0/16", "10.9.0.0/24"} {
		p, err := parsePoolID(s)
		if err != nil {
			t.Fatalf("parse %q: %v", s, err)
		}
		if p.String() != s {
			t.Errorf("round trip %q -> %q", s, p.String())
		}
	}
	p, _ := parsePoolID("net1:web.blue|10.2.0.0/16")
	if p.Ref != (NetRef{"blue", "net1", "web"}) {
		t.Errorf("ref = %+v", p.Ref)
	}
	for _, bad := range []string{"", "x|", "net|10.0.0.0/8", ".t|10.0.0.0/8", "n.t|fd00::/64", "n.t|10.0.0.1", ":g.t|10.0.0.0/8"} {
		if _, err := parsePoolID(bad); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}
