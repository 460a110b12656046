package main

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// The phases run lean, full, NVIDIA's set and lean again; NVIDIA's set is cut
// from the full slices of the same node and has no aligned waves (no NUMA node).
func TestAttributeSetPhases(t *testing.T) {
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(s)} }
	slice := func(attrs map[resourcev1.QualifiedName]resourcev1.DeviceAttribute) [][]resourcev1.ResourceSlice {
		return [][]resourcev1.ResourceSlice{{{Spec: resourcev1.ResourceSliceSpec{Devices: []resourcev1.Device{{Name: "gpu-0", Attributes: attrs}}}}}}
	}
	numa := resourcev1.DeviceAttribute{IntValue: ptr.To[int64](1)}
	lean := slice(map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str("GPU-1"), "resource.kubernetes.io/numaNode": numa})
	full := slice(map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str("GPU-1"), "brand": str("NVIDIA"), "resource.kubernetes.io/numaNode": numa})
	var names []string
	for _, ph := range attributeSetPhases(lean, full) {
		names = append(names, ph.set)
		d := ph.slices[0][0].Spec.Devices[0]
		_, hasNUMA := d.Attributes["resource.kubernetes.io/numaNode"]
		if ph.aligned != hasNUMA {
			t.Errorf("%s: aligned %v with a NUMA node %v", ph.set, ph.aligned, hasNUMA)
		}
		if ph.set == "nvidia" {
			if _, ok := d.Attributes["brand"]; !ok {
				t.Error("nvidia: not cut from the full slices (no brand)")
			}
		}
	}
	if got := strings.Join(names, " "); got != "lean-a full nvidia lean-b" {
		t.Errorf("phases %q", got)
	}
	if len(full[0][0].Spec.Devices[0].Attributes) != 3 {
		t.Error("the full slices were changed")
	}
}

// The report's table: a row per set and size, aligned figures only where the
// set ran aligned waves, heap floors and peaks in MiB.
func TestAttributeSetSection(t *testing.T) {
	kr := func(kind string, size int, pps, cpu float64) kindResult {
		return kindResult{Size: size, Kind: kind, PodsPerSec: pps, CPUMsPerPod: map[string]float64{"kube-scheduler": cpu}}
	}
	r := results{Nodes: 500, DRA: stackResult{
		Kinds: []kindResult{kr("aligned", 1, 50, 9), kr("any-lean-a", 1, 60, 5.5), kr("aligned-lean-a", 1, 55, 6.25), kr("any-nvidia", 1, 61, 5)},
		AttributeSets: []attributeSetFigures{
			{Set: "lean-a", BytesPerGPU: 540, GoHeapPeak: map[string]float64{"kube-scheduler": 200 << 20, "kube-apiserver": 800 << 20},
				GoHeapFloor: map[string]float64{"kube-scheduler": 120 << 20, "kube-apiserver": 500 << 20}},
			{Set: "nvidia", BytesPerGPU: 568, GoHeapPeak: map[string]float64{"kube-scheduler": 190 << 20}},
		},
	}}
	var b strings.Builder
	r.attributeSetSection(&b)
	got := b.String()
	for _, want := range []string{
		"## Attribute sets under one kube-scheduler (run 1, 500 nodes)",
		"| lean-a | 540 | 1 | 60.0 | 5.50 | 55.0 | 6.25 | 120 MiB | 500 MiB | 200 MiB | 800 MiB |",
		"| nvidia | 568 | 1 | 61.0 | 5.00 | - | - | - | - | 190 MiB | - |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	var none strings.Builder
	(results{}).attributeSetSection(&none)
	if none.Len() != 0 {
		t.Errorf("a run without the waves has the section: %q", none.String())
	}
}
