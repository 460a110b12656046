package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/cpuset"

	"topodra.dev/tests/e2e/harness"
)

// The alias under which released CPU drivers (dra-driver-cpu v0.2.0) publish their
// NUMA node, and which our plugin also publishes with --numa-node-aliases.
const numaAlias = "dra.net/numaNode"

// waitingForCPUs is what the controller's WaitingForGPUs message says about the CPU
// half of a pending claim of gpusAndCPUs ("needs 4 GPUs and 32 CPUs on one NUMA
// node; ..."); only this part is asserted, so the wording around it may change.
const waitingForCPUs = "32 CPUs"

// gpusAndCPUs is a claim template for 4 GPUs and 32 CPUs of one NUMA node: one
// matchAttribute on the alias across both requests, the CPUs from the CPU driver's
// per-NUMA-node device by consumable capacity.
func gpusAndCPUs(ns string) string {
	return `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpus-and-cpus
  namespace: ` + ns + `
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: gpu.topodra.dev
            allocationMode: ExactCount
            count: 4
        - name: cpus
          exactly:
            deviceClassName: ` + cpuDriverName + `
            capacity:
              requests:
                ` + cpuDriverName + `/cpu: "32"
      constraints:
        - requests: [gpus, cpus]
          matchAttribute: ` + numaAlias + `
`
}

// TestDGXH100WholeNodeNUMA: GPUs aligned with CPUs from the real CPU driver
// (kubernetes-sigs dra-driver-cpu v0.2.0) on one simulated DGX H100 (2 NUMA nodes,
// 4 GPUs and 112 CPUs each), with the real scheduler, our plugin publishing its NUMA
// node also under dra.net/numaNode, the controller, and the harness as kubelet and
// as the runtime end of NRI (where the CPU driver sets each container's cpuset).
func TestDGXH100WholeNodeNUMA(t *testing.T) {
	t.Parallel()
	dracpu := needCPUDriver(t)
	binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller")
	e := newEnv(t, envOptions{profile: "dgx-h100", cpuDriver: true, pluginArgs: []string{"--numa-node-aliases=" + numaAlias}})
	ctx := context.Background()
	dyn := e.installNRTCRD()
	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "controller.kubeconfig")
	if err := harness.ControllerIdentity(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), kubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	// The controller knows the alias too (the chart passes the plugin's list).
	e.startController("ctrl", kubeconfig, "--numa-node-aliases="+numaAlias)
	e.startCPUDriver(dracpu)

	e.waitRegistered(2 * time.Minute)
	regCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	ep, err := e.h.WaitRegistered(regCtx, cpuDriverName)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dracpu registered through the kubelet's plugin manager, DRA endpoint %s", ep)
	gpus := e.waitDevices(8, time.Minute)
	cpus := e.cpuDevices(2, time.Minute)
	// One CPU device per NUMA node, with the node's 112 CPUs as capacity and the
	// alias we align on.
	cpuNUMA := map[string]int64{}
	for name, d := range cpus {
		n, ok := d.Attributes[numaAlias]
		if !ok || n.IntValue == nil {
			t.Fatalf("CPU device %s has no int %s: %+v", name, numaAlias, d.Attributes)
		}
		cpuNUMA[name] = *n.IntValue
		if c := d.Capacity[cpuDriverName+"/cpu"].Value; c.Value() != 112 {
			t.Errorf("CPU device %s: capacity %s/cpu %s, want 112", name, cpuDriverName, c.String())
		}
	}
	for name, d := range gpus {
		a, ok := d.Attributes[numaAlias]
		if !ok || a.IntValue == nil || *a.IntValue != numaOf(t, d) {
			t.Fatalf("GPU %s: %s %+v, want its numaNode %d", name, numaAlias, a, numaOf(t, d))
		}
	}

	const ns = "whole-node"
	e.createNamespace(ns)
	e.kubectlApply(gpusAndCPUs(ns))

	// check verifies a running pod: its claim's GPUs and CPUs on one NUMA node, the
	// CDI edits of both drivers in its record, and the cpuset the CPU driver set
	// through NRI; it returns the NUMA node.
	check := func(t *testing.T, name string) int64 {
		t.Helper()
		pod := e.waitPodRunning(ns, name, 2*time.Minute)
		claim := claimOf(t, e, pod)
		var numa []int64
		var minors []string
		var consumed string
		for _, r := range claim.Status.Allocation.Devices.Results {
			switch {
			case r.Driver == driverName && r.Request == "gpus":
				numa = append(numa, numaOf(t, gpus[r.Device]))
				minors = append(minors, fmt.Sprintf("/dev/nvidia%d", minorOf(r.Device)))
			case r.Driver == cpuDriverName && r.Request == "cpus":
				numa = append(numa, cpuNUMA[r.Device])
				q := r.ConsumedCapacity[cpuDriverName+"/cpu"]
				consumed = q.String()
			default:
				t.Fatalf("claim %s: unexpected result %+v", claim.Name, r)
			}
		}
		if len(numa) != 5 || slices.Min(numa) != slices.Max(numa) {
			t.Fatalf("claim %s: NUMA nodes of 4 GPUs and the CPUs %v, want one", claim.Name, numa)
		}
		if consumed != "32" {
			t.Errorf("claim %s: consumed %s/cpu %q, want 32", claim.Name, cpuDriverName, consumed)
		}
		n := numa[0]
		rec, err := readRecord(e, pod)
		if err != nil {
			t.Fatal(err)
		}
		inj := rec.Containers[0]
		for _, m := range minors {
			if !slices.Contains(inj.DeviceNodes, m) {
				t.Errorf("%s: device nodes %v lack %s", name, inj.DeviceNodes, m)
			}
		}
		if want := fmt.Sprintf("TOPODRA_NUMA_NODES=%d", n); !slices.Contains(inj.Env, want) {
			t.Errorf("%s: env %v lacks %s", name, inj.Env, want)
		}
		prefix := fmt.Sprintf("DRA_CPUSET_%s=", claim.UID)
		i := slices.IndexFunc(inj.Env, func(s string) bool { return strings.HasPrefix(s, prefix) })
		if i < 0 {
			t.Fatalf("%s: env %v lacks the CPU driver's %s...", name, inj.Env, prefix)
		}
		fromCDI := strings.TrimPrefix(inj.Env[i], prefix)
		if inj.CPUSetCPUs != fromCDI {
			t.Errorf("%s: cpuset %q from NRI, %q from the CDI env", name, inj.CPUSetCPUs, fromCDI)
		}
		got, err := cpuset.Parse(inj.CPUSetCPUs)
		if err != nil {
			t.Fatalf("%s: cpuset %q: %v", name, inj.CPUSetCPUs, err)
		}
		nodeCPUs := nodeCPUList(t, e, n)
		if got.Size() != 32 || !got.IsSubsetOf(nodeCPUs) {
			t.Errorf("%s: cpuset %s (%d CPUs), want 32 of NUMA node %d's %s", name, got, got.Size(), n, nodeCPUs)
		}
		// v0.2.0 sets linux.resources.cpu.cpus only: memory is not pinned to the
		// node by the CPU driver (the GPU claim's TOPODRA_NUMA_NODES says where).
		if inj.CPUSetMems != "" && inj.CPUSetMems != fmt.Sprint(n) {
			t.Errorf("%s: cpuset mems %q, want %d", name, inj.CPUSetMems, n)
		}
		t.Logf("%s: NUMA node %d: GPUs %v, cpuset cpus %s (mems %q)", name, n, minors, inj.CPUSetCPUs, inj.CPUSetMems)
		return n
	}

	var numaA int64
	t.Run("aligned pods fill both NUMA nodes", func(t *testing.T) {
		e.t = t
		e.createPod(ns, "pod-a", "gpus-and-cpus")
		e.createPod(ns, "pod-b", "gpus-and-cpus")
		numaA = check(t, "pod-a")
		if numaB := check(t, "pod-b"); numaB == numaA {
			t.Fatalf("both pods on NUMA node %d", numaA)
		}
		// A container without CPU claims (the plugin's own pod object, which the
		// harness runs too) gets the shared CPUs, and the CPU driver's updates take
		// out each guaranteed set: all CPUs but pod-a's and pod-b's.
		all := nodeCPUList(t, e, 0).Union(nodeCPUList(t, e, 1))
		for _, name := range []string{"pod-a", "pod-b"} {
			rec, err := readRecord(e, e.waitPodRunning(ns, name, time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			held, err := cpuset.Parse(rec.Containers[0].CPUSetCPUs)
			if err != nil {
				t.Fatal(err)
			}
			all = all.Difference(held)
		}
		eventually(t, 30*time.Second, func() error {
			p, err := e.admin.CoreV1().Pods(harness.PluginNamespace).Get(ctx, "topodra-kubelet-plugin-"+e.node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			rec, err := readRecord(e, p)
			if err != nil {
				return err
			}
			if got := rec.Containers[0].CPUSetCPUs; got != all.String() {
				return fmt.Errorf("the plugin pod's cpuset is %q, want the shared CPUs %s", got, all)
			}
			return nil
		})
	})

	t.Run("a third pod waits with the controller's reason, then runs", func(t *testing.T) {
		e.t = t
		e.createPod(ns, "pod-c", "gpus-and-cpus")
		msg := e.waitEvent(ns, "pod-c", "WaitingForGPUs", regexp.MustCompile(regexp.QuoteMeta(waitingForCPUs)), 2*time.Minute)
		t.Logf("pod-c WaitingForGPUs: %s", msg)
		if p, err := e.admin.CoreV1().Pods(ns).Get(ctx, "pod-c", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
			t.Fatalf("pod-c: %v, node %q; want unscheduled", err, p.Spec.NodeName)
		}
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "pod-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "pod-a", time.Minute)
		if n := check(t, "pod-c"); n != numaA {
			t.Errorf("pod-c on NUMA node %d, want pod-a's %d", n, numaA)
		}
	})

	t.Run("NodeResourceTopology lists GPUs and CPUs per zone", func(t *testing.T) {
		e.t = t
		// pod-b and pod-c hold 4 GPUs and 32 CPUs of each NUMA node.
		want := map[string]map[string][2]int64{
			"node-0": {"nvidia.com/gpu": {4, 0}, "cpu": {112, 80}},
			"node-1": {"nvidia.com/gpu": {4, 0}, "cpu": {112, 80}},
		}
		eventually(t, time.Minute, func() error {
			obj, err := e.nrtOf(ctx, dyn, e.node)
			if err != nil {
				return err
			}
			got := map[string]map[string][2]int64{}
			for _, z := range obj.Zones {
				got[z.Name] = map[string][2]int64{}
				for _, r := range z.Resources {
					got[z.Name][r.Name] = [2]int64{r.Capacity.Value(), r.Available.Value()}
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("zones (capacity, available) %v, want %v", got, want)
			}
			return nil
		})
	})

	t.Run("without the alias the same claim cannot be aligned", func(t *testing.T) {
		e.t = t
		for _, name := range []string{"pod-b", "pod-c"} {
			if err := e.admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"pod-b", "pod-c"} {
			e.waitPodGone(ns, name, time.Minute)
		}
		e.plugin.stop(t)
		e.args = slices.DeleteFunc(e.args, func(a string) bool { return strings.HasPrefix(a, "--numa-node-aliases=") })
		e.plugin = e.startPlugin(e.pluginKubeconfig)
		eventually(t, time.Minute, func() error {
			for name, d := range e.waitDevices(8, time.Minute) {
				if _, ok := d.Attributes[numaAlias]; ok {
					return fmt.Errorf("GPU %s still has %s", name, numaAlias)
				}
			}
			return nil
		})
		// Every GPU and CPU is free, but no GPU has the attribute the constraint
		// names, so no GPU can be in the claim.
		e.createPod(ns, "pod-d", "gpus-and-cpus")
		msg := e.waitEvent(ns, "pod-d", "FailedScheduling", regexp.MustCompile(`.`), 2*time.Minute)
		t.Logf("pod-d FailedScheduling: %s", msg)
		if !strings.Contains(msg, "claim") {
			t.Errorf("FailedScheduling of pod-d does not mention the claim: %s", msg)
		}
		if p, err := e.admin.CoreV1().Pods(ns).Get(ctx, "pod-d", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" || p.Status.Phase != v1.PodPending {
			t.Fatalf("pod-d: %v, node %q, phase %s; want Pending and unscheduled", err, p.Spec.NodeName, p.Status.Phase)
		}
	})
}

// claimOf is the allocated claim of a pod's "gpus" pod claim (createPod's name).
func claimOf(t *testing.T, e *env, pod *v1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name != "gpus" || s.ResourceClaimName == nil {
			continue
		}
		c, err := e.admin.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), *s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation == nil {
			t.Fatalf("claim %s not allocated", c.Name)
		}
		return c
	}
	t.Fatalf("pod %s has no generated claim: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	return nil
}

// nodeCPUList is a NUMA node's CPUs in the simulated node's sysfs.
func nodeCPUList(t *testing.T, e *env, n int64) cpuset.CPUSet {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.cpuHostRoot, "sys", "devices", "system", "node", fmt.Sprintf("node%d", n), "cpulist"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := cpuset.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
