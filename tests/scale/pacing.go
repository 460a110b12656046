package main

import (
	"strconv"
	"strings"
)

// controllerPacing is the NodeResourceTopology write pacing a controller ran
// with (its topodra_controller_nrt_pacing_info series): what docs/controller.md's
// staleness bound is made of.
type controllerPacing struct {
	WriteDelaySeconds   float64 `json:"writeDelaySeconds"`
	NodeIntervalSeconds float64 `json:"nodeIntervalSeconds"`
	WritesPerSecond     float64 `json:"writesPerSecond"`
}

// pacingBeforeRecorded is what the runs made before the pacing was recorded ran
// with: the defaults of that time (10 s, 60 s, one write a second).
var pacingBeforeRecorded = controllerPacing{WriteDelaySeconds: 10, NodeIntervalSeconds: 60, WritesPerSecond: 1}

// orBefore is the pacing, or for a run that did not record it the defaults it ran with.
func (p *controllerPacing) orBefore() controllerPacing {
	if p == nil {
		return pacingBeforeRecorded
	}
	return *p
}

func (p *controllerPacing) writesPerSecond() float64 {
	return p.orBefore().WritesPerSecond
}

// pacingOf reads the pacing from the controller's metrics (parseMetrics's keys,
// labels included); nil where the series is missing or incomplete.
func pacingOf(metrics map[string]float64) *controllerPacing {
	for k := range metrics {
		if !strings.HasPrefix(k, "topodra_controller_nrt_pacing_info{") {
			continue
		}
		var values [3]float64
		for i, name := range []string{"write_delay_seconds", "node_interval_seconds", "writes_per_second"} {
			v, err := strconv.ParseFloat(label(k, name), 64)
			if err != nil {
				return nil
			}
			values[i] = v
		}
		if values[2] <= 0 {
			return nil
		}
		return &controllerPacing{values[0], values[1], values[2]}
	}
	return nil
}
