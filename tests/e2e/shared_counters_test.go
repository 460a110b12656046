package e2e

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// What the shared-GPU design builds on, pinned against the scheduler's own allocator
// (k8s.io/dynamic-resource-allocation v0.37.2 under the 1.37 default feature gates):
// a device that allows multiple allocations and consumes a GPU's counters is charged
// those counters once, while any share of it is allocated, not once per share. The
// incubating allocator skips the counter check for a further share of an
// allow-multiple device whose capacity is in use (allocator_incubating.go,
// `skipCounterCheck`), and counts an allocated device's consumption once however
// many shares it has (`IsDeviceAllocated`). So a shared GPU and a partition of it
// exclude each other as the whole GPU and its partitions do, and the shares are
// limited by the device's capacity, not by the counters.

const sharedDriver = "gpu.topodra.dev"

// sharedPool is one GPU's counter set (its 8 memory slices) and three devices that
// consume it: the whole GPU, a time-sliced device that allows multiple allocations
// with 80Gi of memory to share, and one 1g partition at slice 6.
func sharedPool() []*resourceapi.ResourceSlice {
	all := map[string]resourceapi.Counter{}
	for i := range 8 {
		all[fmt.Sprintf("memory-slice-%d", i)] = resourceapi.Counter{Value: resource.MustParse("1")}
	}
	pool := resourceapi.ResourcePool{Name: "sim", Generation: 1, ResourceSliceCount: 2}
	counters := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "sim-counters"},
		Spec: resourceapi.ResourceSliceSpec{Driver: sharedDriver, Pool: pool, NodeName: ptr.To("sim"),
			SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0", Counters: all}}},
	}
	consumes := func(names ...string) []resourceapi.DeviceCounterConsumption {
		c := map[string]resourceapi.Counter{}
		for _, n := range names {
			c[n] = resourceapi.Counter{Value: resource.MustParse("1")}
		}
		return []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0", Counters: c}}
	}
	var every []string
	for n := range all {
		every = append(every, n)
	}
	id := func(name string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"id": {StringValue: ptr.To(name)}}
	}
	devices := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "sim-devices"},
		Spec: resourceapi.ResourceSliceSpec{Driver: sharedDriver, Pool: pool, NodeName: ptr.To("sim"),
			Devices: []resourceapi.Device{
				{Name: "gpu-0", Attributes: id("gpu-0"), ConsumesCounters: consumes(every...)},
				{
					Name:                     "gpu-0-shared",
					Attributes:               id("gpu-0-shared"),
					AllowMultipleAllocations: ptr.To(true),
					Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
						"memory": {Value: resource.MustParse("80Gi")},
					},
					ConsumesCounters: consumes(every...),
				},
				{Name: "gpu-0-mig-1g-10gb-6", Attributes: id("gpu-0-mig-1g-10gb-6"), ConsumesCounters: consumes("memory-slice-6")},
			}},
	}
	return []*resourceapi.ResourceSlice{counters, devices}
}

// sharedState is the allocator's view of what is allocated: whole devices, and
// shares with the capacity they consume, as the scheduler builds it from claims.
type sharedState struct {
	devices sets.Set[structured.DeviceID]
	shares  sets.Set[structured.SharedDeviceID]
	used    structured.ConsumedCapacityCollection
	n       int
}

// allocate asks for the device named `device` (with `memory` of its capacity when
// not empty); nil when the allocator finds no room for it.
func (s *sharedState) allocate(t *testing.T, device, memory string) *resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	ctx := context.Background()
	features, cache := schedulerAllocator()
	if !features.ConsumableCapacity || !features.PartitionableDevices {
		t.Fatalf("the 1.37 defaults give the allocator consumable capacity %v, partitionable devices %v; the test needs both", features.ConsumableCapacity, features.PartitionableDevices)
	}
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "by-name"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "` + sharedDriver + `"`}}}},
	}
	alloc, err := structured.NewAllocator(ctx, features, structured.AllocatedState{
		AllocatedDevices:         s.devices.Clone(),
		AllocatedSharedDeviceIDs: s.shares.Clone(),
		AggregatedCapacity:       s.used.Clone(),
	}, classes{class}, sharedPool(), cache)
	if err != nil {
		t.Fatal(err)
	}
	s.n++
	// CEL has no device name: each device carries it as an attribute.
	req := &resourceapi.ExactDeviceRequest{
		DeviceClassName: "by-name",
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.attributes[%q].id == %q", sharedDriver, device)}}},
	}
	if memory != "" {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory)}}
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", s.n), Namespace: "sim", UID: types.UID(fmt.Sprintf("uid-%d", s.n))},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: req}}}},
	}
	results, err := alloc.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim"}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("allocating %s: %v", device, err)
	}
	for _, res := range results {
		for i := range res.Devices.Results {
			r := &res.Devices.Results[i]
			if r.Device != device {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				s.shares.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				s.used.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			} else {
				s.devices.Insert(id)
			}
			return r
		}
	}
	return nil
}

func newSharedState() *sharedState {
	return &sharedState{
		devices: sets.New[structured.DeviceID](),
		shares:  sets.New[structured.SharedDeviceID](),
		used:    structured.NewConsumedCapacityCollection(),
	}
}

func TestSharedDeviceCountersAreChargedOnce(t *testing.T) {
	t.Parallel()

	t.Run("shares of one device, then its partition and its whole GPU", func(t *testing.T) {
		s := newSharedState()
		for i := range 4 {
			r := s.allocate(t, "gpu-0-shared", "20Gi")
			if r == nil || r.ShareID == nil {
				t.Fatalf("share %d of gpu-0-shared: %+v; want a share (the counters are charged once)", i, r)
			}
		}
		// 80Gi of 80Gi is taken: capacity, not counters, refuses a fifth.
		if r := s.allocate(t, "gpu-0-shared", "20Gi"); r != nil {
			t.Errorf("a fifth 20Gi share of 80Gi was allocated: %+v", r)
		}
		if r := s.allocate(t, "gpu-0-mig-1g-10gb-6", ""); r != nil {
			t.Errorf("a partition was allocated beside the shared device: %+v", r)
		}
		if r := s.allocate(t, "gpu-0", ""); r != nil {
			t.Errorf("the whole GPU was allocated beside the shared device: %+v", r)
		}
	})

	t.Run("a partition first keeps the shared device off", func(t *testing.T) {
		s := newSharedState()
		if r := s.allocate(t, "gpu-0-mig-1g-10gb-6", ""); r == nil {
			t.Fatal("the partition was not allocated on an empty GPU")
		}
		if r := s.allocate(t, "gpu-0-shared", "10Gi"); r != nil {
			t.Errorf("a share was allocated beside a partition: %+v", r)
		}
	})
}
