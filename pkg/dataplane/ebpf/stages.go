package ebpf

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The stages entry programs reach by tail call through the program array cb_calls
// (bpf/contivbpf.c "Stages reached by tail call"). The kernel empties a program array when
// its last pin and file go, and a running entry program whose array is empty drops what
// it hands on (drop_no_stage). So every load's array is pinned under callsDir, by the time
// of its load, before any link takes its programs, and an earlier load's pins go only once
// every link runs this load's programs: a restart, an upgrade or a crash between the two
// never leaves an attached entry program without its stages.

// callsDir is the directory of the program arrays' pins under the pin root.
const callsDir = "calls"

// stagePrograms are the programs reached by tail call: a loader that keeps an entry
// program must keep them too (the array's contents name them).
func stagePrograms() []string {
	return []string{contivbpfProgCbStageContainer, contivbpfProgCbStageIpv4Judge, contivbpfProgCbStageOutside,
		contivbpfProgCbStageRemoteJudge, contivbpfProgCbStagePeerHost, contivbpfProgCbStageNodeportBack,
		contivbpfProgCbStageUplinkDeliver, contivbpfProgCbStageNodeportJudge, contivbpfProgCbStageEgress}
}

// pinCalls pins this load's program array under callsDir and returns the pin's name.
func (d *Driver) pinCalls() (string, error) {
	dir := filepath.Join(d.cfg.PinRoot, callsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("ebpf: create %s: %w", dir, err)
	}
	name := strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := d.objs.CbCalls.Pin(filepath.Join(dir, name)); err != nil {
		return "", fmt.Errorf("ebpf: pin %s: %w", contivbpfMapCbCalls, err)
	}
	return name, nil
}

// unpinOldCalls removes the pins of earlier loads' program arrays (keep is this load's):
// called once every link runs this load's programs.
func (d *Driver) unpinOldCalls(keep string) error {
	dir := filepath.Join(d.cfg.PinRoot, callsDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ebpf: read %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Name() == keep {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("ebpf: remove an earlier load's %s pin: %w", contivbpfMapCbCalls, err)
		}
	}
	return nil
}
