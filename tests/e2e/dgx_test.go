package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"topodra.dev/tests/e2e/harness"
)

func listInts(a resourceapi.DeviceAttribute) []int64 { return a.IntValues }

// TestDGXH100 runs the Show list on one simulated DGX H100 node (8 GPUs, 4 on each
// of 2 NUMA nodes) with the real control plane, the kubelet's plugin manager and DRA
// manager, and the real plugin binary. The steps share the cluster and depend on
// each other, in order.
func TestDGXH100(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100"})
	ctx := context.Background()

	var devices map[string]resourceapi.Device
	t.Run("registration and slices", func(t *testing.T) {
		e.t = t
		e.waitRegistered(2 * time.Minute)
		devices = e.waitDevices(8, time.Minute)
		checkAttributes(t, devices)

		// Slices are owned by the Node (garbage-collected with it).
		for _, s := range e.slices(ctx) {
			if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].Name != e.node {
				t.Errorf("slice %s: owner references %+v, want the Node %s", s.Name, s.OwnerReferences, e.node)
			}
		}

		out, err := e.c.Kubectl(ctx, "describe", "resourceslice")
		if err != nil {
			t.Fatal(err)
		}
		desc := string(out)
		t.Logf("kubectl describe resourceslice (head):\n%s", head(desc, 60))
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^Name:\s+\S+`),
			regexp.MustCompile(`(?m)^\s+Driver:\s+gpu\.topodra\.dev$`),
			regexp.MustCompile(`(?m)^\s+Node Name:\s+` + e.node + `$`),
			regexp.MustCompile(`(?m)^\s+Name:\s+gpu-0$`),
			regexp.MustCompile(`resource\.kubernetes\.io/numaNode:`),
			regexp.MustCompile(`(?m)^\s+Product Name:\n\s+String:\s+NVIDIA H100 80GB HBM3$`),
			regexp.MustCompile(`(?m)^\s+Cuda Compute Capability:\n\s+Version:\s+9\.0\.0$`),
			regexp.MustCompile(`(?m)^\s+resource\.kubernetes\.io/numaNode:\n\s+Int:\s+[01]$`),
			regexp.MustCompile(`(?m)^\s+Memory:\n\s+Value:\s+81559Mi$`),
			regexp.MustCompile(`(?m)^\s+Kind:\s+Node$`),
		} {
			if !want.MatchString(desc) {
				t.Errorf("kubectl describe resourceslice: no match for %q", want)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	// Two pods of four GPUs with matchAttribute numaNode fill both NUMA nodes; a
	// third stays Pending with the scheduler's reason.
	const ns = "numa"
	e.t = t
	e.createNamespace(ns)
	tmpl := strings.Replace(manifestDoc(t, filepath.Join(repoRoot(t), "deploy", "examples", "01-four-gpus-one-numa-node.yaml"), "ResourceClaimTemplate"),
		"metadata:\n", "metadata:\n  namespace: "+ns+"\n", 1)
	e.kubectlApply(tmpl)

	type placed struct {
		claim *resourceapi.ResourceClaim
		devs  []string
		numa  int64
	}
	got := map[string]placed{}
	t.Run("numaNode matchAttribute fills both NUMA nodes", func(t *testing.T) {
		e.t = t
		for _, name := range []string{"four-a", "four-b"} {
			e.createPod(ns, name, "four-gpus-one-numa-node")
		}
		for _, name := range []string{"four-a", "four-b"} {
			pod := e.waitPodRunning(ns, name, 2*time.Minute)
			claim, devs := e.allocation(pod)
			if len(devs) != 4 {
				t.Fatalf("pod %s got %v, want 4 GPUs", name, devs)
			}
			numas := map[int64]bool{}
			for _, d := range devs {
				numas[numaOf(t, devices[d])] = true
			}
			if len(numas) != 1 {
				t.Fatalf("pod %s: GPUs %v span NUMA nodes %v", name, devs, numas)
			}
			var n int64
			for k := range numas {
				n = k
			}
			got[name] = placed{claim, devs, n}
			t.Logf("pod %s: claim %s got %v on NUMA node %d", name, claim.Name, devs, n)
		}
		if got["four-a"].numa == got["four-b"].numa {
			t.Fatalf("both pods on NUMA node %d", got["four-a"].numa)
		}
		all := append(slices.Clone(got["four-a"].devs), got["four-b"].devs...)
		sort.Strings(all)
		if len(slices.Compact(all)) != 8 {
			t.Fatalf("the two pods share GPUs: %v", all)
		}

		e.createPod(ns, "four-c", "four-gpus-one-numa-node")
		msg := e.waitEvent(ns, "four-c", "FailedScheduling", regexp.MustCompile(`.`), 2*time.Minute)
		t.Logf("four-c FailedScheduling: %s", msg)
		if !strings.Contains(msg, "cannot allocate all claims") && !strings.Contains(msg, "resourceclaim") && !strings.Contains(msg, "claim") {
			t.Errorf("FailedScheduling of four-c does not mention the claims: %s", msg)
		}
		p, err := e.admin.CoreV1().Pods(ns).Get(ctx, "four-c", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" || p.Status.Phase != "Pending" {
			t.Fatalf("four-c: node %q phase %s, want Pending and unscheduled", p.Spec.NodeName, p.Status.Phase)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("CDI injection holds exactly the allocated GPUs, unprepare removes the spec", func(t *testing.T) {
		e.t = t
		pa := got["four-a"]
		pod, err := e.admin.CoreV1().Pods(ns).Get(ctx, "four-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := harness.ReadRecord(e.h.RecordPath(ns, "four-a", pod.UID))
		if err != nil {
			t.Fatalf("injection record: %v", err)
		}
		if len(rec.Containers) != 1 {
			t.Fatalf("record: %+v", rec)
		}
		inj := rec.Containers[0]
		t.Logf("injected into four-a: devices %v, %d mounts, env %v", inj.DeviceNodes, len(inj.Mounts), inj.Env)
		gpuNode := regexp.MustCompile(`^/dev/nvidia(\d+)$`)
		var gotGPUs, wantGPUs []string
		for _, p := range inj.DeviceNodes {
			if gpuNode.MatchString(p) {
				gotGPUs = append(gotGPUs, p)
			}
		}
		for _, d := range pa.devs {
			wantGPUs = append(wantGPUs, fmt.Sprintf("/dev/nvidia%d", minorOf(d)))
		}
		sort.Strings(gotGPUs)
		sort.Strings(wantGPUs)
		if !slices.Equal(gotGPUs, wantGPUs) {
			t.Errorf("GPU device nodes injected %v, want exactly %v (all nodes: %v)", gotGPUs, wantGPUs, inj.DeviceNodes)
		}
		for _, want := range []string{"/dev/nvidiactl"} {
			if !slices.Contains(inj.DeviceNodes, want) {
				t.Errorf("no %s in %v", want, inj.DeviceNodes)
			}
		}
		wantEnv := fmt.Sprintf("TOPODRA_NUMA_NODES=%d", pa.numa)
		if !slices.Contains(inj.Env, wantEnv) {
			t.Errorf("env %v lacks %s", inj.Env, wantEnv)
		}
		if !slices.ContainsFunc(inj.Env, func(s string) bool { return strings.HasPrefix(s, "TOPODRA_CPUS=") }) {
			t.Errorf("env %v lacks TOPODRA_CPUS", inj.Env)
		}
		spec := filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_"+string(pa.claim.UID)+".json")
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("CDI spec of the claim: %v", err)
		}

		// Delete: the harness unprepares (the plugin removes the spec), then
		// finalises the pod; the freed NUMA node goes to the pending pod.
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "four-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "four-a", time.Minute)
		if _, err := os.Stat(spec); !os.IsNotExist(err) {
			t.Errorf("CDI spec %s still there after unprepare (%v)", spec, err)
		}
		if _, err := os.Stat(e.h.RecordPath(ns, "four-a", pod.UID)); !os.IsNotExist(err) {
			t.Errorf("injection record still there after unprepare")
		}
		pc := e.waitPodRunning(ns, "four-c", 2*time.Minute)
		_, devs := e.allocation(pc)
		numa := numaOf(t, devices[devs[0]])
		if numa != pa.numa {
			t.Errorf("four-c got NUMA node %d, want the freed %d", numa, pa.numa)
		}
		t.Logf("four-c scheduled after four-a was deleted: %v on NUMA node %d", devs, numa)
	})
}

// checkAttributes asserts the attributes of docs/attributes.md on a DGX H100, with
// the plugin's default (lean) attribute set.
func checkAttributes(t *testing.T, devices map[string]resourceapi.Device) {
	t.Helper()
	perNUMA := map[int64]int{}
	for name, d := range devices {
		if !regexp.MustCompile(`^gpu-\d+$`).MatchString(name) {
			t.Errorf("device name %q, want gpu-<minor>", name)
		}
		for _, a := range []struct {
			name, kind string
		}{
			{"resource.kubernetes.io/numaNode", "int"},
			{"resource.kubernetes.io/pcieRoot", "string"},
			{"resource.kubernetes.io/pciBusID", "string"},
			{"type", "string"}, {"uuid", "string"}, {"minor", "int"},
			{"productName", "string"}, {"cudaComputeCapability", "version"}, {"driverVersion", "version"},
			{"socket", "int"}, {"nvlinkDomain", "string"},
		} {
			v, ok := attr(d, a.name)
			if !ok {
				t.Errorf("%s: no attribute %s", name, a.name)
				continue
			}
			okKind := map[string]bool{"int": v.IntValue != nil, "string": v.StringValue != nil, "version": v.VersionValue != nil}[a.kind]
			if !okKind {
				t.Errorf("%s: attribute %s = %+v, want a %s", name, a.name, v, a.kind)
			}
		}
		if _, ok := attr(d, "index"); ok {
			t.Errorf("%s: publishes index, which NVML does not keep stable", name)
		}
		// Only --attributes=full publishes these: each follows from one above.
		for _, full := range []string{"brand", "architecture", "cudaDriverVersion"} {
			if _, ok := attr(d, full); ok {
				t.Errorf("%s: publishes %s by default, which only --attributes=full should", name, full)
			}
		}
		if v, _ := attr(d, "type"); v.StringValue == nil || *v.StringValue != "gpu" {
			t.Errorf("%s: type %+v", name, v)
		}
		if v, _ := attr(d, "minor"); v.IntValue == nil || fmt.Sprintf("gpu-%d", *v.IntValue) != name {
			t.Errorf("%s: minor %+v", name, v)
		}
		if v, _ := attr(d, "resource.kubernetes.io/pciBusID"); v.StringValue == nil ||
			!regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`).MatchString(*v.StringValue) {
			t.Errorf("%s: pciBusID %+v", name, v)
		}
		if v, _ := attr(d, "productName"); v.StringValue == nil || !strings.HasPrefix(*v.StringValue, "NVIDIA H100") {
			t.Errorf("%s: productName %+v", name, v)
		}
		if _, ok := d.Capacity["memory"]; !ok {
			if _, ok := d.Capacity[driverName+"/memory"]; !ok {
				t.Errorf("%s: no memory capacity (%v)", name, d.Capacity)
			}
		}
		if n, ok := attr(d, "resource.kubernetes.io/numaNode"); ok && n.IntValue != nil {
			perNUMA[*n.IntValue]++
		}
	}
	if len(perNUMA) != 2 || perNUMA[0] != 4 || perNUMA[1] != 4 {
		t.Errorf("GPUs per NUMA node %v, want 4 on each of 0 and 1", perNUMA)
	}
}

func head(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
