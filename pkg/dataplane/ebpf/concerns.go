package ebpf

import "errors"

// concerns is a set of the driver's concern locks (the lock order on Driver).
type concerns uint8

const (
	cEps  concerns = 1 << iota // networks, endpoints, remotes, peers, host routes, nl
	cPols                      // group policy
	cNp                        // NetworkPolicy
	cSvc                       // services and node ports

	cAll = cEps | cPols | cNp | cSvc
)

// lock takes life (shared) and the concern locks of w for writing and of r for reading,
// in the lock order, and returns the function that releases them. A concern in both is
// taken for writing.
func (d *Driver) lock(w, r concerns) (unlock func()) {
	d.life.RLock()
	type rw interface {
		Lock()
		Unlock()
		RLock()
		RUnlock()
	}
	order := [...]struct {
		c  concerns
		mu rw
	}{{cEps, &d.eps.mu}, {cPols, &d.pols.mu}, {cNp, &d.np.mu}, {cSvc, &d.svc.mu}}
	var held []func()
	for _, o := range order {
		switch {
		case w&o.c != 0:
			o.mu.Lock()
			held = append(held, o.mu.Unlock)
		case r&o.c != 0:
			o.mu.RLock()
			held = append(held, o.mu.RUnlock)
		}
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i]()
		}
		d.life.RUnlock()
	}
}

// lockLife takes the driver alone (Close, Teardown): it waits for every operation.
func (d *Driver) lockLife() (unlock func()) {
	d.life.Lock()
	return d.life.Unlock
}

// check fails once the driver is closed (callers hold life).
func (d *Driver) check() error {
	if d.closed {
		return errors.New("ebpf: driver is closed")
	}
	return nil
}

// noteFeatures publishes, for writeConfig, the feature bits policies and failed groups
// ask for, and for FailedPolicies the failed groups; holders of pols' write lock call it
// after changing either (and count the change for the rule id cache).
func (p *policyIndex) noteFeatures() {
	p.rev++
	failed := make(map[uint16]string, len(p.failed))
	for g, err := range p.failed {
		failed[g] = err.Error()
	}
	p.failedNow.Store(&failed)
	var f uint32
	if len(p.policies) > 0 || len(p.failed) > 0 {
		f = uint32(contivbpfCbFeaturesCB_FEAT_POLICY)
	}
	p.feat.Store(f)
}

// noteFeatures is policyIndex.noteFeatures for the pod policies.
func (n *netpolIndex) noteFeatures() {
	var f uint32
	if len(n.podPols) > 0 {
		f = uint32(contivbpfCbFeaturesCB_FEAT_POLICY | contivbpfCbFeaturesCB_FEAT_NETPOL)
	}
	n.feat.Store(f)
}

// noteFeatures is policyIndex.noteFeatures for services and node ports.
func (s *serviceIndex) noteFeatures() {
	var f uint32
	if len(s.services) > 0 {
		f = uint32(contivbpfCbFeaturesCB_FEAT_LB)
	}
	if len(s.npOwner) > 0 { // some service has a node port
		f |= uint32(contivbpfCbFeaturesCB_FEAT_NODEPORT)
	}
	s.feat.Store(f)
}

// countFull counts a failed insert into a full map.
func (d *Driver) countFull(name string) {
	d.statMu.Lock()
	d.mapFull[name]++
	d.statMu.Unlock()
}

// mapFullCopy is a copy of the map-full counters.
func (d *Driver) mapFullCopy() map[string]uint64 {
	d.statMu.Lock()
	defer d.statMu.Unlock()
	out := make(map[string]uint64, len(d.mapFull))
	for k, v := range d.mapFull {
		out[k] = v
	}
	return out
}

// nextGeneration starts a Sync's generation (callers hold every concern's write lock) and
// writes it to the config.
func (d *Driver) nextGeneration() error {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	d.gen++
	if d.gen == 0 {
		d.gen = 1
	}
	return d.writeConfigLocked()
}

// dropCarried drops the feature bits carried from the pinned config (the indexes they
// stood for are complete) and writes the config.
func (d *Driver) dropCarried() error {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	d.carried = 0
	return d.writeConfigLocked()
}

// generation is the driver's generation, for callers holding no concern lock.
func (d *Driver) generation() uint32 {
	d.cfgMu.Lock()
	defer d.cfgMu.Unlock()
	return d.gen
}

// setLink records attachment a (callers are serialized by eps' write lock or run alone;
// linkMu is for Status, which reads the records holding no concern lock).
func (d *Driver) setLink(a *attachment) {
	d.linkMu.Lock()
	d.links[a.ifname] = a
	d.linkMu.Unlock()
}
