package harness

// The kubelet's PodResources API (k8s.io/kubelet/pkg/apis/podresources/v1), opt in:
// ServePodResources serves it for tests of the node agents that read it, such as
// NVIDIA's DCGM exporter, which attributes GPU metrics to pods by it. Nothing else in
// the harness depends on this file.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
)

// PodResourcesSocket is where a kubelet serves the API under its root directory:
// <root>/pod-resources/kubelet.sock (pkg/kubelet: getPodResourcesDir and
// podresources.Socket), the path node agents mount.
func PodResourcesSocket(kubeletRoot string) string {
	return filepath.Join(kubeletRoot, "pod-resources", podresources.Socket+".sock")
}

// ServePodResources serves the PodResources API on the unix socket path with the
// kubelet's own server (podresources.NewV1PodResourcesServer, which answers List and
// Get), over this harness's pods and its DRA manager. The harness runs no device
// plugins and no CPU or memory manager, so those providers report nothing, as a
// kubelet's do with none configured. Call it after Start; the returned stop ends the
// server and removes the socket.
func (h *Harness) ServePodResources(ctx context.Context, path string) (stop func(), err error) {
	if h.manager == nil {
		return nil, errors.New("harness: ServePodResources before Start")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("harness: podresources socket: %w", err)
	}
	providers := podresources.PodResourcesProviders{
		Pods:             harnessPods{h},
		Devices:          noDevices{},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: draResources{h},
	}
	// The kubelet's server also limits the rate (100/s, burst 10); a test's few
	// calls never reach that, so the limiter is left out.
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(klog.NewContext(ctx, h.logger.WithName("podresources")), providers))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return func() {
		srv.Stop()
		<-done
		_ = os.Remove(path)
	}, nil
}

// harnessPods is the kubelet's pod manager's view: the pods bound to this node.
type harnessPods struct{ h *Harness }

func (p harnessPods) GetActivePods() []*v1.Pod { return p.h.activePods() }

func (p harnessPods) GetPods() []*v1.Pod {
	var out []*v1.Pod
	for _, obj := range p.h.podInformer.GetStore().List() {
		out = append(out, obj.(*v1.Pod))
	}
	return out
}

func (p harnessPods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	obj, ok, err := p.h.podInformer.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	return obj.(*v1.Pod), true
}

// draResources turns the DRA manager's claim infos into the API's DynamicResource
// entries the way the kubelet's container manager does (pkg/kubelet/cm,
// container_manager_linux.go, GetDynamicResources, v1.37.2). That conversion lives
// in the container manager, which needs cgroups, so it is redone here; what it reads
// (GetContainerClaimInfos) is the DRA manager's own.
type draResources struct{ h *Harness }

func (d draResources) GetDynamicResources(logger klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesapi.DynamicResource {
	infos, err := d.h.manager.GetContainerClaimInfos(pod, container)
	if err != nil {
		logger.Error(err, "Unable to get container claim info state")
		return []*podresourcesapi.DynamicResource{}
	}
	var out []*podresourcesapi.DynamicResource
	for _, info := range infos {
		var resources []*podresourcesapi.ClaimResource
		for driver, st := range info.DriverState {
			// As in the kubelet, the CDI id list is per driver and grows device by
			// device, so each entry carries the ids of the driver's devices up to
			// its own. Consumers that map by pool and device name (the DCGM
			// exporter) do not read it.
			var cdi []*podresourcesapi.CDIDevice
			for _, dev := range st.Devices {
				for _, id := range dev.CDIDeviceIDs {
					cdi = append(cdi, &podresourcesapi.CDIDevice{Name: id})
				}
				resources = append(resources, &podresourcesapi.ClaimResource{
					CdiDevices: cdi,
					DriverName: driver,
					PoolName:   dev.PoolName,
					DeviceName: dev.DeviceName,
					ShareId:    (*string)(dev.ShareID),
				})
			}
		}
		out = append(out, &podresourcesapi.DynamicResource{
			ClaimName:      info.ClaimName,
			ClaimNamespace: info.Namespace,
			ClaimResources: resources,
		})
	}
	return out
}

// No device plugins: nothing allocated, nothing allocatable.
type noDevices struct{}

func (noDevices) UpdateAllocatedDevices(klog.Logger) {}
func (noDevices) GetDevices(string, string) []*podresourcesapi.ContainerDevices {
	return nil
}
func (noDevices) GetAllocatableDevices(klog.Logger) []*podresourcesapi.ContainerDevices {
	return nil
}

// No CPU manager policy: no exclusive CPUs to report.
type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

// No memory manager policy: no NUMA memory blocks to report.
type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory {
	return nil
}
