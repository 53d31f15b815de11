package ebpf

import "time"

// Step names reported to a StepObserver by UpsertEndpoint, in the order they run.
const (
	StepVeth      = "veth"      // look-ups plus creating the pair (container end in its netns)
	StepContainer = "container" // container end: MAC, MTU, address, up, default route
	StepHostLink  = "host-link" // host end: MTU, up
	StepMaps      = "maps"      // counter slot, route, cb_ifaces, cb_endpoints
	StepTCX       = "tcx"       // tcx attach and pin
)

// StepObserver receives the duration of each step of one UpsertEndpoint call.
type StepObserver func(step string, d time.Duration)

// WithStepObserver reports per-step durations of UpsertEndpoint to f (called with the
// driver's lock held: f must be quick and must not call back into the driver).
func WithStepObserver(f StepObserver) Option { return func(d *Driver) { d.steps = f } }

// stepClock times consecutive steps; the zero observer makes it a no-op.
type stepClock struct {
	obs  StepObserver
	last time.Time
}

func (d *Driver) stepClock() stepClock {
	if d.steps == nil {
		return stepClock{}
	}
	return stepClock{obs: d.steps, last: time.Now()}
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
