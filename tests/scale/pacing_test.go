package main

import (
	"strings"
	"testing"
	"time"
)

// The series as the controller's metrics test pins it
// (controller/src/metrics.rs, the_write_pacing_is_an_info_series).
func TestPacingOfTheControllersInfoSeries(t *testing.T) {
	text := "# HELP topodra_controller_nrt_pacing NodeResourceTopology write pacing\n" +
		"# TYPE topodra_controller_nrt_pacing info\n" +
		`topodra_controller_nrt_pacing_info{write_delay_seconds="10",node_interval_seconds="60",writes_per_second="0.5"} 1` + "\n" +
		"topodra_controller_nrt_nodes_waiting 3\n"
	p := pacingOf(parseMetrics(strings.NewReader(text), "topodra_controller_"))
	if p == nil || *p != (controllerPacing{10, 60, 0.5}) {
		t.Fatalf("pacing %+v", p)
	}
	if got := settleLimit(2000, p); got != 6000*time.Second {
		t.Errorf("settle limit at 2000 nodes and half a write a second: %s", got)
	}
	// A run from before the series: the defaults of the time, one write a second.
	if got := settleLimit(2000, pacingOf(nil)); got != 50*time.Minute {
		t.Errorf("settle limit at 2000 nodes, no pacing recorded: %s", got)
	}
	if got := settleLimit(100, p); got != 20*time.Minute {
		t.Errorf("settle limit at 100 nodes: %s", got)
	}
}

// The committed runs of the paced controller are what docs/controller.md and
// docs/benchmarks.md quote: those said to have today's defaults ran with the
// pacing the flags default to now, as their controller reported it, and those
// said to have the earlier default did not.
func TestControllerWriteRunsRanWithTheDefaults(t *testing.T) {
	want := controllerDefaults(t)
	for _, cw := range controllerWriteRuns {
		got := decode[results](t, committed, cw.file).DRA.ControllerPacing
		switch {
		case cw.atDefaults && (got == nil || *got != want):
			t.Errorf("%s ran with pacing %+v, the defaults are %+v: re-run it (docs/benchmarks.md, \"The controller's writes\")", cw.file, got, want)
		case !cw.atDefaults && got.orBefore() != pacingBeforeRecorded:
			t.Errorf("%s ran with pacing %+v, not the earlier default %+v it is listed with", cw.file, got, pacingBeforeRecorded)
		}
	}
}
