package main

import (
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// A run without concurrent rounds has ratios over nothing: they are left out, so
// the report still encodes as JSON, and the table shows a dash for them.
func TestRatiosLeaveOutWhatWasNotMeasured(t *testing.T) {
	rs := []driverResult{
		{Driver: driver{Key: "topodra"}, RSSIdleKiB: 20, SliceBytesPerDevice: 600},
		{Driver: driver{Key: "other"}, RSSIdleKiB: 40, SliceBytesPerDevice: 400},
	}
	r := report{Drivers: rs, Ratios: ratios(rs)}
	if _, err := json.Marshal(r); err != nil {
		t.Fatalf("report does not encode: %v", err)
	}
	got := r.Ratios["other"].(map[string]float64)
	if got["rss_idle"] != 0.5 || got["slice_bytes_per_device"] != 1.5 {
		t.Fatalf("ratios %v", got)
	}
	if _, ok := got["concurrent_round_p50"]; ok {
		t.Fatalf("a ratio over zero rounds is in the report: %v", got)
	}
	if md := markdown(&r); !strings.Contains(md, "| rss_idle | 0.50 |") {
		t.Fatalf("markdown:\n%s", md)
	}
}

func TestSpecBytesPerDevice(t *testing.T) {
	spec := resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", Devices: []resourceapi.Device{{Name: "gpu-0"}, {Name: "gpu-1"}}}
	b, _ := json.Marshal(spec)
	slices := []resourceapi.ResourceSlice{{Spec: spec}, {Spec: resourceapi.ResourceSliceSpec{Driver: "x"}}}
	empty, _ := json.Marshal(slices[1].Spec)
	if got, want := specBytesPerDevice(slices), float64(len(b)+len(empty))/2; got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
	if specBytesPerDevice(nil) != 0 {
		t.Fatal("no devices: want 0")
	}
	if names := deviceNames(slices); strings.Join(names, ",") != "gpu-0,gpu-1" {
		t.Fatalf("names %v", names)
	}
}
