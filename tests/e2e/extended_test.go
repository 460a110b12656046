package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	schedfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"topodra.dev/tests/e2e/harness"
)

const gpuResource = "nvidia.com/gpu"

// erStep is one step of the extended-resource workload: start a pod asking for size
// GPUs through nvidia.com/gpu, or delete a running one.
type erStep struct {
	create bool
	pod    string
	size   int
}

// erWorkload is a seeded mix of 1- and 2-GPU pods (3 to 2) arriving and leaving on one
// 8-GPU node, busy enough to be near full most of the time: a pod arrives with
// probability 0.7 when it fits, else a random running pod leaves. The 1-GPU pods are
// what fragments the node.
func erWorkload(seed uint64, steps int) []erStep {
	r := rand.New(rand.NewPCG(seed, 0x70d0d4a))
	var out []erStep
	live := map[string]int{}
	free, n := 8, 0
	for len(out) < steps {
		size := 2
		if r.IntN(5) < 2 {
			size = 1
		}
		if len(live) == 0 || (r.IntN(10) < 7 && free >= size) {
			if free < size {
				size = 1
			}
			n++
			name := fmt.Sprintf("er-%02d", n)
			live[name] = size
			free -= size
			out = append(out, erStep{create: true, pod: name, size: size})
			continue
		}
		names := make([]string, 0, len(live))
		for k := range live {
			names = append(names, k)
		}
		sort.Strings(names)
		victim := names[r.IntN(len(names))]
		free += live[victim]
		delete(live, victim)
		out = append(out, erStep{pod: victim})
	}
	return out
}

// erPlacement is what each created pod got, in workload order.
type erPlacement struct {
	pod  string
	size int
	devs []string
}

// alignedShare counts the 2-GPU pods whose GPUs share a NUMA node.
func alignedShare(ps []erPlacement, numa map[string]int64) (aligned, pairs int) {
	for _, p := range ps {
		if p.size != 2 {
			continue
		}
		pairs++
		if len(p.devs) == 2 && numa[p.devs[0]] == numa[p.devs[1]] {
			aligned++
		}
	}
	return aligned, pairs
}

// simulateWorkload runs the workload through the scheduler's own allocator
// (k8s.io/dynamic-resource-allocation/structured, with the allocator features the
// scheduler derives from the same feature gates) on one slice, with claims like those
// the scheduler makes for extended resources: one ExactCount request of the class,
// no constraints. The test checks it against every placement the real scheduler made
// on the cluster before using it for other device orders.
func simulateWorkload(t *testing.T, node *v1.Node, class *resourceapi.DeviceClass, slice *resourceapi.ResourceSlice, steps []erStep) []erPlacement {
	t.Helper()
	ctx := context.Background()
	features, celCache := schedulerAllocator()
	allocated := sets.New[structured.DeviceID]()
	held := map[string][]string{}
	var out []erPlacement
	for _, s := range steps {
		if !s.create {
			for _, d := range held[s.pod] {
				allocated.Delete(structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, d))
			}
			delete(held, s.pod)
			continue
		}
		alloc, err := structured.NewAllocator(ctx, features, structured.AllocatedState{
			AllocatedDevices:         allocated.Clone(),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}, classes{class}, []*resourceapi.ResourceSlice{slice}, celCache)
		if err != nil {
			t.Fatal(err)
		}
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: s.pod + "-extended-resources", Namespace: "sim", UID: types.UID(s.pod)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "container-0-request-0",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class.Name,
					AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(s.size)},
			}}}},
		}
		results, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
		if err != nil || len(results) != 1 {
			t.Fatalf("simulated %s: %v (%d results)", s.pod, err, len(results))
		}
		var devs []string
		for _, r := range results[0].Devices.Results {
			devs = append(devs, r.Device)
			allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
		sort.Strings(devs)
		held[s.pod] = devs
		out = append(out, erPlacement{s.pod, s.size, devs})
	}
	return out
}

// schedulerAllocator is what the scheduler's DRA plugin gives the allocator: the
// allocator features it derives from the feature gates (here the defaults of this
// release), and a CEL cache with the matching CEL features.
func schedulerAllocator() (structured.Features, *cel.Cache) {
	fts := schedfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	features := structured.Features{
		AdminAccess:             fts.EnableDRAAdminAccess,
		PrioritizedList:         fts.EnableDRAPrioritizedList,
		PartitionableDevices:    fts.EnableDRAPartitionableDevices,
		DeviceTaints:            fts.EnableDRADeviceTaints,
		DeviceBindingAndStatus:  fts.EnableDRADeviceBindingConditions && fts.EnableDRAResourceClaimDeviceStatus,
		ConsumableCapacity:      fts.EnableDRAConsumableCapacity,
		FractionalCapacityRange: fts.EnableDRAFractionalCapacityRange,
		ListTypeAttributes:      fts.EnableDRAListTypeAttributes,
		OptionalNodeOperations:  fts.EnableDRAOptionalNodeOperations,
		DerivedAttributes:       fts.EnableDRADerivedAttributes,
		CompatibilityGroups:     fts.EnableDRADeviceCompatibilityGroups,
	}
	return features, cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity, EnableListTypeAttributes: features.ListTypeAttributes})
}

// classes lists DeviceClasses for the allocator.
type classes []*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) { return c, nil }
func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, cl := range c {
		if cl.Name == name {
			return cl, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// createGPUPod creates a pod asking for n GPUs as the extended resource nvidia.com/gpu.
func (e *env) createGPUPod(ns, name string, n int) {
	e.t.Helper()
	e.createExtendedPod(ns, name, gpuResource, n)
}

// createExtendedPod creates a pod asking for n of an extended resource in its limits.
func (e *env) createExtendedPod(ns, name string, res v1.ResourceName, n int) {
	e.t.Helper()
	q := *resource.NewQuantity(int64(n), resource.DecimalSI)
	_, err := e.admin.CoreV1().Pods(ns).Create(context.Background(), &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PodSpec{
			RestartPolicy:                 v1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptrTo[int64](5),
			Containers: []v1.Container{{
				Name: "main", Image: "ubuntu:24.04", Command: []string{"sleep", "3600"},
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{res: q}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

// extendedClaim returns the claim the scheduler made for the pod's extended resources.
func (e *env) extendedClaim(pod *v1.Pod) (*resourceapi.ResourceClaim, []string) {
	e.t.Helper()
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		e.t.Fatalf("pod %s has no status.extendedResourceClaimStatus", pod.Name)
	}
	claim, err := e.admin.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), st.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if claim.Status.Allocation == nil {
		e.t.Fatalf("claim %s not allocated", claim.Name)
	}
	var devs []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName || r.Pool != e.node {
			e.t.Fatalf("claim %s: result %+v is not of %s on %s", claim.Name, r, driverName, e.node)
		}
		devs = append(devs, r.Device)
	}
	sort.Strings(devs)
	return claim, devs
}

// TestExtendedResource maps nvidia.com/gpu to gpu.topodra.dev with the chart value
// deviceClass.extendedResourceName on a simulated DGX H100 (no device plugin, so the
// node has no nvidia.com/gpu capacity): a pod asking for `nvidia.com/gpu: 2` in its
// limits is scheduled by the real scheduler through the claim it creates, prepared
// by the real plugin through the kubelet's DRA manager, and its container gets
// exactly the two allocated /dev/nvidiaN. Then a seeded workload of 1- and 2-GPU
// extended-resource pods measures how often a 2-GPU pod gets one NUMA node with the
// plugin's device order, and the scheduler's allocator, replaying the same workload
// on the same slice, gives the figure for shuffled device orders.
func TestExtendedResource(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100"})
	ctx := context.Background()
	const ns = "extended"
	e.createNamespace(ns)

	// The chart with the mapping; only the DeviceClasses change.
	rendered := helmTemplate(t, t.TempDir(), "--set", "deviceClass.extendedResourceName="+gpuResource)
	e.kubectlApply(manifestDoc(t, rendered, "DeviceClass"))
	class, err := e.admin.ResourceV1().DeviceClasses().Get(ctx, driverName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if class.Spec.ExtendedResourceName == nil || *class.Spec.ExtendedResourceName != gpuResource {
		t.Fatalf("class %s: extendedResourceName %v", driverName, class.Spec.ExtendedResourceName)
	}
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8, time.Minute)
	numa := map[string]int64{}
	for name, d := range devices {
		numa[name] = numaOf(t, d)
	}

	t.Run("a pod asking for nvidia.com/gpu: 2 gets two GPUs", func(t *testing.T) {
		e.t = t
		node, err := e.admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if q, ok := node.Status.Allocatable[gpuResource]; ok {
			t.Fatalf("node %s has %s allocatable (%s); the test needs a node without a device plugin", e.node, gpuResource, q.String())
		}
		e.createGPUPod(ns, "two", 2)
		pod := e.waitPodRunning(ns, "two", 2*time.Minute)
		claim, devs := e.extendedClaim(pod)
		st := pod.Status.ExtendedResourceClaimStatus
		t.Logf("pod two: claim %s (request mappings %+v) got %v on NUMA nodes %d/%d",
			claim.Name, st.RequestMappings, devs, numa[devs[0]], numa[devs[len(devs)-1]])
		if len(devs) != 2 {
			t.Fatalf("claim %s got %v, want 2 GPUs", claim.Name, devs)
		}
		if claim.Annotations[extendedClaimAnnot] != "true" || len(claim.OwnerReferences) != 1 || claim.OwnerReferences[0].UID != pod.UID {
			t.Errorf("claim %s: annotations %v, owners %+v; want the scheduler's extended resource claim owned by the pod",
				claim.Name, claim.Annotations, claim.OwnerReferences)
		}
		if len(claim.Spec.Devices.Constraints) != 0 || len(claim.Spec.Devices.Requests) != 1 ||
			claim.Spec.Devices.Requests[0].Exactly == nil || claim.Spec.Devices.Requests[0].Exactly.DeviceClassName != driverName {
			t.Errorf("claim %s spec %+v: want one request of %s and no constraints", claim.Name, claim.Spec.Devices, driverName)
		}
		if len(st.RequestMappings) != 1 || st.RequestMappings[0].ContainerName != "main" || st.RequestMappings[0].ResourceName != gpuResource {
			t.Errorf("request mappings %+v, want main's %s", st.RequestMappings, gpuResource)
		}

		rec, err := harness.ReadRecord(e.h.RecordPath(ns, "two", pod.UID))
		if err != nil {
			t.Fatalf("injection record: %v", err)
		}
		gpuNode := regexp.MustCompile(`^/dev/nvidia\d+$`)
		var got, want []string
		for _, p := range rec.Containers[0].DeviceNodes {
			if gpuNode.MatchString(p) {
				got = append(got, p)
			}
		}
		for _, d := range devs {
			want = append(want, fmt.Sprintf("/dev/nvidia%d", minorOf(d)))
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("GPU device nodes injected %v, want exactly %v (all: %v)", got, want, rec.Containers[0].DeviceNodes)
		}
		t.Logf("container main: CDI devices %v, device nodes %v", rec.Containers[0].CDIDevices, rec.Containers[0].DeviceNodes)
		if !strings.HasPrefix(strings.Join(rec.Containers[0].CDIDevices, ","), "k8s."+driverName+"/claim=") {
			t.Errorf("CDI devices %v are not the plugin's claim device", rec.Containers[0].CDIDevices)
		}

		e.deleteGPUPod(ns, pod)
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("how often 2-GPU pods get one NUMA node", func(t *testing.T) {
		e.t = t
		const seed, length = 5004, 80
		steps := erWorkload(seed, length)
		var measured []erPlacement
		pods := map[string]*v1.Pod{}
		for _, s := range steps {
			if !s.create {
				e.deleteGPUPod(ns, pods[s.pod])
				delete(pods, s.pod)
				continue
			}
			e.createGPUPod(ns, s.pod, s.size)
			pod := e.waitPodRunning(ns, s.pod, 2*time.Minute)
			_, devs := e.extendedClaim(pod)
			if len(devs) != s.size {
				t.Fatalf("pod %s got %v, want %d GPUs", s.pod, devs, s.size)
			}
			pods[s.pod] = pod
			measured = append(measured, erPlacement{s.pod, s.size, devs})
		}
		for name, pod := range pods {
			e.deleteGPUPod(ns, pod)
			delete(pods, name)
		}
		aligned, pairs := alignedShare(measured, numa)
		t.Logf("measured on the cluster: %d of %d 2-GPU pods on one NUMA node (%.0f%%), workload seed %d, %d steps, %d pods",
			aligned, pairs, 100*float64(aligned)/float64(pairs), seed, length, len(measured))
		for _, p := range measured {
			t.Logf("  %s (%d GPU): %v NUMA %v", p.pod, p.size, p.devs, numasOf(p.devs, numa))
		}

		// The scheduler's allocator, run here on the published slice, reproduces
		// every placement the scheduler made.
		node, err := e.admin.CoreV1().Nodes().Get(ctx, e.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		published := e.slices(ctx)
		if len(published) != 1 {
			t.Fatalf("%d slices; the replay handles one", len(published))
		}
		slice := &published[0]
		var order []string
		for _, d := range slice.Spec.Devices {
			order = append(order, fmt.Sprintf("%s(NUMA %d)", d.Name, numa[d.Name]))
		}
		t.Logf("published device order: %v", order)
		replayed := simulateWorkload(t, node, class, slice, steps)
		for i := range measured {
			if !slices.Equal(measured[i].devs, replayed[i].devs) {
				t.Errorf("replay differs at %s: scheduler %v, allocator here %v", measured[i].pod, measured[i].devs, replayed[i].devs)
			}
		}

		// With the allocator validated, the figure over many workloads: 100 seeds
		// with the published order, and each with 10 random device orders.
		r := rand.New(rand.NewPCG(seed, 1))
		var ours, random [2]int // aligned, 2-GPU pods
		for wl := uint64(1); wl <= 100; wl++ {
			steps := erWorkload(wl, length)
			a, p := alignedShare(simulateWorkload(t, node, class, slice, steps), numa)
			ours[0], ours[1] = ours[0]+a, ours[1]+p
			for range 10 {
				shuffled := slice.DeepCopy()
				r.Shuffle(len(shuffled.Spec.Devices), func(i, j int) {
					shuffled.Spec.Devices[i], shuffled.Spec.Devices[j] = shuffled.Spec.Devices[j], shuffled.Spec.Devices[i]
				})
				a, p := alignedShare(simulateWorkload(t, node, class, shuffled, steps), numa)
				random[0], random[1] = random[0]+a, random[1]+p
			}
		}
		pct := func(v [2]int) float64 { return 100 * float64(v[0]) / float64(v[1]) }
		t.Logf("100 workloads of %d steps: published order %d of %d 2-GPU pods on one NUMA node (%.1f%%); "+
			"random orders (10 per workload) %d of %d (%.1f%%)", length, ours[0], ours[1], pct(ours), random[0], random[1], pct(random))
		if pct(ours) <= pct(random) {
			t.Errorf("the published order aligns no more 2-GPU pods (%.1f%%) than random orders (%.1f%%)", pct(ours), pct(random))
		}
	})
}

func numasOf(devs []string, numa map[string]int64) []int64 {
	var out []int64
	for _, d := range devs {
		out = append(out, numa[d])
	}
	return out
}

// deleteGPUPod deletes an extended-resource pod and waits until its GPUs are free
// again: the pod gone and its claim gone or deallocated.
func (e *env) deleteGPUPod(ns string, pod *v1.Pod) {
	e.t.Helper()
	ctx := context.Background()
	if err := e.admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitPodGone(ns, pod.Name, time.Minute)
	name := pod.Status.ExtendedResourceClaimStatus.ResourceClaimName
	eventually(e.t, time.Minute, func() error {
		c, err := e.admin.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && c.Status.Allocation == nil) {
			return nil
		}
		return fmt.Errorf("claim %s of deleted pod %s still allocated (%v)", name, pod.Name, err)
	})
}
