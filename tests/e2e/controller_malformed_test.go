package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"topodra.dev/tests/e2e/harness"
)

// malformedDevice is a whole GPU (the driver's `type` attribute) whose numaNode
// attribute is given as is.
func malformedDevice(name string, numa resourceapi.DeviceAttribute) resourceapi.Device {
	return resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":                            {StringValue: ptr.To("gpu")},
		"resource.kubernetes.io/numaNode": numa,
	}}
}

// TestControllerMalformedSlices feeds the real controller, under its RBAC, slices
// that anyone allowed to write ResourceSlices of our driver could publish, through
// the real API server (which accepts all of them), and reads back the
// NodeResourceTopology objects it writes:
//   - numaNode values no plugin publishes (-1, 2^63-1, a version, a string with a
//     newline and an ANSI escape, a path) are ignored: only node-0 becomes a zone;
//   - a pool whose slices name two nodes gives neither node anything;
//   - a pool that names a device twice (in two slices) is skipped;
//
// and the controller counts each on /metrics.
func TestControllerMalformedSlices(t *testing.T) {
	t.Parallel()
	binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller")
	e := manifestsOnlyEnv(t)
	ctx := context.Background()
	dyn := e.installNRTCRD()

	for _, n := range []string{"hostile", "split-a", "split-b", "dup"} {
		if _, err := e.admin.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	slice := func(name, node, pool string, count int64, devices ...resourceapi.Device) {
		t.Helper()
		s := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driverName,
				NodeName: ptr.To(node),
				Pool:     resourceapi.ResourcePool{Name: pool, Generation: 1, ResourceSliceCount: count},
				Devices:  devices,
			},
		}
		if _, err := e.admin.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the API server refused slice %s, so it is no test of the controller: %v", name, err)
		}
	}
	slice("hostile-0", "hostile", "hostile", 1,
		malformedDevice("gpu-0", resourceapi.DeviceAttribute{IntValue: ptr.To[int64](0)}),
		malformedDevice("gpu-1", resourceapi.DeviceAttribute{IntValue: ptr.To[int64](-1)}),
		malformedDevice("gpu-2", resourceapi.DeviceAttribute{IntValue: ptr.To[int64](1<<63 - 1)}),
		malformedDevice("gpu-3", resourceapi.DeviceAttribute{VersionValue: ptr.To("0.0.0")}),
		malformedDevice("gpu-4", resourceapi.DeviceAttribute{StringValue: ptr.To("1\n\x1b[31mforged")}),
		malformedDevice("gpu-5", resourceapi.DeviceAttribute{StringValue: ptr.To("../../x")}),
	)
	zero := resourceapi.DeviceAttribute{IntValue: ptr.To[int64](0)}
	slice("split-0", "split-a", "split", 2, malformedDevice("gpu-0", zero))
	slice("split-1", "split-b", "split", 2, malformedDevice("gpu-1", zero))
	slice("dup-0", "dup", "dup", 2, malformedDevice("gpu-0", zero))
	slice("dup-1", "dup", "dup", 2, malformedDevice("gpu-0", zero))

	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "controller.kubeconfig")
	if err := harness.ControllerIdentity(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), kubeconfig, time.Hour); err != nil {
		t.Fatal(err)
	}
	ctrl := e.startController("ctrl", kubeconfig)
	eventually(t, time.Minute, ctrl.ready)

	eventually(t, time.Minute, func() error {
		obj, err := e.nrtOf(ctx, dyn, "hostile")
		if err != nil {
			return err
		}
		var zones []string
		for _, z := range obj.Zones {
			zones = append(zones, z.Name)
		}
		sort.Strings(zones)
		if strings.Join(zones, ",") != "node-0" {
			return fmt.Errorf("zones of node hostile: %q, want only node-0", zones)
		}
		return nil
	})
	// Give the controller the time it took for "hostile" to write the others, then
	// check that it did not.
	time.Sleep(3 * time.Second)
	for _, n := range []string{"split-a", "split-b", "dup"} {
		if obj, err := e.nrtOf(ctx, dyn, n); !apierrors.IsNotFound(err) {
			t.Errorf("node %s: want no NodeResourceTopology, got %v (error %v)", n, obj, err)
		}
	}
	m, err := ctrl.metrics()
	if err != nil {
		t.Fatal(err)
	}
	for name, min := range map[string]float64{
		`topodra_controller_invalid_slice_values_total{level="numaNode"}`: 5,
		`topodra_controller_pool_skips_total{reason="nodes_differ"}`:      1,
		`topodra_controller_pool_skips_total{reason="duplicate_devices"}`: 1,
		`topodra_controller_skipped_pools`:                                2,
	} {
		if m[name] < min {
			t.Errorf("%s = %v, want at least %v", name, m[name], min)
		}
	}
}
