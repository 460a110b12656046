package main

import (
	"fmt"
	"strings"

	"topodra.dev/tests/cluster"
)

// controllerWrites is what topodra's controller wrote over the common waves by the
// API server's audit log, split by resource: NodeResourceTopology objects apart from
// Events on waiting pods (the controller's own counter sums both) and from Lease
// renewals (time, not pods).
type controllerWrites struct {
	NRT, Events, Leases, Other int
}

func controllerWritesOf(byClient map[string]map[string]int) controllerWrites {
	var w controllerWrites
	for k, n := range byClient["topodra-controller"] {
		verb, res, _ := strings.Cut(k, " ")
		if !cluster.WriteVerbs[verb] {
			continue
		}
		switch res {
		case "noderesourcetopologies":
			w.NRT += n
		case "events":
			w.Events += n
		case "leases":
			w.Leases += n
		default:
			w.Other += n
		}
	}
	return w
}

// controllerWritesLine is the report's sentence on them; empty when no pod was bound.
func controllerWritesLine(s *stackResult) string {
	if s.PodsBound == 0 {
		return ""
	}
	w := controllerWritesOf(s.RequestsByClient)
	pods := float64(s.PodsBound)
	return fmt.Sprintf("topodra's controller over the common waves, by the API server's audit log: %d NodeResourceTopology writes for %d bound pods, %.3f a pod; %d Events (%.3f a pod), %d Lease writes, %d other writes.\n",
		w.NRT, s.PodsBound, float64(w.NRT)/pods, w.Events, float64(w.Events)/pods, w.Leases, w.Other)
}
