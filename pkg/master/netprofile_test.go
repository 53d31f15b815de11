package master

import (
	"encoding/json"
	"testing"

	"github.com/contivbpf/contivbpf/pkg/model"
)

// TestNetprofileReachesGroupState follows a group's netprofile into its state record (what
// the agents enforce): attached at create, changed with the profile, switched to another
// profile, and cleared when the group drops it.
func TestNetprofileReachesGroupState(t *testing.T) {
	e := newEnv(t, "bridge")
	e.ok("POST", "/api/v1/tenants/t1/", `{"tenantName":"t1","link-sets":{}}`, nil)
	e.net("t1", "n1", "vxlan", "10.1.1.0/24", "10.1.1.1", 0)
	e.ok("POST", "/api/v1/netprofiles/t1:gold/", `{"bandwidth":"10mbps","DSCP":46,"burst":800,"profileName":"gold","tenantName":"t1"}`, nil)
	e.ok("POST", "/api/v1/netprofiles/t1:bronze/", `{"bandwidth":"1mbps","profileName":"bronze","tenantName":"t1"}`, nil)
	state := func(want model.EndpointGroupState, stage string) {
		t.Helper()
		var st model.EndpointGroupState
		if err := json.Unmarshal([]byte(e.rawGet(model.EPGStateKey(model.EPGStateID("g", "t1")))), &st); err != nil {
			t.Fatal(err)
		}
		if st.Bandwidth != want.Bandwidth || st.DSCP != want.DSCP || st.Burst != want.Burst {
			t.Errorf("%s: state has bandwidth %q DSCP %d burst %d, want %q %d %d", stage, st.Bandwidth, st.DSCP, st.Burst,
				want.Bandwidth, want.DSCP, want.Burst)
		}
	}
	group := func(np string) {
		e.ok("POST", "/api/v1/endpointGroups/t1:g/", `{"groupName":"g","networkName":"n1","netProfile":"`+np+`","tenantName":"t1"}`, nil)
	}
	group("gold")
	state(model.EndpointGroupState{Bandwidth: "10mbps", DSCP: 46, Burst: 800}, "created with gold")
	e.ok("POST", "/api/v1/netprofiles/t1:gold/", `{"bandwidth":"20mbps","DSCP":10,"profileName":"gold","tenantName":"t1"}`, nil)
	state(model.EndpointGroupState{Bandwidth: "20mbps", DSCP: 10}, "gold changed")
	group("bronze")
	state(model.EndpointGroupState{Bandwidth: "1mbps"}, "switched to bronze")
	e.ok("POST", "/api/v1/netprofiles/t1:gold/", `{"bandwidth":"30mbps","profileName":"gold","tenantName":"t1"}`, nil)
	state(model.EndpointGroupState{Bandwidth: "1mbps"}, "gold changed while the group uses bronze")
	group("")
	state(model.EndpointGroupState{}, "detached")
}
