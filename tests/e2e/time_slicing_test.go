package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// shareTemplate is a claim template for one share of a time-sliced GPU with
// `memory` of it (none: the device's default share).
func shareTemplate(ns, name, memory string) string {
	var requests []string
	if memory != "" {
		requests = append(requests, "memory: "+memory)
	}
	return classTemplate(ns, name, "time-sliced.topodra.dev", requests...)
}

// classTemplate is a claim template for one device of `class`, with the capacity
// requests given as "name: value" lines.
func classTemplate(ns, name, class string, requests ...string) string {
	capacity := ""
	if len(requests) > 0 {
		capacity = "            capacity:\n              requests:\n"
		for _, r := range requests {
			capacity += "                " + r + "\n"
		}
	}
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: %s
  namespace: %s
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: %s
%s`, name, ns, class, capacity)
}

// smiCalls is what the simulated driver root's nvidia-smi was told, one call a
// line (tests/fake-nvml's stand-in, driver_root::NVIDIA_SMI_CALLS).
func (e *env) smiCalls() []string {
	e.t.Helper()
	var root string
	for _, a := range e.args {
		if v, ok := strings.CutPrefix(a, "--driver-root="); ok {
			root = v
		}
	}
	if root == "" {
		e.t.Fatalf("no --driver-root in the plugin's flags: %v", e.args)
	}
	b, err := os.ReadFile(filepath.Join(root, "var/log/nvidia-smi.calls"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(b)), " ", "_"))
}

// injectedEnv is the environment the pod's container got from its CDI devices.
func injectedEnv(t *testing.T, e *env, pod *v1.Pod) []string {
	t.Helper()
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Containers[0].Env
}

// TestTimeSlicing: an L40S node (eight GPUs of 46068 MiB, no MIG) with the plugin's
// --time-slicing at the Long interval, and the real 1.37.2 scheduler. Each GPU
// publishes a time-sliced device beside its exclusive one. Pods in two namespaces
// share one GPU, each with its own memory share in its environment; the first
// share sets the GPU's interval through the driver root's nvidia-smi and the last
// one's unprepare resets it. While the GPU is shared, a claim for all eight GPUs
// whole waits (the scheduler's counters keep a GPU and its shares apart), and a
// share bigger than a GPU waits with an Event. A pod written for the device
// plugin's time-slicing (`nvidia.com/gpu.shared: 1`) gets a default share.
func TestTimeSlicing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "l40s-pcie", pluginArgs: []string{"--time-slicing", "--time-slice-interval=Long"}})
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(16, 2*time.Minute)
	ts, ok := devices["gpu-0-ts"]
	if !ok {
		t.Fatalf("no gpu-0-ts among %d devices", len(devices))
	}
	if ts.AllowMultipleAllocations == nil || !*ts.AllowMultipleAllocations {
		t.Errorf("gpu-0-ts does not allow multiple allocations")
	}
	if got := attrValues(ts, "sharing"); !slices.Equal(got, []string{"TimeSlicing"}) {
		t.Errorf("gpu-0-ts sharing %v", got)
	}
	if got := attrValues(ts, "timeSliceInterval"); !slices.Equal(got, []string{"Long"}) {
		t.Errorf("gpu-0-ts timeSliceInterval %v", got)
	}
	mem := ts.Capacity["memory"]
	if mem.RequestPolicy == nil || mem.RequestPolicy.Default == nil || mem.RequestPolicy.Default.String() != "11Gi" {
		t.Errorf("gpu-0-ts memory capacity %+v, want a request policy defaulting to 11Gi (46068 MiB / 4)", mem)
	}

	var pods []*v1.Pod
	for _, ns := range []string{"team-a", "team-b"} {
		e.createNamespace(ns)
		e.kubectlApply(shareTemplate(ns, "share-20", "20Gi"))
		e.createPod(ns, "share", "share-20")
	}
	var shared []string
	for _, ns := range []string{"team-a", "team-b"} {
		pod := e.waitPodRunning(ns, "share", 2*time.Minute)
		pods = append(pods, pod)
		claim, devs := e.allocation(pod)
		if len(devs) != 1 || !strings.HasSuffix(devs[0], "-ts") {
			t.Fatalf("%s/share got %v, want one time-sliced device", ns, devs)
		}
		r := claim.Status.Allocation.Devices.Results[0]
		if r.ShareID == nil {
			t.Errorf("%s/share: allocation has no shareID", ns)
		}
		if q := r.ConsumedCapacity["memory"]; q.String() != "20Gi" {
			t.Errorf("%s/share consumed %v of memory, want 20Gi", ns, r.ConsumedCapacity)
		}
		shared = append(shared, devs[0])
		env := injectedEnv(t, e, pod)
		for _, want := range []string{"TOPODRA_SHARING=TimeSlicing", "TOPODRA_TIME_SLICE_INTERVAL=Long",
			"TOPODRA_GPU_MEMORY_SHARE=21474836480", "TOPODRA_GPU_MEMORY_SHARE_ENFORCED=false"} {
			if !slices.Contains(env, want) {
				t.Errorf("%s/share: env %v lacks %s", ns, env, want)
			}
		}
	}
	if shared[0] != shared[1] {
		t.Errorf("the two shares went to %v, want one GPU", shared)
	}
	gpu := strings.TrimSuffix(shared[0], "-ts")
	uuid := strings.Join(attrValues(devices[gpu], "uuid"), "")
	t.Logf("two namespaces share %s (%s)", shared[0], uuid)
	setLong := "compute-policy_-i_" + uuid + "_--set-timeslice_3"
	if got := e.smiCalls(); !slices.Equal(got, []string{setLong}) {
		t.Errorf("nvidia-smi was told %v, want the interval set once: %s", got, setLong)
	}

	// All eight GPUs whole: one of them is shared, so the claim waits.
	e.kubectlApply(claimSpec{ns: "team-a", name: "all-eight", count: 8}.yaml())
	e.createPod("team-a", "all-eight", "all-eight")
	msg := e.waitEvent("team-a", "all-eight", "FailedScheduling", regexp.MustCompile(`.`), 2*time.Minute)
	t.Logf("all-eight FailedScheduling: %s", msg)

	// A share larger than any GPU waits with an Event too.
	e.kubectlApply(shareTemplate("team-b", "share-50", "50Gi"))
	e.createPod("team-b", "too-big", "share-50")
	msg = e.waitEvent("team-b", "too-big", "FailedScheduling", regexp.MustCompile(`.`), 2*time.Minute)
	t.Logf("too-big FailedScheduling: %s", msg)

	// The device plugin's time-slicing resource name, mapped by the chart value
	// deviceClass.timeSliced.extendedResourceName: one default-sized share.
	rendered := helmTemplate(t, t.TempDir(), "--set", "deviceClass.timeSliced.extendedResourceName=nvidia.com/gpu.shared")
	e.kubectlApply(manifestDoc(t, rendered, "DeviceClass"))
	e.createExtendedPod("team-b", "by-resource", "nvidia.com/gpu.shared", 1)
	byResource := e.waitPodRunning("team-b", "by-resource", 2*time.Minute)
	claim, devs := e.extendedClaim(byResource)
	if len(devs) != 1 || !strings.HasSuffix(devs[0], "-ts") {
		t.Errorf("nvidia.com/gpu.shared: 1 got %v, want one time-sliced device", devs)
	} else if q := claim.Status.Allocation.Devices.Results[0].ConsumedCapacity["memory"]; q.String() != "11Gi" {
		t.Errorf("nvidia.com/gpu.shared: 1 consumed %v, want the default 11Gi", q.String())
	}
	t.Logf("nvidia.com/gpu.shared: 1 got %v", devs)

	// The last share of the GPU resets its interval; the whole-GPU claim then fits
	// once nothing else shares a GPU.
	for _, p := range append(pods, byResource) {
		e.deletePods(p.Namespace, p.Name)
	}
	eventually(t, time.Minute, func() error {
		calls := e.smiCalls()
		if !slices.Contains(calls, "compute-policy_-i_"+uuid+"_--set-timeslice_0") {
			return fmt.Errorf("nvidia-smi was told %v; no reset of %s", calls, uuid)
		}
		return nil
	})
	e.waitPodRunning("team-a", "all-eight", 2*time.Minute)
	t.Logf("nvidia-smi was told %v", e.smiCalls())
}
