package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// mpsTemplate is a claim template for one MPS share with `memory` and `compute`
// percent of a GPU.
func mpsTemplate(ns, name, memory string, compute int) string {
	return classTemplate(ns, name, "mps.topodra.dev", "memory: "+memory, fmt.Sprintf("compute: \"%d\"", compute))
}

// mpsDaemons lists the MPS control daemons the plugin's state directory names, as
// "<gpu device> <pid>" for those whose process runs.
func (e *env) mpsDaemons() []string {
	e.t.Helper()
	files, _ := filepath.Glob(filepath.Join(e.kubeletRoot, "plugins", driverName, "mps", "*", "pipe", "nvidia-cuda-mps-control.pid"))
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || syscall.Kill(pid, 0) != nil {
			continue
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(stat), ") Z ") {
			continue
		}
		gpu := filepath.Base(filepath.Dir(filepath.Dir(f)))
		out = append(out, fmt.Sprintf("%s %d", gpu, pid))
	}
	slices.Sort(out)
	return out
}

// killMPSDaemons kills whatever MPS daemon is left, so none outlives its test.
func (e *env) killMPSDaemons() {
	for _, d := range e.mpsDaemons() {
		if pid, err := strconv.Atoi(strings.Fields(d)[1]); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// computeMode is the simulated driver's compute mode of GPU `uuid` (the fake
// NVML's state file; absent means DEFAULT, 0).
func (e *env) computeMode(uuid string) int {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join(e.dir, "sim", "nvml", "nvml-state.yaml"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var s struct {
		GPUs map[string]struct {
			ComputeMode *int `json:"compute_mode"`
		} `json:"gpus"`
	}
	if err := yaml.Unmarshal(raw, &s); err != nil {
		e.t.Fatal(err)
	}
	if g, ok := s.GPUs[uuid]; ok && g.ComputeMode != nil {
		return *g.ComputeMode
	}
	return 0
}

// TestMPS: an L40S node with the plugin's --mps and the real 1.37.2 scheduler. Pods
// in two namespaces share one GPU through MPS: the GPU goes into EXCLUSIVE_PROCESS
// and gets one control daemon from the driver root, each container gets the
// daemon's pipe directory and its own limits from its allocation, a restart of the
// plugin leaves the daemon and the pods running, and after the last share the
// daemon quits and the compute mode is back. A share asking for more SMs than a GPU
// has left waits with an Event.
func TestMPS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "l40s-pcie", pluginArgs: []string{"--mps"}})
	t.Cleanup(e.killMPSDaemons)
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(16, 2*time.Minute)
	mps, ok := devices["gpu-0-mps"]
	if !ok {
		t.Fatalf("no gpu-0-mps among %d devices", len(devices))
	}
	if c, ok := mps.Capacity["compute"]; !ok || c.Value.String() != "100" {
		t.Errorf("gpu-0-mps compute capacity %+v, want 100 percent", mps.Capacity)
	}

	var pods []*v1.Pod
	for i, ns := range []string{"team-a", "team-b"} {
		e.createNamespace(ns)
		e.kubectlApply(mpsTemplate(ns, "share", fmt.Sprintf("%dGi", 10*(i+1)), 30+10*i))
		e.createPod(ns, "share", "share")
	}
	var shared []string
	for i, ns := range []string{"team-a", "team-b"} {
		pod := e.waitPodRunning(ns, "share", 2*time.Minute)
		pods = append(pods, pod)
		_, devs := e.allocation(pod)
		if len(devs) != 1 || !strings.HasSuffix(devs[0], "-mps") {
			t.Fatalf("%s/share got %v, want one MPS device", ns, devs)
		}
		shared = append(shared, devs[0])
		env := injectedEnv(t, e, pod)
		for _, want := range []string{
			"TOPODRA_SHARING=MPS",
			"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
			fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", 30+10*i),
			fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", 10240*(i+1)),
		} {
			if !slices.Contains(env, want) {
				t.Errorf("%s/share: env %v lacks %s", ns, env, want)
			}
		}
		rec, err := readRecord(e, pod)
		if err != nil {
			t.Fatal(err)
		}
		for dir, dest := range map[string]string{"pipe": "/tmp/nvidia-mps", "shm": "/dev/shm"} {
			mounted := false
			for _, m := range rec.Containers[0].Mounts {
				if m.Destination == dest && strings.HasSuffix(m.Source, "/mps/"+strings.TrimSuffix(devs[0], "-mps")+"/"+dir) {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("%s/share: no mount of its GPU daemon's %s directory at %s: %+v", ns, dir, dest, rec.Containers[0].Mounts)
			}
		}
	}
	if shared[0] != shared[1] {
		t.Errorf("the two shares went to %v, want one GPU", shared)
	}
	gpu := strings.TrimSuffix(shared[0], "-mps")
	uuid := strings.Join(attrValues(devices[gpu], "uuid"), "")
	daemons := e.mpsDaemons()
	if len(daemons) != 1 || !strings.HasPrefix(daemons[0], gpu+" ") {
		t.Fatalf("MPS daemons %v, want one for %s", daemons, gpu)
	}
	if got := e.computeMode(uuid); got != 3 {
		t.Errorf("%s compute mode %d, want EXCLUSIVE_PROCESS (3) while MPS runs", gpu, got)
	}
	t.Logf("two namespaces share %s through MPS daemon %s", shared[0], daemons[0])

	// More SMs than the GPU has left (30 + 40 in use): the share waits.
	e.kubectlApply(mpsTemplate("team-b", "big", "1Gi", 40))
	e.createPod("team-b", "big", "big")
	_, bigDevs := e.allocation(e.waitPodRunning("team-b", "big", 2*time.Minute))
	if bigDevs[0] == shared[0] {
		t.Errorf("a 40 %% share landed on %s, where 70 %% are taken", shared[0])
	}
	e.kubectlApply(mpsTemplate("team-b", "too-big", "1Gi", 101))
	e.createPod("team-b", "too-big", "too-big")
	msg := e.waitEvent("team-b", "too-big", "FailedScheduling", regexp.MustCompile(`.`), 2*time.Minute)
	t.Logf("too-big FailedScheduling: %s", msg)

	// A plugin restart leaves the daemons (and the pods) running.
	e.plugin.stop(t)
	if got := e.mpsDaemons(); len(got) != 2 {
		t.Errorf("after the plugin stopped: daemons %v, want both still running", got)
	}
	e.plugin = e.startPlugin(e.pluginKubeconfig)
	e.waitRegistered(time.Minute)

	for _, p := range append(pods, e.waitPodRunning("team-b", "big", time.Minute)) {
		e.deletePods(p.Namespace, p.Name)
	}
	eventually(t, time.Minute, func() error {
		if d := e.mpsDaemons(); len(d) != 0 {
			return fmt.Errorf("daemons still running: %v", d)
		}
		if m := e.computeMode(uuid); m != 0 {
			return fmt.Errorf("%s compute mode %d", gpu, m)
		}
		return nil
	})
}

// TestMPSOnMIGPartition: a DGX H100 in MIG mode under dynamic MIG, with MPS shares of
// the 3g.40gb partitions (--shared-mig-profiles), and the real 1.37.2 scheduler:
// what NVIDIA's driver cannot combine. Pods in two namespaces share one 3g.40gb
// partition through MPS: the first share makes the instance and starts a daemon
// for its MIG device, the second uses both, each container gets the MIG device and
// its own limits; after the last share the daemon quits and the instance goes.
func TestMPSOnMIGPartition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100-mig", pluginArgs: []string{
		"--dynamic-mig", "--mps", "--shared-mig-profiles=3g.40gb"}})
	t.Cleanup(e.killMPSDaemons)
	e.waitRegistered(2 * time.Minute)
	// Per GPU: the whole GPU, 25 partitions, and an MPS device per 3g.40gb placement.
	devices := e.waitDevices(8*(1+25+2), 2*time.Minute)
	if _, ok := devices["gpu-7-mig-3g-40gb-4-mps"]; !ok {
		t.Fatalf("no gpu-7-mig-3g-40gb-4-mps among %d devices", len(devices))
	}

	template := func(ns string) string {
		return strings.Replace(mpsTemplate(ns, "share", "10Gi", 50),
			"            capacity:",
			"            selectors:\n              - cel:\n                  expression: device.attributes[\"gpu.topodra.dev\"].profile == \"3g.40gb\"\n            capacity:", 1)
	}
	var pods []*v1.Pod
	var shared []string
	for _, ns := range []string{"team-a", "team-b"} {
		e.createNamespace(ns)
		e.kubectlApply(template(ns))
		e.createPod(ns, "share", "share")
		pod := e.waitPodRunning(ns, "share", 2*time.Minute)
		pods = append(pods, pod)
		_, devs := e.allocation(pod)
		if len(devs) != 1 || !strings.HasSuffix(devs[0], "-mps") || !strings.Contains(devs[0], "-mig-3g-40gb-") {
			t.Fatalf("%s/share got %v, want an MPS share of a 3g.40gb partition", ns, devs)
		}
		shared = append(shared, devs[0])
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
			t.Errorf("%s/share: injected %v, want the MIG device's 2 capability nodes", ns, rec.Containers[0].DeviceNodes)
		}
		if env := rec.Containers[0].Env; !slices.Contains(env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50") {
			t.Errorf("%s/share: env %v lacks its SM limit", ns, env)
		}
	}
	if shared[0] != shared[1] {
		t.Errorf("the two shares went to %v, want one partition", shared)
	}
	partition := strings.TrimSuffix(shared[0], "-mps")
	instances := e.migInstances()
	if len(instances) != 1 || !strings.Contains(instances[0], " 3g.40gb@") {
		t.Errorf("MIG instances %v, want the one 3g.40gb instance both shares use", instances)
	}
	daemons := e.mpsDaemons()
	if len(daemons) != 1 || !strings.HasPrefix(daemons[0], partition+" ") {
		t.Errorf("MPS daemons %v, want one for %s", daemons, partition)
	}
	t.Logf("two namespaces share %s through MPS daemon %v on instance %v", shared[0], daemons, instances)

	for _, p := range pods {
		e.deletePods(p.Namespace, p.Name)
	}
	eventually(t, time.Minute, func() error {
		if d := e.mpsDaemons(); len(d) != 0 {
			return fmt.Errorf("daemons still running: %v", d)
		}
		if in := e.migInstances(); len(in) != 0 {
			return fmt.Errorf("instances left: %v", in)
		}
		return nil
	})
}

// TestMPSShareAndCPUs: an MPS share and CPUs of kubernetes-sigs' dra-driver-cpu in one
// claim with one matchAttribute over the NUMA node, on the simulated DGX H100 with
// NUMA node 1's CPUs taken. Shares are placed from the end of the pool (NUMA node 1)
// unless something says otherwise, so the share landing on a NUMA node 0 GPU, beside
// its CPUs, is the constraint at work: a share carries its GPU's topology.
func TestMPSShareAndCPUs(t *testing.T) {
	t.Parallel()
	dracpu := needCPUDriver(t)
	e := newEnv(t, envOptions{profile: "dgx-h100", cpuDriver: true,
		pluginArgs: []string{"--mps", "--numa-node-aliases=" + numaAlias}})
	t.Cleanup(e.killMPSDaemons)
	devices, cpuNUMA := e.cpuDriverBeside(dracpu, 16)

	const ns = "mps-cpus"
	e.createNamespace(ns)
	e.hogNUMA1CPUs(ns)
	e.kubectlApply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: share-and-cpus
  namespace: ` + ns + `
spec:
  spec:
    devices:
      requests:
        - name: share
          exactly:
            deviceClassName: mps.topodra.dev
            capacity:
              requests:
                memory: 10Gi
                compute: "50"
        - name: cpus
          exactly:
            deviceClassName: ` + cpuDriverName + `
            capacity:
              requests:
                ` + cpuDriverName + `/cpu: "16"
      constraints:
        - requests: [share, cpus]
          matchAttribute: ` + numaAlias + `
`)
	e.createPod(ns, "aligned", "share-and-cpus")
	pod := e.waitPodRunning(ns, "aligned", 2*time.Minute)
	claim := claimOf(t, e, pod)
	var share string
	var numas []int64
	for _, r := range claim.Status.Allocation.Devices.Results {
		switch r.Driver {
		case driverName:
			share = r.Device
			numas = append(numas, numaOf(t, devices[r.Device]))
		case cpuDriverName:
			numas = append(numas, cpuNUMA[r.Device])
		}
	}
	t.Logf("MPS share %s and CPUs on NUMA nodes %v", share, numas)
	if !strings.HasSuffix(share, "-mps") || len(numas) != 2 || numas[0] != 0 || numas[1] != 0 {
		t.Fatalf("claim %s got %s on NUMA nodes %v; want an MPS share and CPUs of NUMA node 0", claim.Name, share, numas)
	}
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.Containers[0].Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50") {
		t.Errorf("env %v lacks the share's SM limit", rec.Containers[0].Env)
	}
	if rec.Containers[0].CPUSetCPUs == "" {
		t.Errorf("no cpuset from the CPU driver")
	}
	e.deletePods(ns, "aligned")
	eventually(t, time.Minute, func() error {
		if d := e.mpsDaemons(); len(d) != 0 {
			return fmt.Errorf("daemons still running: %v", d)
		}
		return nil
	})
}
