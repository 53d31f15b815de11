package ebpf

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// ctClock is the calibration of the conntrack clock (conntrack.h cb_now): the datapath
// reads jiffies × tickNs + base, which the calibration makes equal to
// CLOCK_MONOTONIC_COARSE (what monotonicNow and the collector read) within a tick. The
// jiffies read is a load; the coarse clock's helper is a call, which costs as much as a
// hash lookup per packet on machines with speculative-return mitigations.
type ctClock struct {
	tickNs uint32 // the kernel's tick in ns (TICK_NSEC); 0: not calibrated
	base   uint64 // coarse monotonic − jiffies × tickNs (modulo 2^64)
}

// clockHZs are the tick rates a kernel can be built with (CONFIG_HZ on x86 and arm64).
var clockHZs = [...]int{100, 250, 300, 1000}

// clockMeasure is how long calibrateClock counts ticks when the kernel's configuration
// does not say its HZ: long enough that one tick more or less cannot turn 250 into 300.
const clockMeasure = 250 * time.Millisecond

// calibrateClock finds the tick (CONFIG_HZ from /proc/config.gz, else counted over
// clockMeasure with the probe) and the base, from runs of probe (cb_clock_probe).
func calibrateClock(ctx context.Context, probe *ebpf.Program) (ctClock, error) {
	hz, err := configHZ("/proc/config.gz")
	if err != nil || hz == 0 {
		if hz, err = measureHZ(ctx, probe); err != nil {
			return ctClock{}, err
		}
	}
	tick := (uint64(time.Second) + uint64(hz)/2) / uint64(hz) // the kernel's TICK_NSEC
	j, c, err := probeClock(probe)
	if err != nil {
		return ctClock{}, err
	}
	clk := ctClock{tickNs: uint32(tick), base: c - j*tick}
	// The two clocks must agree now (a tick apart at most, read one after the other).
	j2, c2, err := probeClock(probe)
	if err != nil {
		return ctClock{}, err
	}
	if d := int64(clk.now(j2) - c2); d > int64(2*tick) || d < -int64(2*tick) {
		return ctClock{}, fmt.Errorf("calibrate the conntrack clock: jiffies at %d Hz are %v off the coarse clock", hz, time.Duration(d))
	}
	return clk, nil
}

// now is the calibrated clock at jiffies j.
func (c ctClock) now(j uint64) uint64 { return j*uint64(c.tickNs) + c.base }

// set writes the calibration to the programs' globals: the base first, so a packet never
// reads a tick with a base that does not go with it.
func (c ctClock) set(base, tick *ebpf.Variable) error {
	if base == nil || tick == nil || c.tickNs == 0 {
		return nil
	}
	if err := base.Set(c.base); err != nil {
		return fmt.Errorf("set cb_clock_base: %w", err)
	}
	if err := tick.Set(c.tickNs); err != nil {
		return fmt.Errorf("set cb_tick_ns: %w", err)
	}
	return nil
}

// probeClock runs cb_clock_probe once: jiffies and the coarse monotonic clock, read
// together.
func probeClock(probe *ebpf.Program) (jiffies, coarse uint64, err error) {
	if probe == nil {
		return 0, 0, errors.New("read the kernel's clocks: no cb_clock_probe program")
	}
	in := make([]byte, 64)
	out := make([]byte, len(in))
	ret, err := probe.Run(&ebpf.RunOptions{Data: in, DataOut: out})
	if err != nil {
		return 0, 0, fmt.Errorf("read the kernel's clocks: run cb_clock_probe: %w", err)
	}
	if ret != 0 {
		return 0, 0, fmt.Errorf("read the kernel's clocks: cb_clock_probe returned %d", ret)
	}
	return binary.LittleEndian.Uint64(out[0:]), binary.LittleEndian.Uint64(out[8:]), nil
}

// measureHZ counts jiffies over clockMeasure of the coarse clock and returns the
// configurable tick rate nearest to the count.
func measureHZ(ctx context.Context, probe *ebpf.Program) (int, error) {
	j1, c1, err := probeClock(probe)
	if err != nil {
		return 0, err
	}
	select {
	case <-ctx.Done():
		return 0, fmt.Errorf("measure the kernel's tick rate: %w", ctx.Err())
	case <-time.After(clockMeasure):
	}
	j2, c2, err := probeClock(probe)
	if err != nil {
		return 0, err
	}
	if c2 <= c1 {
		return 0, fmt.Errorf("measure the kernel's tick rate: the coarse clock did not advance")
	}
	return nearestHZ(float64(j2-j1) * float64(time.Second) / float64(c2-c1))
}

// nearestHZ is the configurable tick rate within 5% of measured.
func nearestHZ(measured float64) (int, error) {
	for _, hz := range clockHZs {
		if math.Abs(measured-float64(hz)) <= 0.05*float64(hz) {
			return hz, nil
		}
	}
	return 0, fmt.Errorf("measure the kernel's tick rate: %.1f Hz is no CONFIG_HZ value", measured)
}

// configHZ reads CONFIG_HZ from the kernel configuration at path (gzip; 0: not there).
func configHZ(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	sc := bufio.NewScanner(z)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CONFIG_HZ="); ok {
			hz, err := strconv.Atoi(v)
			if err != nil || hz <= 0 {
				return 0, fmt.Errorf("read %s: CONFIG_HZ=%q", path, v)
			}
			return hz, nil
		}
	}
	return 0, sc.Err()
}
