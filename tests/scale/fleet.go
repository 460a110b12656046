package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"topodra.dev/tests/cluster"
)

const driverName = "gpu.topodra.dev"

// gpusPerNode is the DGX H100 layout of the fleet: 8 GPUs, 4 on each of 2 NUMA nodes.
const gpusPerNode = 8

func nodeName(i int) string { return fmt.Sprintf("kwok-gpu-%04d", i) }

// createNodes registers n kwok nodes. With gpus, each also reports nvidia.com/gpu
// capacity as the device plugin would; the DRA fleet reports none.
func createNodes(ctx context.Context, cs kubernetes.Interface, n int, gpus bool) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("224"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("1000"),
	}
	if gpus {
		capacity["nvidia.com/gpu"] = *resource.NewQuantity(gpusPerNode, resource.DecimalSI)
	}
	return parallel(n, 8, func(i int) error {
		name := nodeName(i)
		_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Annotations: map[string]string{cluster.KwokNodeAnnotation: "fake"},
				Labels:      map[string]string{"kubernetes.io/hostname": name, "type": "kwok"},
			},
			Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
		}, metav1.CreateOptions{})
		return err
	})
}

// simulatedSlices returns each node's ResourceSlices as topodra's own slice builder
// makes them for the simulated DGX H100 (`topodra-kubelet-plugin discover -o json`
// against the fake NVML and hwloc topology of the dgx-h100 profile).
func simulatedSlices(plugin string, simFlags []string, n int, numaFormat string) ([][]resourcev1.ResourceSlice, error) {
	out := make([][]resourcev1.ResourceSlice, n)
	err := parallel(n, 2, func(i int) error {
		args := append([]string{"discover", "-o", "json", "--node-name", nodeName(i), "--numa-node-format", numaFormat}, simFlags...)
		raw, err := exec.Command(plugin, args...).Output()
		if err != nil {
			return fmt.Errorf("discover for %s: %w", nodeName(i), err)
		}
		var list struct {
			Items []resourcev1.ResourceSlice `json:"items"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("discover output for %s: %w", nodeName(i), err)
		}
		out[i] = list.Items
		return nil
	})
	return out, err
}

// simFlags runs topodra-sim-node for the profile and returns the plugin flags it
// prints: those `discover` takes, and all of them for `serve`.
func simFlags(simNode, profile, dir string) (discover, serve []string, err error) {
	raw, err := exec.Command(simNode, profile, dir).Output()
	if err != nil {
		return nil, nil, fmt.Errorf("topodra-sim-node %s: %w", profile, err)
	}
	serve = strings.Fields(string(raw))
	for _, f := range serve {
		if strings.HasPrefix(f, "--nvml-lib=") || strings.HasPrefix(f, "--hwloc-xml=") {
			discover = append(discover, f)
		}
	}
	return discover, serve, nil
}

// shuffled returns the slices with each slice's devices in a random order: what
// the scheduler would see from a driver that does not order its devices.
func shuffled(slices [][]resourcev1.ResourceSlice, seed uint64) [][]resourcev1.ResourceSlice {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([][]resourcev1.ResourceSlice, len(slices))
	for i, node := range slices {
		for _, s := range node {
			s = *s.DeepCopy()
			r.Shuffle(len(s.Spec.Devices), func(a, b int) { s.Spec.Devices[a], s.Spec.Devices[b] = s.Spec.Devices[b], s.Spec.Devices[a] })
			out[i] = append(out[i], s)
		}
	}
	return out
}

func publishSlices(ctx context.Context, cs kubernetes.Interface, slices [][]resourcev1.ResourceSlice) error {
	return parallel(len(slices), 8, func(i int) error {
		for _, s := range slices[i] {
			s := s
			s.ResourceVersion = ""
			if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("slice %s: %w", s.Name, err)
			}
		}
		return nil
	})
}

// nvidiaEquivalent is the same GPU as NVIDIA's DRA driver for GPUs publishes a full
// GPU today (its kubelet plugin's device announcement): type, uuid, productName,
// brand, architecture, cudaComputeCapability, driverVersion, cudaDriverVersion, the
// PCI address twice (pcieBusID in its domain and the standard
// resource.kubernetes.io/pciBusID), resource.kubernetes.io/pcieRoot, and capacity
// memory; the values are ours. Labels are left off: the figure compares devices.
// Give it slices of `discover --attributes=full`: the lean default lacks brand,
// architecture and cudaDriverVersion.
func nvidiaEquivalent(s resourcev1.ResourceSlice) resourcev1.ResourceSlice {
	keep := map[resourcev1.QualifiedName]bool{
		"type": true, "uuid": true, "productName": true, "brand": true, "architecture": true,
		"cudaComputeCapability": true, "driverVersion": true, "cudaDriverVersion": true,
		"resource.kubernetes.io/pciBusID": true, "resource.kubernetes.io/pcieRoot": true,
	}
	s = *s.DeepCopy()
	s.Labels = nil
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		for k := range d.Attributes {
			if !keep[k] {
				delete(d.Attributes, k)
			}
		}
		if bus, ok := d.Attributes["resource.kubernetes.io/pciBusID"]; ok {
			d.Attributes["pcieBusID"] = bus
		}
		for k := range d.Capacity {
			if k != "memory" {
				delete(d.Capacity, k)
			}
		}
	}
	return s
}

// sliceBytesPerGPU is the JSON size of the slices' specs per device.
func sliceBytesPerGPU(slices []resourcev1.ResourceSlice) float64 {
	var bytes, devices int
	for _, s := range slices {
		b, _ := json.Marshal(s.Spec)
		bytes += len(b)
		devices += len(s.Spec.Devices)
	}
	if devices == 0 {
		return 0
	}
	return float64(bytes) / float64(devices)
}

// parallel runs f(0..n-1) on `workers` goroutines and returns the first error.
func parallel(n, workers int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if first != nil || next >= n {
					mu.Unlock()
					return
				}
				i := next
				next++
				mu.Unlock()
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}
