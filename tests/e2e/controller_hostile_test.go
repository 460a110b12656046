package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"topodra.dev/tests/e2e/harness"
)

// nestedJSON is `depth` objects nested under key "a", innermost {"x":1}.
func nestedJSON(depth int) []byte {
	return []byte(strings.Repeat(`{"a":`, depth) + `{"x":1}` + strings.Repeat("}", depth))
}

// TestControllerHostileInputs feeds the real controller, through the real API server
// (which accepts every object here), what issue 42 found could crash it or blind it:
//   - two dra.cpu devices on one NUMA node with 2^64-1 CPUs each, and a claim that
//     consumes 2^64-1 of each (a sum that panicked the controller at every start);
//   - 128 dra.cpu devices on NUMA nodes 896-1023 of a node whose own slices say it
//     has NUMA nodes 0 and 1 (they gave it 130 zones);
//   - an allocated claim whose config for another driver nests 150 objects (past
//     the decoder's 128 levels: the claim watch failed, the claim's GPU showed free,
//     and kubectl topodra failed for everyone).
//
// The controller comes up ready and stays up, its NodeResourceTopology object has
// exactly the node's two zones with the GPU of the deep claim allocated and the CPU
// figures saturated, the metrics count what was pruned and left out, and
// `kubectl topodra nodes` answers.
func TestControllerHostileInputs(t *testing.T) {
	t.Parallel()
	binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller")
	kubectlTopodra := binary(t, "TOPODRA_KUBECTL_PLUGIN_BIN", "kubectl-topodra")
	e := manifestsOnlyEnv(t)
	ctx := context.Background()
	dyn := e.installNRTCRD()
	const node = "hostile"
	if _, err := e.admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	create := func(s *resourceapi.ResourceSlice) {
		t.Helper()
		if _, err := e.admin.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the API server refused slice %s, so it is no test of the controller: %v", s.Name, err)
		}
	}
	numa := func(i int64) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":                            {StringValue: ptr.To("gpu")},
			"resource.kubernetes.io/numaNode": {IntValue: ptr.To(i)},
		}
	}
	// Our plugin's slice, as it publishes it: GPUs on NUMA 0 and 1, and the node's
	// NUMA nodes announced.
	create(&resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu", Annotations: map[string]string{"topodra.dev/numa-nodes": "0-1"}},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driverName, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: numa(0)}, {Name: "gpu-1", Attributes: numa(1)}},
		},
	})
	max := resource.MustParse("18446744073709551615")
	cpuDevice := func(name string, numaNode int64, cpus resource.Quantity) resourceapi.Device {
		return resourceapi.Device{
			Name:                     name,
			Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"resource.kubernetes.io/numaNode": {IntValue: ptr.To(numaNode)}},
			Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"dra.cpu/cpu": {Value: cpus}},
			AllowMultipleAllocations: ptr.To(true),
		}
	}
	var far []resourceapi.Device
	for i := int64(896); i < 1024; i++ {
		far = append(far, cpuDevice(fmt.Sprintf("far%04d", i), i, resource.MustParse("8")))
	}
	cpuSlice := func(name string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: "dra.cpu", NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 2},
				Devices: devices,
			},
		}
	}
	create(cpuSlice(node+"-cpu-0", cpuDevice("huge-a", 0, max), cpuDevice("huge-b", 0, max), cpuDevice("one", 1, resource.MustParse("56"))))
	create(cpuSlice(node+"-cpu-1", far...))

	// The deep claim: allocated our gpu-0 and 2^64-1 CPUs from each huge device,
	// with another driver's config 150 levels deep in its spec and its allocation.
	deep := runtime.RawExtension{Raw: nestedJSON(150)}
	const ns = "hostile"
	e.createNamespace(ns)
	claim, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "deep"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driverName}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: deep},
			}}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the API server refused the deep claim, so it is no test of the controller: %v", err)
	}
	consumed := map[resourceapi.QualifiedName]resource.Quantity{"dra.cpu/cpu": max}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: driverName, Pool: node, Device: "gpu-0"},
			{Request: "gpu", Driver: "dra.cpu", Pool: node, Device: "huge-a", ConsumedCapacity: consumed, ShareID: ptr.To(types.UID("00000000-0000-0000-0000-000000000001"))},
			{Request: "gpu", Driver: "dra.cpu", Pool: node, Device: "huge-b", ConsumedCapacity: consumed, ShareID: ptr.To(types.UID("00000000-0000-0000-0000-000000000002"))},
		},
		Config: []resourceapi.DeviceAllocationConfiguration{{
			Source:              resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: deep}},
		}},
	}}
	if _, err := e.admin.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the API server refused the deep claim's allocation, so it is no test of the controller: %v", err)
	}

	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "controller.kubeconfig")
	if err := harness.ControllerIdentity(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), kubeconfig, time.Hour); err != nil {
		t.Fatal(err)
	}
	ctrl := e.startController("ctrl", kubeconfig)
	eventually(t, time.Minute, ctrl.ready)

	eventually(t, time.Minute, func() error {
		obj, err := e.nrtOf(ctx, dyn, node)
		if err != nil {
			return err
		}
		got, _ := json.Marshal(obj.Zones)
		var zones []string
		for _, z := range obj.Zones {
			res := map[string]string{}
			for _, r := range z.Resources {
				res[r.Name] = r.Capacity.String() + "/" + r.Available.String()
			}
			zones = append(zones, fmt.Sprintf("%s gpu=%s cpu=%s", z.Name, res["nvidia.com/gpu"], res["cpu"]))
		}
		want := []string{
			"node-0 gpu=1/0 cpu=18446744073709551615/0",
			"node-1 gpu=1/1 cpu=56/56",
		}
		if strings.Join(zones, "; ") != strings.Join(want, "; ") {
			return fmt.Errorf("zones of node %s: %q, want %q\n%s", node, zones, want, got)
		}
		return nil
	})
	m, err := ctrl.metrics()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{
		`topodra_controller_objects_pruned_total{resource="resourceclaims"}`: 1,
		`topodra_controller_cpu_numa_nodes_ignored`:                          128,
	} {
		if m[name] < want {
			t.Errorf("%s = %v, want at least %v", name, m[name], want)
		}
	}
	select {
	case <-ctrl.done:
		t.Fatalf("the controller exited:\n%s", tailFile(ctrl.log, 30))
	default:
	}

	cmd := exec.Command(kubectlTopodra, "nodes")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.c.Kubeconfig)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl topodra nodes: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), node) {
		t.Errorf("kubectl topodra nodes does not list node %s:\n%s", node, out)
	}
}
