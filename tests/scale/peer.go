package main

// The peer waves: the same fleet publishing the slices NVIDIA's GPU kubelet plugin
// published for this node layout in `make bench-node` (docs/benchmarks/
// node-path.slices.json), under the same kube-scheduler, against topodra's own
// slices in the waves just before and just after (A B A, so drift over the run
// shows). All are unconstrained: NVIDIA's attributes name no NUMA node, so an
// aligned request has nothing to match on.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const nvidiaDriverName = "gpu.nvidia.com"

// loadNvidiaSpecs reads the specs NVIDIA's plugin published from a bench-node
// slices file (driver key to specs): the "nvidia-unthrottled" run's, else the
// "nvidia" one's.
func loadNvidiaSpecs(path string) ([]resourcev1.ResourceSliceSpec, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var byDriver map[string][]resourcev1.ResourceSliceSpec
	if err := json.Unmarshal(raw, &byDriver); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, k := range []string{"nvidia-unthrottled", "nvidia"} {
		specs := byDriver[k]
		if len(specs) == 0 {
			continue
		}
		for _, s := range specs {
			if s.Driver != nvidiaDriverName || len(s.Devices) == 0 {
				return nil, fmt.Errorf("%s: %q holds a slice of driver %q with %d devices; want %s devices", path, k, s.Driver, len(s.Devices), nvidiaDriverName)
			}
		}
		return specs, nil
	}
	return nil, fmt.Errorf("%s: no slices of NVIDIA's plugin (keys nvidia-unthrottled, nvidia)", path)
}

// nvidiaFleet replicates the specs over n nodes: node i's copy names node i and a
// pool of its name, as the plugin publishes on each node.
func nvidiaFleet(specs []resourcev1.ResourceSliceSpec, n int) [][]resourcev1.ResourceSlice {
	out := make([][]resourcev1.ResourceSlice, n)
	for i := range out {
		for j, spec := range specs {
			spec = *spec.DeepCopy()
			spec.NodeName = ptr.To(nodeName(i))
			spec.Pool = resourcev1.ResourcePool{Name: nodeName(i), Generation: 1, ResourceSliceCount: int64(len(specs))}
			out[i] = append(out[i], resourcev1.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", nodeName(i), nvidiaDriverName, j)},
				Spec:       spec,
			})
		}
	}
	return out
}

// nvidiaPeerWaves runs unconstrained waves on topodra's slices (`ordered`), on
// NVIDIA's, and on topodra's again, for the sizes of at most 4 GPUs; it returns
// them and the JSON bytes per GPU of NVIDIA's slices. topodra's slices are
// published again when it returns.
func nvidiaPeerWaves(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns string, ordered [][]resourcev1.ResourceSlice) ([]kindResult, float64, error) {
	specs, err := loadNvidiaSpecs(c.nvidiaSlices)
	if err != nil {
		return nil, 0, err
	}
	fleet := nvidiaFleet(specs, c.nodes)
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: nvidiaDriverName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + nvidiaDriverName + `"`},
		}}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, 0, err
	}
	sizes := commonSizes(c.sizes)
	var kinds []kindResult
	phases := []struct{ variant, class string }{
		{"topodra-a", driverName}, {"nvidia", nvidiaDriverName}, {"topodra-b", driverName},
	}
	for _, ph := range phases {
		if ph.class == driverName {
			progress("dra: peer waves on topodra's slices (%s)", ph.variant)
			if err := republishDriver(ctx, cs, nvidiaDriverName, nil); err != nil {
				return kinds, 0, err
			}
			if err := republish(ctx, cs, ordered); err != nil {
				return kinds, 0, err
			}
		} else {
			progress("dra: peer waves on the slices NVIDIA's plugin published (%s)", c.nvidiaSlices)
			if err := republish(ctx, cs, nil); err != nil {
				return kinds, 0, err
			}
			if err := republishDriver(ctx, cs, nvidiaDriverName, fleet); err != nil {
				return kinds, 0, err
			}
		}
		for _, k := range sizes {
			kr, err := classKind(ctx, cs, c, m, ns, ph.class, k, "any", ph.variant, 0)
			if err != nil {
				return kinds, 0, err
			}
			kinds = append(kinds, kr)
		}
	}
	return kinds, sliceBytesPerGPU(fleet[0]), nil
}
