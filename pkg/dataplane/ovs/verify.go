package ovs

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	of "github.com/contiv/libOpenflow/openflow13"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// Verify compares the flows the switch holds (this driver's cookie) with the pipeline
// compiled from s (what the agent applied from netmaster's records): every flow s implies
// must be there with the same actions, and no flow of this driver may be there that s
// does not imply. Both sides are compared as OVS prints them: the switch's flows by
// `ovs-ofctl dump-flows`, the expected ones by `ovs-ofctl ofp-parse` of the flow mods this
// driver would send, so OVS's own normalisation (e.g. a register load printed as
// set_field) applies to both. Each difference names the object whose flow it is. The
// driver lock is held while the switch is read, so no change interleaves.
func (d *Driver) Verify(s dataplane.State) ([]dataplane.Drift, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, _ := desiredFrom(s) // what it refuses the agent lists as not applied
	var out []dataplane.Drift
	d.mu.Lock()
	ids := idTables{svc: maps.Clone(d.svcIDs), vrf: maps.Clone(d.vrfIDs)}
	p := ports{endpoints: maps.Clone(d.ports.endpoints), tunnel: d.ports.tunnel, uplink: d.ports.uplink}
	want, failed, err := d.pl.compileEach(st, d.host, p, ids)
	monitoring, allowEvents, metered := d.monitoring, d.allowEvents, d.meter // an open monitor adds controller actions
	var live map[string]string
	var foreign map[string]foreignFlow
	if err == nil {
		live, foreign, err = d.liveFlows(ctx)
	}
	d.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("ovs: verify: %w", err)
	}
	for u, uerr := range failed {
		out = append(out, dataplane.Drift{Table: "flows", Object: unitObject(u), Kind: "missing", Detail: "cannot be compiled: " + uerr.Error()})
	}
	expected, err := canonicalFlows(ctx, want.list(), func(f *flow) *of.FlowMod {
		fm := f.flowMod(of.FC_ADD, cookieOwner)
		if monitored(f, monitoring, allowEvents) {
			addController(fm, metered)
		}
		return fm
	})
	if err != nil {
		return nil, fmt.Errorf("ovs: verify: %w", err)
	}
	for k, e := range expected {
		table, match, _ := strings.Cut(k, " ")
		object := unitObject(want.owners[e.key][0])
		got, ok := live[k]
		switch {
		case !ok:
			out = append(out, dataplane.Drift{Table: "flows:" + table, Object: object, Kind: "missing", Detail: match + " actions=" + e.actions})
		case got != e.actions:
			out = append(out, dataplane.Drift{Table: "flows:" + table, Object: object, Kind: "different",
				Detail: fmt.Sprintf("%s actions=%s (want %s)", match, got, e.actions)})
		}
	}
	for k, actions := range live {
		if _, ok := expected[k]; !ok {
			table, match, _ := strings.Cut(k, " ")
			out = append(out, dataplane.Drift{Table: "flows:" + table, Object: match, Kind: "extra", Detail: "actions=" + actions})
		}
	}
	for k, f := range foreign {
		table, match, _ := strings.Cut(k, " ")
		out = append(out, dataplane.Drift{Table: "flows:" + table, Object: match, Kind: "extra",
			Detail: fmt.Sprintf("cookie %s, not this driver's: actions=%s", f.cookie, f.actions)})
	}
	slices.SortFunc(out, func(a, b dataplane.Drift) int {
		return strings.Compare(a.Table+"\x00"+a.Object+"\x00"+a.Detail, b.Table+"\x00"+b.Object+"\x00"+b.Detail)
	})
	return out, nil
}

// compileEach compiles every unit of d on its own, as compile does, but a unit that
// fails is left out and returned instead of failing the whole pipeline.
func (pl *pipeline) compileEach(d *dataplane.Index, host dataplane.HostConfig, p ports, ids idTables) (*compiled, map[string]error, error) {
	env, c, err := startCompile(d, host, p, ids)
	if err != nil {
		return nil, nil, err
	}
	failed := map[string]error{}
	log, changes := newUndoLog(), map[string]*flowChange{}
	for _, u := range unitNames(d) {
		flows, keys, err := pl.compileUnit(env, u)
		if err == nil {
			_, err = c.claimService(u, d, env, keys)
		}
		if err != nil {
			failed[u] = err
			continue
		}
		c.setUnit(u, flows, log, changes)
	}
	return c, failed, nil
}

// unitObject names a unit's object for people: "service web:blue", "endpoint <id>".
func unitObject(u string) string {
	kind, id := splitUnit(u)
	switch kind {
	case unitBase:
		return "pipeline defaults"
	case unitNetpol:
		return "network policies (Kubernetes)"
	case "net":
		return "network " + id
	case "ep":
		return "endpoint " + id
	case "rem":
		return "remote endpoint " + id
	case "pol":
		n, _ := strconv.Atoi(id)
		return fmt.Sprintf("policy of group %d", n)
	case "svc":
		return "service " + id
	}
	return u
}

// canonical is one expected flow as OVS prints it, with the key of the flow it came from.
type canonical struct {
	key     string // flow.key()
	actions string
}

// Lines of `ovs-ofctl ofp-parse` (a flow mod) and `ovs-ofctl --no-stats dump-flows`.
var (
	parsedFlowMod = regexp.MustCompile(`^OFPT_FLOW_MOD \(OF1\.3\) \(xid=0x([0-9a-f]+)\): ADD (?:table:(\d+) )?(.*?) cookie:0x[0-9a-f]+ actions=(.*)$`)
	dumpedFlow    = regexp.MustCompile(`^\s*(?:cookie=(0x[0-9a-f]+), )?(?:table=(\d+), )?(.*?) actions=(.*)$`)
)

// canonicalFlows returns flows as OVS prints them (each as the flow mod mod makes of
// it), by "<table> <priority and match>".
func canonicalFlows(ctx context.Context, flows []*flow, mod func(*flow) *of.FlowMod) (map[string]canonical, error) {
	f, err := os.CreateTemp("", "contivbpf-verify-*.of")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	w := bufio.NewWriter(f)
	for i, fl := range flows {
		b, err := mod(fl).MarshalBinary()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("encode %s: %w", fl, err)
		}
		binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
		binary.BigEndian.PutUint32(b[4:], uint32(i+1))
		if _, err := w.Write(b); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	text, err := exec.CommandContext(ctx, "ovs-ofctl", "ofp-parse", f.Name()).Output()
	if err != nil {
		return nil, fmt.Errorf("ovs-ofctl ofp-parse: %w", err)
	}
	out := map[string]canonical{}
	for _, line := range strings.Split(string(text), "\n") {
		m := parsedFlowMod.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		xid, _ := strconv.ParseUint(m[1], 16, 32)
		if xid == 0 || int(xid) > len(flows) {
			return nil, fmt.Errorf("ovs-ofctl ofp-parse: unexpected xid in %q", line)
		}
		out[tableKey(m[2], m[3])] = canonical{key: flows[xid-1].key(), actions: m[4]}
	}
	if len(out) != len(flows) {
		return nil, fmt.Errorf("ovs-ofctl ofp-parse printed %d of %d flows", len(out), len(flows))
	}
	return out, nil
}

func tableKey(table, match string) string {
	if table == "" {
		table = "0"
	}
	n, _ := strconv.Atoi(table)
	return tableID(n).String() + " " + match
}

// foreignFlow is a flow of the integration bridge that is not this driver's.
type foreignFlow struct{ cookie, actions string }

// liveFlows returns the integration bridge's flows as OVS prints them, by "<table>
// <priority and match>": this driver's (cookie owner 0xcb0b), and every other flow but
// the driver's own short-lived guard flows (cookie 0xcb0c…, see ctflush.go) as foreign: a
// flow someone added with another cookie (e.g. an allow at a higher priority than any
// rule) is as much drift as a changed one.
func (d *Driver) liveFlows(ctx context.Context) (map[string]string, map[string]foreignFlow, error) {
	text, err := exec.CommandContext(ctx, "ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows", "unix:"+d.mgmtSocket()).Output()
	if err != nil {
		return nil, nil, fmt.Errorf("ovs-ofctl dump-flows: %w", err)
	}
	out, foreign := map[string]string{}, map[string]foreignFlow{}
	for _, line := range strings.Split(string(text), "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "OFPST_") {
			continue
		}
		m := dumpedFlow.FindStringSubmatch(line)
		if m == nil {
			return nil, nil, fmt.Errorf("ovs-ofctl dump-flows: unexpected line %q", line)
		}
		cookie, _ := strconv.ParseUint(strings.TrimPrefix(m[1], "0x"), 16, 64) // absent: 0
		k := tableKey(m[2], m[3])
		switch {
		case cookie&cookieOwnerMask == cookieOwner:
			out[k] = m[4]
		case cookie&cookieOwnerMask == cookieGuard:
		default:
			foreign[k] = foreignFlow{cookie: fmt.Sprintf("%#x", cookie), actions: m[4]}
		}
	}
	return out, foreign, nil
}
