package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

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
	if p := s.ControllerPacing; p != nil {
		line += fmt.Sprintf("Its write pacing (its nrt_pacing_info): a node's first change gathered for %g s, a node written at most every %g s, %g writes a second over the fleet.\n",
			p.WriteDelaySeconds, p.NodeIntervalSeconds, p.WritesPerSecond)
	}
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

// bound is the pods its waves bound.
func (k kindResult) bound() int {
	n := 0
	for _, w := range k.Waves {
		n += w.Bound
	}
	return n
}

// window closes a kind's window, opened at from, now.
func (k *kindResult) window(from time.Time) {
	k.from, k.to = from, time.Now()
	k.WindowSeconds = k.to.Sub(from).Seconds()
}

// nrtWritesByKind counts the controller's NodeResourceTopology writes in each
// kind's window. Its writes trail the pods by its write delay and its turn in the
// budget, so a window's count is what it wrote while that workload ran, not what
// that workload made it write; with the budget spent the two are the same rate.
func nrtWritesByKind(kinds []kindResult, evs []cluster.AuditEvent) {
	for i := range kinds {
		k := &kinds[i]
		if k.from.IsZero() {
			continue
		}
		var in []cluster.AuditEvent
		for _, ev := range evs {
			if at := ev.RequestReceivedTimestamp; !at.Before(k.from) && at.Before(k.to) {
				in = append(in, ev)
			}
		}
		n := controllerWritesOf(countRequests(in)["topodra-controller"]).NRT
		k.NRTWrites = &n
	}
}

// controllerWritesByKind is the report's table of those counts, empty where no kind
// has one: the same arrival rate gives the same writes a pod at any fleet size while
// the budget is what bounds the writes.
func controllerWritesByKind(s *stackResult) string {
	var b strings.Builder
	for _, k := range s.Kinds {
		if k.NRTWrites == nil || k.WindowSeconds <= 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nThe controller's NodeResourceTopology writes by workload (audit log; each window from the first wave's first create to the last wave's teardown; writes trail their pods, so a window holds what was written while it ran):\n\n| GPUs | kind | arrival | pods bound | seconds | writes | a pod | a second |\n|---|---|---|---|---|---|---|---|\n")
		}
		bound, arrival := k.bound(), "as fast as scheduled"
		if k.Rate > 0 {
			arrival = fmt.Sprintf("%g pods/s", k.Rate)
		}
		perPod := "-"
		if bound > 0 {
			perPod = fmt.Sprintf("%.3f", float64(*k.NRTWrites)/float64(bound))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %.0f | %d | %s | %.2f |\n",
			sizeText(k.Size), k.Kind, arrival, bound, k.WindowSeconds, *k.NRTWrites, perPod, float64(*k.NRTWrites)/k.WindowSeconds)
	}
	return b.String()
}
