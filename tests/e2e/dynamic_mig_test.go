package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
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
	"k8s.io/utils/cpuset"
	"sigs.k8s.io/yaml"
)

// nvmlState is the part of the fake NVML's state file (the simulated driver's MIG
// instances, tests/fake-nvml/src/ffi/mig/state.rs) these tests read.
type nvmlState struct {
	GPUs map[string]struct {
		Instances []struct {
			Start   int        `json:"start"`
			Size    int        `json:"size"`
			Name    string     `json:"name"`
			Compute []struct{} `json:"compute"`
		} `json:"instances"`
	} `json:"gpus"`
}

// migInstances lists the MIG instances the simulated driver holds, as
// "<gpu uuid> <profile>@<start>:<size>", sorted; each must have its compute instance.
func (e *env) migInstances() []string {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.dir, "sim", "nvml", "nvml-state.yaml"))
	if err != nil {
		e.t.Fatal(err)
	}
	var s nvmlState
	if err := yaml.Unmarshal(raw, &s); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for gpu, g := range s.GPUs {
		for _, gi := range g.Instances {
			if len(gi.Compute) != 1 {
				e.t.Errorf("GPU %s: instance %s at %d has %d compute instances", gpu, gi.Name, gi.Start, len(gi.Compute))
			}
			out = append(out, fmt.Sprintf("%s %s@%d:%d", gpu, gi.Name, gi.Start, gi.Size))
		}
	}
	sort.Strings(out)
	return out
}

// TestDynamicMIG: a DGX H100 with every GPU in MIG mode and no instance, the plugin
// with --dynamic-mig, and the real 1.37.2 scheduler. The pool publishes every GPU
// whole and its 25 partitions; a burst of seven 1g.10gb claims carves one GPU only,
// a 7g.80gb and a whole GPU are still placed after it, each claim's instance is made
// at the placement the scheduler chose and reaches the container as its capability
// nodes, and deleting the pods removes the instances.
func TestDynamicMIG(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100-mig", pluginArgs: []string{"--dynamic-mig"}})
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8+8*25, 2*time.Minute)
	if got := e.migInstances(); len(got) != 0 {
		t.Fatalf("instances before any claim: %v", got)
	}

	const ns = "dynamic-mig"
	e.createNamespace(ns)
	e.kubectlApply(migTemplate(ns, "small", "1g.10gb"))
	e.kubectlApply(migTemplate(ns, "big", "7g.80gb"))
	e.kubectlApply(claimSpec{ns: ns, name: "whole", selector: `device.attributes["gpu.topodra.dev"].type == "gpu"`}.yaml())

	var small []string
	for i := range 7 {
		name := fmt.Sprintf("small-%d", i)
		e.createPod(ns, name, "small")
		pod := e.waitPodRunning(ns, name, 2*time.Minute)
		_, devs := e.allocation(pod)
		if len(devs) != 1 {
			t.Fatalf("%s got %v", name, devs)
		}
		small = append(small, devs[0])
	}
	// The allocator's order puts small partitions on the GPU published last, each
	// at its highest free start: one GPU carved, the other seven untouched.
	parents := map[string]bool{}
	for _, d := range small {
		parents[strings.Join(attrValues(devices[d], "parentUUID"), "")] = true
	}
	if len(parents) != 1 {
		t.Errorf("seven 1g.10gb claims carved %d GPUs (%v), want 1", len(parents), small)
	}
	t.Logf("1g.10gb claims got %v", small)

	pod := e.waitPodRunning(ns, "small-0", time.Minute)
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	caps := 0
	for _, n := range rec.Containers[0].DeviceNodes {
		if regexp.MustCompile(`^/dev/nvidia-caps/nvidia-cap\d+$`).MatchString(n) {
			caps++
		}
	}
	if caps != 2 {
		t.Errorf("small-0 (%s): injected %v, want 2 MIG capability nodes", small[0], rec.Containers[0].DeviceNodes)
	}

	e.createPod(ns, "big-0", "big")
	big := e.waitPodRunning(ns, "big-0", 2*time.Minute)
	_, bigDevs := e.allocation(big)
	e.createPod(ns, "whole-0", "whole")
	whole := e.waitPodRunning(ns, "whole-0", 2*time.Minute)
	_, wholeDevs := e.allocation(whole)
	t.Logf("7g.80gb got %v, the whole GPU claim %v", bigDevs, wholeDevs)
	if len(wholeDevs) != 1 || strings.Contains(wholeDevs[0], "-mig-") {
		t.Errorf("the whole-GPU claim got %v", wholeDevs)
	}

	instances := e.migInstances()
	var ones, sevens int
	for _, in := range instances {
		switch {
		case strings.Contains(in, " 1g.10gb@"):
			ones++
		case strings.Contains(in, " 7g.80gb@0:8"):
			sevens++
		}
	}
	if len(instances) != 9 || ones != 7 || sevens != 2 {
		t.Errorf("instances %v, want seven 1g.10gb and two 7g.80gb (the 7g claim's and the whole GPU's)", instances)
	}

	ctx := context.Background()
	for i := range 7 {
		name := fmt.Sprintf("small-%d", i)
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, name, 2*time.Minute)
	}
	eventually(t, time.Minute, func() error {
		left := e.migInstances()
		if slices.ContainsFunc(left, func(s string) bool { return strings.Contains(s, " 1g.10gb@") }) || len(left) != 2 {
			return fmt.Errorf("instances left: %v", left)
		}
		return nil
	})

	// A pod written for the device plugin's mixed MIG strategy: the chart value
	// deviceClass.migExtendedResources maps nvidia.com/mig-1g.10gb to a class of
	// 1g.10gb devices, and the scheduler's claim gets a partition.
	rendered := helmTemplate(t, t.TempDir(), "--set", "deviceClass.migExtendedResources={1g.10gb}")
	e.kubectlApply(manifestDoc(t, rendered, "DeviceClass"))
	e.createExtendedPod(ns, "by-resource", "nvidia.com/mig-1g.10gb", 1)
	byResource := e.waitPodRunning(ns, "by-resource", 2*time.Minute)
	claim, devs := e.extendedClaim(byResource)
	if len(devs) != 1 || !strings.Contains(devs[0], "-mig-1g-10gb-") {
		t.Errorf("nvidia.com/mig-1g.10gb: 1 got %v, want one 1g.10gb partition", devs)
	}
	if r := claim.Spec.Devices.Requests; len(r) != 1 || r[0].Exactly == nil || r[0].Exactly.DeviceClassName != "mig-1g.10gb.topodra.dev" {
		t.Errorf("the scheduler's claim asks for %+v, want the class mig-1g.10gb.topodra.dev", r)
	}
	t.Logf("nvidia.com/mig-1g.10gb: 1 got %v", devs)

	// The aligned classes: a whole GPU and a partition asked for without a
	// constraint get the aligned-by-default policy's numaNode constraint over both.
	aligned := fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-and-partition
  namespace: %s
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly:
            deviceClassName: gpu-aligned.topodra.dev
        - name: part
          exactly:
            deviceClassName: mig-aligned.topodra.dev
            selectors:
              - cel:
                  expression: device.attributes["gpu.topodra.dev"].profile == "1g.10gb"
`, ns)
	e.kubectlApply(aligned)
	tmpl, err := e.admin.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "gpu-and-partition", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := constraintsString(tmpl.Spec.Spec.Devices.Constraints); got != constraintsString([]resourceapi.DeviceConstraint{numaConstraint("gpu", "part")}) {
		t.Fatalf("template gpu-and-partition: constraints %s, want the policy's numaNode over gpu and part", got)
	}
	e.createPod(ns, "aligned-0", "gpu-and-partition")
	alignedPod := e.waitPodRunning(ns, "aligned-0", 2*time.Minute)
	_, alignedDevs := e.allocation(alignedPod)
	var kinds, numas []string
	for _, d := range alignedDevs {
		kinds = append(kinds, strings.Join(attrValues(devices[d], "type"), ""))
		numas = append(numas, strings.Join(attrValues(devices[d], "resource.kubernetes.io/numaNode"), ""))
	}
	slices.Sort(kinds)
	if !slices.Equal(kinds, []string{"gpu", "mig"}) || len(numas) != 2 || numas[0] != numas[1] {
		t.Errorf("aligned GPU and partition: %v (types %v, NUMA nodes %v), want a GPU and a partition on one NUMA node", alignedDevs, kinds, numas)
	}
	t.Logf("aligned GPU and partition: %v on NUMA node %v", alignedDevs, numas)
}

// TestDynamicMIGChartUpgrade: the chart with kubeletPlugin.dynamicMig on a simulated
// DGX H100 in MIG mode, the plugin run from the image. With a partition prepared,
// `helm upgrade` rolls the DaemonSet (maxSurge 1): the new pod takes the node state
// over and publishes every partition again, counting the old pod's instance as its
// own, not someone else's; when the pod goes, it removes the instance the old pod
// made. A partition it prepares itself goes the same way, and no instance is left.
func TestDynamicMIGChartUpgrade(t *testing.T) {
	t.Parallel()
	rootfs := imageRootfs(t)
	e := newEnv(t, envOptions{profile: "dgx-h100-mig", fromChart: true})
	sim := filepath.Join(e.dir, "sim")
	var caps string
	for _, a := range e.args {
		if v, ok := strings.CutPrefix(a, "--nvidia-capabilities-dir="); ok {
			caps = v
		}
	}
	if caps == "" {
		t.Fatalf("topodra-sim-node printed no --nvidia-capabilities-dir: %v", e.args)
	}
	d := newChartDeployment(t, e, rootfs, map[string]any{
		"dynamicMig": true,
		// The fake NVML keeps its instances in a state file beside it (so /sim is
		// writable here), and makes each instance's capability files in the
		// directory its state names, a path of this machine: mounted at that path.
		"extraVolumes": []any{
			map[string]any{"name": "sim", "hostPath": map[string]any{"path": sim, "type": "Directory"}},
			map[string]any{"name": "caps", "hostPath": map[string]any{"path": caps, "type": "Directory"}},
		},
		"extraVolumeMounts": []any{
			map[string]any{"name": "sim", "mountPath": "/sim"},
			map[string]any{"name": "caps", "mountPath": caps},
		},
	})
	chart := filepath.Join(repoRoot(t), "deploy", "helm", "topodra")
	d.run("install", "topodra", chart, "--values", d.values, "--wait=false", "--create-namespace")
	first := d.startPod("plugin-first")
	d.waitServing(first, fmt.Sprintf("%012d", d.runs), 2*time.Minute)
	e.plugin = first
	const all = 8 + 8*25
	e.waitDevices(all, 2*time.Minute)

	const ns = "mig-upgrade"
	e.createNamespace(ns)
	e.kubectlApply(migTemplate(ns, "small", "1g.10gb"))
	e.createPod(ns, "a", "small")
	e.waitPodRunning(ns, "a", 2*time.Minute)
	if got := e.migInstances(); len(got) != 1 {
		t.Fatalf("instances after the first prepare: %v, want one", got)
	}

	// A changed value, so the DaemonSet's pod template changes and it rolls.
	d.run("upgrade", "topodra", chart, "--values", d.values, "--set", "kubeletPlugin.logLevel=debug", "--wait=false")
	second := d.roll(first, "plugin-second")
	// The slices the new pod publishes: the old pod's instance is an allocated
	// partition of its own, so nothing is taken out of the counter sets.
	e.waitDevices(all, time.Minute)
	e.createPod(ns, "b", "small")
	e.waitPodRunning(ns, "b", 2*time.Minute)
	if got := e.migInstances(); len(got) != 2 {
		t.Fatalf("instances after a prepare on each side of the upgrade: %v, want two", got)
	}

	ctx := context.Background()
	for _, pod := range []string{"a", "b"} {
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, pod, time.Minute)
	}
	eventually(t, time.Minute, func() error {
		if left := e.migInstances(); len(left) != 0 {
			return fmt.Errorf("instances left after both pods went: %v", left)
		}
		return nil
	})
	if !logHas(second, "took over the node state") {
		t.Errorf("%s did not take the node state over", second.what)
	}
}

// TestDynamicMIGPartitionAndCPUs: a MIG partition and CPUs of the real CPU driver
// (kubernetes-sigs dra-driver-cpu v0.2.0) on one NUMA node of a simulated DGX H100 in
// MIG mode, through one matchAttribute on the alias both drivers publish. The CPUs
// of NUMA node 1, where the device order would put the partition, are taken first,
// so the claim's partition must come from a GPU of NUMA node 0: the instance is made
// there, and the container gets the partition and a cpuset of that node.
func TestDynamicMIGPartitionAndCPUs(t *testing.T) {
	t.Parallel()
	dracpu := needCPUDriver(t)
	e := newEnv(t, envOptions{profile: "dgx-h100-mig", cpuDriver: true,
		pluginArgs: []string{"--dynamic-mig", "--numa-node-aliases=" + numaAlias}})
	devices, cpuNUMA := e.cpuDriverBeside(dracpu, 8+8*25)

	const ns = "mig-cpus"
	e.createNamespace(ns)
	e.hogNUMA1CPUs(ns)
	e.kubectlApply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: partition-and-cpus
  namespace: ` + ns + `
spec:
  spec:
    devices:
      requests:
        - name: part
          exactly:
            deviceClassName: ` + migClass + `
            selectors:
              - cel:
                  expression: device.attributes["gpu.topodra.dev"].profile == "3g.40gb"
        - name: cpus
          exactly:
            deviceClassName: ` + cpuDriverName + `
            capacity:
              requests:
                ` + cpuDriverName + `/cpu: "16"
      constraints:
        - requests: [part, cpus]
          matchAttribute: ` + numaAlias + `
`)
	e.createPod(ns, "aligned", "partition-and-cpus")
	pod := e.waitPodRunning(ns, "aligned", 2*time.Minute)
	claim := claimOf(t, e, pod)
	var part string
	var numas []int64
	for _, r := range claim.Status.Allocation.Devices.Results {
		switch r.Driver {
		case driverName:
			part = r.Device
			numas = append(numas, numaOf(t, devices[r.Device]))
		case cpuDriverName:
			numas = append(numas, cpuNUMA[r.Device])
		}
	}
	t.Logf("partition %s and CPUs on NUMA nodes %v", part, numas)
	if !strings.Contains(part, "-mig-3g-40gb-") || len(numas) != 2 || numas[0] != 0 || numas[1] != 0 {
		t.Fatalf("claim %s got %s on NUMA nodes %v; want a 3g.40gb partition and CPUs of NUMA node 0", claim.Name, part, numas)
	}
	instances := e.migInstances()
	if len(instances) != 1 || !strings.Contains(instances[0], " 3g.40gb@") {
		t.Errorf("instances %v, want the claim's one 3g.40gb", instances)
	}
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cpuset.Parse(rec.Containers[0].CPUSetCPUs)
	if err != nil {
		t.Fatalf("cpuset %q: %v", rec.Containers[0].CPUSetCPUs, err)
	}
	if node0 := nodeCPUList(t, e, 0); got.Size() != 16 || !got.IsSubsetOf(node0) {
		t.Errorf("cpuset %s, want 16 CPUs of NUMA node 0 (%s)", got, node0)
	}
	if !slices.Contains(rec.Containers[0].Env, "TOPODRA_NUMA_NODES=0") {
		t.Errorf("env %v lacks TOPODRA_NUMA_NODES=0", rec.Containers[0].Env)
	}
}

// TestDynamicMIGChurn: a seeded stream of mixed-profile claims (six profiles and
// whole GPUs) arriving (4 in 5 steps) and leaving on the simulated DGX H100 in MIG
// mode, through the real scheduler and the plugin with --dynamic-mig, busy enough
// that some pods wait. No prepare fails, every pod the scheduler places runs, and at
// each check the driver holds exactly the instances of the allocated devices (a
// whole GPU as its full-size instance), at the placements the scheduler chose.
func TestDynamicMIGChurn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100-mig", pluginArgs: []string{"--dynamic-mig"}})
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8+8*25, 2*time.Minute)
	const ns = "mig-churn"
	e.createNamespace(ns)
	profiles := []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
	for _, p := range profiles {
		e.kubectlApply(migTemplate(ns, "p-"+strings.ReplaceAll(p, ".", "-"), p))
	}
	e.kubectlApply(claimSpec{ns: ns, name: "whole", selector: `device.attributes["gpu.topodra.dev"].type == "gpu"`}.yaml())

	ctx := context.Background()
	// placed waits until the scheduler placed the pod (true, and it must run) or
	// gave up on it for now (false).
	placed := func(name string) bool {
		var bound bool
		eventually(t, 2*time.Minute, func() error {
			p, err := e.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Spec.NodeName != "" {
				bound = true
				return nil
			}
			for _, c := range p.Status.Conditions {
				if c.Type == "PodScheduled" && c.Status == "False" && c.Reason == "Unschedulable" {
					return nil
				}
			}
			return fmt.Errorf("pod %s neither bound nor unschedulable yet", name)
		})
		if bound {
			e.waitPodRunning(ns, name, 2*time.Minute)
		}
		return bound
	}
	// expected lists the instances the running pods' devices must have, as
	// migInstances writes them without the size.
	expected := func() []string {
		pods, err := e.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
				continue
			}
			_, devs := e.allocation(e.waitPodRunning(ns, p.Name, 2*time.Minute))
			for _, d := range devs {
				dev := devices[d]
				if attrValues(dev, "type")[0] == "gpu" {
					out = append(out, strings.Join(attrValues(dev, "uuid"), "")+" 7g.80gb@0")
					continue
				}
				start := d[strings.LastIndex(d, "-")+1:]
				out = append(out, fmt.Sprintf("%s %s@%s", strings.Join(attrValues(dev, "parentUUID"), ""),
					strings.Join(attrValues(dev, "profile"), ""), start))
			}
		}
		sort.Strings(out)
		return out
	}
	held := func() []string {
		var out []string
		for _, in := range e.migInstances() {
			out = append(out, in[:strings.LastIndex(in, ":")])
		}
		return out
	}
	check := func(step int) {
		eventually(t, time.Minute, func() error {
			if want, got := expected(), held(); !slices.Equal(want, got) {
				return fmt.Errorf("step %d: instances %v, want those of the allocations %v", step, got, want)
			}
			return nil
		})
	}

	r := rand.New(rand.NewPCG(4815, 43))
	var live []string
	ran, waited, n := 0, 0, 0
	for step := range 40 {
		if len(live) == 0 || r.IntN(10) < 8 {
			n++
			name := fmt.Sprintf("c-%02d", n)
			tmpl := "whole"
			if k := r.IntN(len(profiles) + 1); k < len(profiles) {
				tmpl = "p-" + strings.ReplaceAll(profiles[k], ".", "-")
			}
			e.createPod(ns, name, tmpl)
			if placed(name) {
				ran++
			} else {
				waited++
			}
			live = append(live, name)
		} else {
			i := r.IntN(len(live))
			if err := e.admin.CoreV1().Pods(ns).Delete(ctx, live[i], metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			e.waitPodGone(ns, live[i], 2*time.Minute)
			live = slices.Delete(live, i, i+1)
		}
		if step%6 == 5 {
			check(step)
		}
	}
	check(40)
	events, err := e.admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedPrepareDynamicResources"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		// The kubelet's own read of a claim it was just given can come before the
		// node authorizer has seen the reservation; it retries, as the harness
		// does. Only what the plugin answered counts.
		if strings.Contains(ev.Message, "no relationship found between node") {
			t.Logf("kubelet retry (node authorizer lag): %s: %s", ev.InvolvedObject.Name, ev.Message)
			continue
		}
		t.Errorf("failed prepare: %s: %s", ev.InvolvedObject.Name, ev.Message)
	}
	t.Logf("%d pods created: %d placed at once, %d waited; instances at the end: %v", n, ran, waited, held())
	if ran < 10 || waited == 0 {
		t.Errorf("the stream placed %d pods and left %d waiting; want a busy node (at least 10 placed, some waiting)", ran, waited)
	}
}

// TestDynamicMIGEnablesMigMode: a DGX H100 with MIG off and the plugin with
// --dynamic-mig offers its 8 GPUs whole. A claim is prepared on one of them; the
// plugin restarted with --enable-mig-mode turns MIG mode on for the other seven,
// which then publish their partitions, and leaves the GPU the claim holds as it
// is. Once that pod is gone, the next start switches it too.
func TestDynamicMIGEnablesMigMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100", pluginArgs: []string{"--dynamic-mig"}})
	e.waitRegistered(2 * time.Minute)
	e.waitDevices(8, time.Minute)
	const ns = "mig-mode"
	e.createNamespace(ns)
	e.kubectlApply(claimSpec{ns: ns, name: "whole", selector: `device.attributes["gpu.topodra.dev"].type == "gpu"`}.yaml())
	e.createPod(ns, "held", "whole")
	_, devs := e.allocation(e.waitPodRunning(ns, "held", 2*time.Minute))
	if len(devs) != 1 {
		t.Fatalf("the whole-GPU claim got %v", devs)
	}
	held := devs[0]

	restart := func() {
		e.plugin.stop(t)
		e.plugin = e.startPlugin(e.pluginKubeconfig)
		e.waitRegistered(time.Minute)
	}
	e.args = append(e.args, "--enable-mig-mode")
	restart()
	devices := e.waitDevices(7*(1+25)+1, time.Minute)
	for name := range devices {
		if strings.HasPrefix(name, held+"-mig-") {
			t.Errorf("%s: the GPU a claim holds publishes partition %s (MIG mode changed under the claim)", held, name)
		}
	}
	if !logHas(e.plugin, "MIG mode enabled") || !logHas(e.plugin, "a prepared claim holds it") {
		t.Errorf("the plugin's log does not say which GPUs it switched and why it left %s; log %s", held, e.plugin.log)
	}

	if err := e.admin.CoreV1().Pods(ns).Delete(context.Background(), "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodGone(ns, "held", time.Minute)
	restart()
	// The pool grows a slice and its counter slice moves to the end: a slice of
	// counters is never reused for devices (the API server refuses that apply).
	e.waitDevices(8*(1+25), time.Minute)
}
