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
	const name = "topodra_controller_nrt_pacing_info{"
	for k := range metrics {
		labels, ok := strings.CutPrefix(k, name)
		if !ok {
			continue
		}
		values := map[string]float64{}
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			key, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			if f, err := strconv.ParseFloat(strings.Trim(v, `"`), 64); err == nil {
				values[key] = f
			}
		}
		p := controllerPacing{values["write_delay_seconds"], values["node_interval_seconds"], values["writes_per_second"]}
		if p.WritesPerSecond <= 0 || len(values) != 3 {
			return nil
		}
		return &p
	}
	return nil
}
