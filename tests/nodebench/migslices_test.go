package main

import (
	"encoding/json"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func poolSlice(name string, gen, count int64) resourceapi.ResourceSlice {
	return resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: resourceapi.ResourceSliceSpec{Pool: resourceapi.ResourcePool{
			Name: "node", Generation: gen, ResourceSliceCount: count}},
	}
}

// A pool is complete when all slices of its newest generation are listed; a
// pool of no devices is complete too (a plugin with nothing to offer publishes
// one empty slice).
func TestCompletePool(t *testing.T) {
	old, a, b := poolSlice("old", 1, 1), poolSlice("a", 2, 2), poolSlice("b", 2, 2)
	if _, _, ok := completePool([]resourceapi.ResourceSlice{old, a}); ok {
		t.Fatal("one of two slices of generation 2: not complete")
	}
	pool, got, ok := completePool([]resourceapi.ResourceSlice{old, a, b})
	if !ok || pool != "node" || len(got) != 2 {
		t.Fatalf("pool %q, %d slices, complete %v", pool, len(got), ok)
	}
	if _, _, ok := completePool([]resourceapi.ResourceSlice{old}); !ok {
		t.Fatal("an empty pool of one slice is complete")
	}
	if _, _, ok := completePool(nil); ok {
		t.Fatal("nothing listed: not complete")
	}
}

func TestFingerprintChangesWithAWrite(t *testing.T) {
	a, b := poolSlice("a", 1, 2), poolSlice("b", 1, 2)
	before := fingerprint([]resourceapi.ResourceSlice{a, b})
	if fingerprint([]resourceapi.ResourceSlice{b, a}) != before {
		t.Fatal("the list order changed the fingerprint")
	}
	b.ResourceVersion = "2"
	if fingerprint([]resourceapi.ResourceSlice{a, b}) == before {
		t.Fatal("a new resourceVersion left the fingerprint as it was")
	}
}

func TestTally(t *testing.T) {
	one := *resource.NewQuantity(1, resource.BinarySI)
	counters := poolSlice("counters", 1, 2)
	counters.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0",
		Counters: map[string]resourceapi.Counter{"memory-slice-0": {Value: one}, "memory-slice-1": {Value: one}}}}
	devices := poolSlice("devices", 1, 2)
	devices.Spec.Devices = []resourceapi.Device{
		{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"a": {}, "b": {}},
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0",
				Counters: map[string]resourceapi.Counter{"memory-slice-0": {Value: one}, "memory-slice-1": {Value: one}}}}},
		{Name: "gpu-0-mig-1g", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: one}}},
	}
	all := []resourceapi.ResourceSlice{counters, devices}
	r := tally(all, 2)
	sets, _ := json.Marshal(counters.Spec.SharedCounters)
	want := PoolStats{Slices: 2, Devices: 2, CounterSets: 1, Counters: 2, SpecBytes: specBytes(all),
		CounterSetBytes: len(sets), BytesPerGPU: float64(specBytes(all)) / 2,
		AttributesPerDevice: 1, CapacitiesPerDevice: 0.5, ConsumedCountersPerDevice: 1}
	if r.SpecBytes == 0 || r.CounterSetBytes >= r.SpecBytes {
		t.Fatalf("bytes: %+v", r)
	}
	got, _ := json.Marshal(r)
	if w, _ := json.Marshal(want); string(got) != string(w) {
		t.Fatalf("got  %s\nwant %s", got, w)
	}
}

// A run without a pool has no counts in the report, not zeros.
func TestARunWithoutAPoolHasNoCounts(t *testing.T) {
	b, _ := json.Marshal(sliceRun{Driver: "nvidia", Error: "exited"})
	if string(b) != `{"driver":"nvidia","driverName":"","mode":"","profile":"","error":"exited"}` {
		t.Fatalf("%s", b)
	}
	b, _ = json.Marshal(sliceRun{Driver: "topodra", PoolStats: &PoolStats{Devices: 8}})
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil || back["devices"] != float64(8) {
		t.Fatalf("%s: the counts are not at the run's top level", b)
	}
}

func TestWithFlagAppendsToTheCommandLine(t *testing.T) {
	d := driver{args: func(dir, node, kubeconfig string) ([]string, []string, error) {
		return []string{"--node-name=" + node}, []string{"A=1"}, nil
	}}
	args, env, err := withFlag(d, "--dynamic-mig").args("dir", "n", "kc")
	if err != nil || !slices.Equal(args, []string{"--node-name=n", "--dynamic-mig"}) || !slices.Equal(env, []string{"A=1"}) {
		t.Fatalf("args %q env %q err %v", args, env, err)
	}
	if args, _, _ := withFlag(d, "").args("dir", "n", "kc"); len(args) != 1 {
		t.Fatalf("no flag: args %q", args)
	}
}
