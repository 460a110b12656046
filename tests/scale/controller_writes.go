package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
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

func controllerWritesOf(counts map[string]int) controllerWrites {
	var w controllerWrites
	for k, n := range counts {
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
	w := controllerWritesOf(s.RequestsByClient["topodra-controller"])
	pods := float64(s.PodsBound)
	line := fmt.Sprintf("topodra's controller over the common waves, by the API server's audit log: %d NodeResourceTopology writes for %d bound pods, %.3f a pod; %d Events (%.3f a pod), %d Lease writes, %d other writes.\n",
		w.NRT, s.PodsBound, float64(w.NRT)/pods, w.Events, float64(w.Events)/pods, w.Leases, w.Other)
	if s.ControllerUntilSettled != nil {
		u := controllerWritesOf(s.ControllerUntilSettled)
		if s.ControllerStillWaiting > 0 {
			line += fmt.Sprintf("Until the harness stopped waiting (%.0f s after the waves, %d nodes still waiting for a write, so the count is cut short): %d NodeResourceTopology writes, %.3f a pod.\n",
				s.ControllerSettleSeconds, s.ControllerStillWaiting, u.NRT, float64(u.NRT)/pods)
		} else {
			line += fmt.Sprintf("Until no node waited for a write (%.0f s after the waves): %d NodeResourceTopology writes, %.3f a pod.\n",
				s.ControllerSettleSeconds, u.NRT, float64(u.NRT)/pods)
		}
	}
	if n, mean, p50, p99 := writeLag(s.ControllerWaves); n > 0 {
		line += fmt.Sprintf("How long an object trailed its node's first unwritten change when written (the controller's histogram, %.0f writes): mean %.1f s, half within %g s, 99 %% within %g s.\n",
			n, mean, p50, p99)
	}
	return line
}

// writeLag reads the controller's topodra_controller_nrt_write_lag_seconds histogram
// (cumulative buckets by upper bound): how many writes, their mean lag, and the
// bucket bounds that hold half and 99 % of them.
func writeLag(m map[string]float64) (count, mean, p50, p99 float64) {
	const name = "topodra_controller_nrt_write_lag_seconds"
	count = m[name+"_count"]
	if count == 0 {
		return 0, 0, 0, 0
	}
	type bucket struct{ le, n float64 }
	var buckets []bucket
	for k, v := range m {
		le, ok := strings.CutPrefix(k, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			bound = math.Inf(1)
		}
		buckets = append(buckets, bucket{bound, v})
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	at := func(q float64) float64 {
		for _, b := range buckets {
			if b.n >= q*count {
				return b.le
			}
		}
		return math.Inf(1)
	}
	return count, m[name+"_sum"] / count, at(0.5), at(0.99)
}
