package ebpf

import "time"

// Step names reported to a StepObserver by UpsertEndpoint, in the order they run.
const (
	StepVeth      = "veth"      // look-ups plus creating the pair, host end down (container end in its netns)
	StepContainer = "container" // container end: MAC, MTU, address, up, default route
	StepHostLink  = "host-link" // host end: MTU
	StepMaps      = "maps"      // counter slot, route, cb_ifaces, cb_endpoints
	StepTCX       = "tcx"       // tcx attach and pin, then the host end up
)

// StepObserver receives the duration of each step of one UpsertEndpoint call
// (Options.StepObserver).
type StepObserver func(step string, d time.Duration)

// stepClock times consecutive steps; the zero observer makes it a no-op.
type stepClock struct {
	obs  StepObserver
	last time.Time
}

func (d *Driver) stepClock() stepClock {
	if d.cfg.StepObserver == nil {
		return stepClock{}
	}
	return stepClock{obs: d.cfg.StepObserver, last: time.Now()}
}

// mark reports the time since the previous mark (or the start) as step.
func (c *stepClock) mark(step string) {
	if c.obs == nil {
		return
	}
	now := time.Now()
	c.obs(step, now.Sub(c.last))
	c.last = now
}
