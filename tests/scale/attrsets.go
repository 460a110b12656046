package main

// The attribute-set waves (-attribute-sets): what each attribute a GPU publishes
// costs, measured by publishing the same fleet with three attribute sets in turn
// under one kube-scheduler and running the same waves on each: topodra's lean
// default, its full set (`--attributes full`, which adds brand, architecture and
// cudaDriverVersion) and NVIDIA's set (nvidiaEquivalent: the attributes NVIDIA's
// plugin publishes, with topodra's values). The lean set runs first and last
// (A B C A), so drift over the run shows beside the differences.

import (
	"context"
	"fmt"
	"strings"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
)

// attributeSetFigures are one phase of the attribute-set waves.
type attributeSetFigures struct {
	// Set is "lean-a", "full", "nvidia" or "lean-b", also the variant of its
	// waves' rows in Kinds ("any-<set>", "aligned-<set>").
	Set         string  `json:"set"`
	BytesPerGPU float64 `json:"bytesPerGPU"`
	// GoHeapPeak is each component's highest Go heap in use over the phase's
	// waves (read once a second). The slices of the phase before were deleted
	// just before, so what a collection has not freed yet can count.
	GoHeapPeak map[string]float64 `json:"goHeapPeakBytes,omitempty"`
	// GoHeapFloor is each component's lowest Go heap in use over the quiet
	// window before the phase's waves (-attribute-set-quiet), with only this
	// set's slices published: what the slices themselves keep live, without
	// the waves' garbage. A collection runs at least every two minutes, so a
	// window longer than that holds one.
	GoHeapFloor map[string]float64 `json:"goHeapFloorBytes,omitempty"`
}

// attributeSetPhase is one set's slices for the fleet, and whether it runs
// aligned waves.
type attributeSetPhase struct {
	set     string
	slices  [][]resourcev1.ResourceSlice
	aligned bool
}

// attributeSetPhases are the phases in run order and the slices of each: lean
// is `ordered` (the default), full what `discover --attributes=full` builds,
// nvidia that cut to NVIDIA's attribute set. NVIDIA's set has no NUMA node, so
// only lean and full run aligned waves.
func attributeSetPhases(lean, full [][]resourcev1.ResourceSlice) []attributeSetPhase {
	nvidia := make([][]resourcev1.ResourceSlice, len(full))
	for i, node := range full {
		for _, s := range node {
			nvidia[i] = append(nvidia[i], nvidiaEquivalent(s))
		}
	}
	return []attributeSetPhase{
		{"lean-a", lean, true},
		{"full", full, true},
		{"nvidia", nvidia, false},
		{"lean-b", lean, true},
	}
}

// attributeSetWaves runs the phases; `ordered` is published again when it
// returns.
func attributeSetWaves(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns string, ordered, full [][]resourcev1.ResourceSlice) ([]kindResult, []attributeSetFigures, error) {
	var kinds []kindResult
	var sets []attributeSetFigures
	for _, ph := range attributeSetPhases(ordered, full) {
		progress("dra: attribute-set waves on the %s slices (%.0f bytes a GPU)", ph.set, sliceBytesPerGPU(ph.slices[0]))
		if err := republish(ctx, cs, ph.slices); err != nil {
			return kinds, sets, fmt.Errorf("attribute set %s: %w", ph.set, err)
		}
		floor := heapFloor(ctx, m, c.attributeQuiet)
		m.takeHeapPeaks()
		for _, k := range commonSizes(c.sizes) {
			kr, err := draKind(ctx, cs, c, m, ns, k, "any", ph.set, 0)
			if err != nil {
				return kinds, sets, err
			}
			kinds = append(kinds, kr)
			if !ph.aligned {
				continue
			}
			if kr, err = draKind(ctx, cs, c, m, ns, k, "aligned", ph.set, 0); err != nil {
				return kinds, sets, err
			}
			kinds = append(kinds, kr)
		}
		sets = append(sets, attributeSetFigures{Set: ph.set, BytesPerGPU: sliceBytesPerGPU(ph.slices[0]), GoHeapPeak: m.takeHeapPeaks(), GoHeapFloor: floor})
	}
	return kinds, sets, republish(ctx, cs, ordered)
}

// heapFloor reads every metered process for d, every two seconds, with nothing
// asked of the stack, and keeps each one's lowest Go heap in use (nil for d 0).
func heapFloor(ctx context.Context, m *meter, d time.Duration) map[string]float64 {
	if d <= 0 {
		return nil
	}
	floor := map[string]float64{}
	for end := time.Now().Add(d); ctx.Err() == nil && time.Now().Before(end); {
		for name, s := range m.read(ctx).samples {
			if h, ok := s["go_memstats_heap_inuse_bytes"]; ok {
				if prev, seen := floor[name]; !seen || h < prev {
					floor[name] = h
				}
			}
		}
		select {
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
	}
	return floor
}

// attributeSetSection is the report's section on the attribute-set waves: per
// set and size, the bytes a GPU, throughput and the scheduler's CPU per pod in
// unconstrained and aligned waves, and the scheduler's and API server's heap
// peaks over the set's waves.
func (r results) attributeSetSection(b *strings.Builder) {
	s := r.DRA
	if len(s.AttributeSets) == 0 {
		return
	}
	fmt.Fprintf(b, "## Attribute sets under one kube-scheduler (run 1, %d nodes)\n\n", r.Nodes)
	b.WriteString("The fleet published with each attribute set in turn (lean first and last, so drift shows), the same waves on each. " +
		"nvidia is NVIDIA's attribute set with topodra's values; it names no NUMA node, so it has no aligned waves. " +
		"Scheduler CPU is kube-scheduler's per bound pod (medians over the waves); heap peaks are over each set's waves, " +
		"with the set before's slices deleted just before; heap floors are the lowest heap in use over the quiet window before the set's waves, with only its slices published.\n\n")
	b.WriteString("| set | bytes a GPU | GPUs | unconstrained pods/s | scheduler CPU ms/pod | aligned pods/s | scheduler CPU ms/pod | kube-scheduler heap floor | kube-apiserver heap floor | kube-scheduler heap peak | kube-apiserver heap peak |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, set := range s.AttributeSets {
		for _, kr := range s.Kinds {
			if kr.Kind != "any-"+set.Set {
				continue
			}
			k := kr.Size
			anyPS, anyCPU := fmt.Sprintf("%.1f", kr.PodsPerSec), fmt.Sprintf("%.2f", kr.CPUMsPerPod["kube-scheduler"])
			alPS, alCPU := "-", "-"
			if kr, ok := s.kind(k, "aligned-"+set.Set); ok {
				alPS, alCPU = fmt.Sprintf("%.1f", kr.PodsPerSec), fmt.Sprintf("%.2f", kr.CPUMsPerPod["kube-scheduler"])
			}
			fmt.Fprintf(b, "| %s | %.0f | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", set.Set, set.BytesPerGPU, k, anyPS, anyCPU, alPS, alCPU,
				heapMiB(set.GoHeapFloor, "kube-scheduler"), heapMiB(set.GoHeapFloor, "kube-apiserver"),
				heapMiB(set.GoHeapPeak, "kube-scheduler"), heapMiB(set.GoHeapPeak, "kube-apiserver"))
		}
	}
	b.WriteString("\n")
}

// heapMiB is a heap figure as whole MiB, "-" where it was not read.
func heapMiB(peaks map[string]float64, component string) string {
	if v, ok := peaks[component]; ok && v > 0 {
		return mib(int64(v))
	}
	return "-"
}
