package ebpf

import (
	"context"
	"testing"
	"time"
)

func TestNearestHZ(t *testing.T) {
	for _, c := range []struct {
		measured float64
		want     int // 0: refused
	}{{100, 100}, {96, 100}, {244, 250}, {256, 250}, {291, 300}, {309, 300}, {990, 1000}, {275, 0}, {500, 0}, {0, 0}} {
		got, err := nearestHZ(c.measured)
		if got != c.want || (err != nil) != (c.want == 0) {
			t.Errorf("nearestHZ(%v) = %d, %v; want %d", c.measured, got, err, c.want)
		}
	}
}

// The calibrated clock the datapath reads agrees with the collector's
// (CLOCK_MONOTONIC_COARSE) within a tick, whether the tick rate came from the kernel's
// configuration or was counted, and entries the programs write expire by it.
func TestClockCalibration(t *testing.T) {
	objs := ctPolicyFixture(t) // calibrated, as the agent does
	var tick uint32
	var base uint64
	if err := objs.CbTickNs.Get(&tick); err != nil {
		t.Fatal(err)
	}
	if err := objs.CbClockBase.Get(&base); err != nil {
		t.Fatal(err)
	}
	if tick == 0 {
		t.Fatal("the test objects' clock is not calibrated")
	}
	clk := ctClock{tickNs: tick, base: base}
	for range 20 {
		j, _, err := probeClock(objs.CbClockProbe)
		if err != nil {
			t.Fatal(err)
		}
		now, err := monotonicNow()
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Duration(int64(clk.now(j)) - int64(now)); d > 2*time.Duration(tick) || d < -2*time.Duration(tick) {
			t.Fatalf("calibrated clock %v off CLOCK_MONOTONIC_COARSE (tick %v)", d, time.Duration(tick))
		}
		time.Sleep(3 * time.Millisecond)
	}
	measured, err := measureHZ(context.Background(), objs.CbClockProbe)
	if err != nil {
		t.Fatal(err)
	}
	if want := int((uint64(time.Second) + uint64(tick)/2) / uint64(tick)); measured != want {
		t.Fatalf("counted %d Hz, calibration says %d Hz (tick %d ns)", measured, want, tick)
	}
	// A packet's entry: its deadline is the calibrated now + the UDP timeout.
	run(t, objs, objs.CbFromContainer, l4Frame(17, srcIP, localIP, 40000, 53, 0, 0), nil).expect(t, tcActRedirect, FwdLocal)
	e, ok := ctEntry(t, objs, testZone, 17, srcIP, localIP, 40000, 53)
	if !ok {
		t.Fatal("no entry for the UDP flow")
	}
	if r := remaining(t, e); r > 60*time.Second+2*time.Duration(tick) || r < 60*time.Second-2*time.Duration(tick)-time.Second {
		t.Fatalf("entry expires in %v, want 60 s by the collector's clock", r)
	}
}
