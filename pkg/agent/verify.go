package agent

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/contivbpf/contivbpf/pkg/dataplane"
)

// VerifyReport is GET /inspect/verify: what differs between netmaster's records as this
// agent applied them and the live datapath, plus the objects the agent could not apply.
type VerifyReport struct {
	Host   string            `json:"host"`
	Synced bool              `json:"synced"`
	Time   time.Time         `json:"time"`
	Drift  []dataplane.Drift `json:"drift"`
}

// DefaultVerifyEvery is how often the agent checks for drift on its own (the
// contiv_netplugin_datapath_drift metric).
const DefaultVerifyEvery = 5 * time.Minute

// Verify compares the applied state with the datapath. The apply lock is held while the
// driver reads its tables, so no change interleaves (attaches wait for it).
func (a *Agent) Verify(ctx context.Context) (VerifyReport, error) {
	r := VerifyReport{Host: a.cfg.Host, Time: time.Now(), Drift: []dataplane.Drift{}}
	snap := a.Inspect()
	r.Synced = snap.Synced
	for key, msg := range snap.Errors {
		r.Drift = append(r.Drift, dataplane.Drift{Table: "agent", Object: key, Kind: "not applied", Detail: msg})
	}
	sort.Slice(r.Drift, func(i, j int) bool { return r.Drift[i].Object < r.Drift[j].Object })
	if dc, ok := a.cfg.Driver.(dataplane.Verifier); ok {
		a.applyMu.Lock()
		st := a.applied.State() // pod policies included (the OVS check compares their flows)
		drift, err := dc.Verify(st)
		a.applyMu.Unlock()
		if err != nil {
			return r, err
		}
		r.Drift = append(r.Drift, drift...)
	} else {
		r.Drift = append(r.Drift, dataplane.Drift{Table: a.cfg.Driver.Name(), Kind: "not checked",
			Detail: "this dataplane cannot compare its tables; agent errors are listed"})
	}
	a.mu.Lock()
	a.lastDrift, a.lastVerify = len(r.Drift), r.Time
	a.mu.Unlock()
	return r, ctx.Err()
}

func (a *Agent) serveVerify(w http.ResponseWriter, req *http.Request) {
	r, err := a.Verify(req.Context())
	if err != nil {
		http.Error(w, "verify: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, r)
}

// verifyLoop checks for drift every interval until ctx ends.
func (a *Agent) verifyLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if r, err := a.Verify(ctx); err != nil {
				a.log.Warn("drift check failed", "err", err)
			} else if n := len(r.Drift); n > 0 {
				a.log.Warn("datapath drift", "entries", n, "first", r.Drift[0])
			}
		}
	}
}
