package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// attrValues renders an attribute as a set of strings (a list attribute as its items).
func attrValues(d resourceapi.Device, name string) []string {
	a, ok := attr(d, name)
	if !ok {
		return nil
	}
	switch {
	case a.IntValue != nil:
		return []string{strconv.FormatInt(*a.IntValue, 10)}
	case a.StringValue != nil:
		return []string{*a.StringValue}
	case a.VersionValue != nil:
		return []string{*a.VersionValue}
	case len(a.IntValues) > 0:
		var out []string
		for _, v := range a.IntValues {
			out = append(out, strconv.FormatInt(v, 10))
		}
		return out
	}
	return nil
}

// common is the intersection of the devices' values of attribute name.
func common(devices map[string]resourceapi.Device, devs []string, name string) []string {
	var acc []string
	for i, d := range devs {
		vals := attrValues(devices[d], name)
		if i == 0 {
			acc = slices.Clone(vals)
			continue
		}
		acc = slices.DeleteFunc(acc, func(v string) bool { return !slices.Contains(vals, v) })
	}
	sort.Strings(acc)
	return acc
}

// fill creates n pods from tmpl that must all run, each on devices sharing match,
// no device twice; then one more that must stay Pending with the scheduler's
// reason. It returns the devices of each running pod.
func (e *env) fill(ns, tmpl, prefix string, n, size int, devices map[string]resourceapi.Device, match string) [][]string {
	t := e.t
	t.Helper()
	var out [][]string
	seen := map[string]string{}
	for i := 0; i < n; i++ {
		e.createPod(ns, fmt.Sprintf("%s-%d", prefix, i), tmpl)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		pod := e.waitPodRunning(ns, name, 2*time.Minute)
		_, devs := e.allocation(pod)
		if len(devs) != size {
			t.Fatalf("%s got %v, want %d GPUs", name, devs, size)
		}
		shared := common(devices, devs, match)
		if len(shared) == 0 {
			vals := map[string][]string{}
			for _, d := range devs {
				vals[d] = attrValues(devices[d], match)
			}
			t.Fatalf("%s: GPUs %v share no %s: %v", name, devs, match, vals)
		}
		for _, d := range devs {
			if other, dup := seen[d]; dup {
				t.Fatalf("%s and %s both got %s", other, name, d)
			}
			seen[d] = name
		}
		t.Logf("%s: %v share %s %v", name, devs, match, shared)
		out = append(out, devs)
	}
	extra := fmt.Sprintf("%s-%d", prefix, n)
	e.createPod(ns, extra, tmpl)
	msg := e.waitEvent(ns, extra, "FailedScheduling", regexp.MustCompile(`cannot allocate all claims`), 2*time.Minute)
	t.Logf("%s stays Pending: %s", extra, msg)
	return out
}

func (e *env) deletePods(ns string, names ...string) {
	e.t.Helper()
	for _, n := range names {
		if err := e.admin.CoreV1().Pods(ns).Delete(t0ctx(), n, deleteNow()); err != nil {
			e.t.Fatal(err)
		}
	}
	for _, n := range names {
		e.waitPodGone(ns, n, time.Minute)
	}
}

// eightGPUNode starts a node with opts, waits for the plugin to register and
// publish the profile's 8 GPUs, and applies the claim templates in a new namespace ns.
func eightGPUNode(t *testing.T, opts envOptions, ns string, templates ...string) (*env, map[string]resourceapi.Device) {
	e := newEnv(t, opts)
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8, time.Minute)
	e.createNamespace(ns)
	e.kubectlApply(strings.Join(templates, "---\n"))
	return e, devices
}

// TestSNC4XeonListNUMA: the list form of resource.kubernetes.io/numaNode on a
// 2-socket SNC4 machine (8 NUMA nodes, one GPU each, NVLink-bridged pairs).
func TestSNC4XeonListNUMA(t *testing.T) {
	t.Parallel()
	const ns = "snc"
	e, devices := eightGPUNode(t, envOptions{profile: "snc4-xeon", pluginArgs: []string{"--numa-node-format=list"}}, ns,
		claimTemplate(ns, "four-one-numa", 4, "resource.kubernetes.io/numaNode"),
		claimTemplate(ns, "two-one-nvlink", 2, "gpu.topodra.dev/nvlinkDomain"),
		claimTemplate(ns, "two-one-pcie-root", 2, "resource.kubernetes.io/pcieRoot"))
	for name, d := range devices {
		a, _ := attr(d, "resource.kubernetes.io/numaNode")
		if len(a.IntValues) != 4 || a.IntValues[0] != int64(minorOf(name)) {
			t.Errorf("%s: numaNode %v, want a list of the 4 nodes of its socket, its own (%d) first", name, a.IntValues, minorOf(name))
		}
	}

	t.Run("list numaNode: 4 GPUs of one socket's sub-NUMA clusters, 2 pods fill both sockets", func(t *testing.T) {
		e.t = t
		got := e.fill(ns, "four-one-numa", "numa", 2, 4, devices, "resource.kubernetes.io/numaNode")
		sockets := map[string]bool{}
		for _, devs := range got {
			s := common(devices, devs, "socket")
			if len(s) != 1 {
				t.Errorf("%v are not on one socket", devs)
			}
			sockets[strings.Join(s, ",")] = true
		}
		if len(sockets) != 2 {
			t.Errorf("both pods on socket(s) %v", sockets)
		}
		pod, err := e.admin.CoreV1().Pods(ns).Get(t0ctx(), "numa-0", getOpts())
		if err != nil {
			t.Fatal(err)
		}
		checkInjected(t, e, pod, got[0])
		e.deletePods(ns, "numa-0", "numa-1", "numa-2")
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("nvlinkDomain: 4 pods of 2 GPUs get the 4 NVLink-bridged pairs", func(t *testing.T) {
		e.t = t
		got := e.fill(ns, "two-one-nvlink", "nvl", 4, 2, devices, "gpu.topodra.dev/nvlinkDomain")
		for _, devs := range got {
			a, b := minorOf(devs[0]), minorOf(devs[1])
			if a/2 != b/2 {
				t.Errorf("%v are not a bridged pair", devs)
			}
		}
		e.deletePods(ns, "nvl-0", "nvl-1", "nvl-2", "nvl-3", "nvl-4")
	})

	t.Run("pcieRoot: no two GPUs share a root complex here, so 2 GPUs on one root stay Pending", func(t *testing.T) {
		e.t = t
		e.createPod(ns, "root-0", "two-one-pcie-root")
		msg := e.waitEvent(ns, "root-0", "FailedScheduling", regexp.MustCompile(`cannot allocate all claims`), 2*time.Minute)
		t.Logf("root-0: %s", msg)
	})
}

// TestL40SPCIeRoots: pcieRoot and pcieSwitch constraints on a PCIe machine whose
// GPUs come in pairs behind one switch and root complex.
func TestL40SPCIeRoots(t *testing.T) {
	t.Parallel()
	const ns = "pcie"
	e, devices := eightGPUNode(t, envOptions{profile: "l40s-pcie"}, ns,
		claimTemplate(ns, "two-one-root", 2, "resource.kubernetes.io/pcieRoot"),
		claimTemplate(ns, "two-one-switch", 2, "gpu.topodra.dev/pcieSwitch"))
	t.Run("pcieRoot: 4 pods of 2 GPUs get the 4 root complexes", func(t *testing.T) {
		e.t = t
		e.fill(ns, "two-one-root", "root", 4, 2, devices, "resource.kubernetes.io/pcieRoot")
		e.deletePods(ns, "root-0", "root-1", "root-2", "root-3", "root-4")
	})
	t.Run("pcieSwitch: 4 pods of 2 GPUs get the 4 switches", func(t *testing.T) {
		e.t = t
		e.fill(ns, "two-one-switch", "switch", 4, 2, devices, "gpu.topodra.dev/pcieSwitch")
	})
}

// checkInjected asserts the pod's injection record: exactly the allocated GPUs'
// device nodes, and the NUMA hint env.
func checkInjected(t *testing.T, e *env, pod *v1.Pod, devs []string) {
	t.Helper()
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	inj := rec.Containers[0]
	var gpus, want []string
	for _, p := range inj.DeviceNodes {
		if regexp.MustCompile(`^/dev/nvidia\d+$`).MatchString(p) {
			gpus = append(gpus, p)
		}
	}
	for _, d := range devs {
		want = append(want, fmt.Sprintf("/dev/nvidia%d", minorOf(d)))
	}
	sort.Strings(gpus)
	sort.Strings(want)
	if !slices.Equal(gpus, want) {
		t.Errorf("%s: GPU nodes %v, want %v", pod.Name, gpus, want)
	}
	if !slices.ContainsFunc(inj.Env, func(s string) bool { return strings.HasPrefix(s, "TOPODRA_NUMA_NODES=") }) {
		t.Errorf("%s: no TOPODRA_NUMA_NODES in %v", pod.Name, inj.Env)
	}
	t.Logf("%s: injected %v, env %v", pod.Name, inj.DeviceNodes, inj.Env)
}

// TestSNC4XeonIntNUMA is the contrast: with the default int form, no two GPUs of
// the SNC4 machine share a NUMA node, so 4 GPUs with matchAttribute numaNode stay
// Pending, while 4 GPUs with matchAttribute socket fit.
func TestSNC4XeonIntNUMA(t *testing.T) {
	t.Parallel()
	const ns = "snc-int"
	e, devices := eightGPUNode(t, envOptions{profile: "snc4-xeon"}, ns,
		claimTemplate(ns, "four-one-numa", 4, "resource.kubernetes.io/numaNode"),
		claimTemplate(ns, "four-one-socket", 4, "gpu.topodra.dev/socket"))
	e.createPod(ns, "numa-0", "four-one-numa")
	msg := e.waitEvent(ns, "numa-0", "FailedScheduling", regexp.MustCompile(`cannot allocate all claims`), 2*time.Minute)
	t.Logf("numa-0 (int form) stays Pending: %s", msg)
	e.deletePods(ns, "numa-0")
	e.fill(ns, "four-one-socket", "socket", 2, 4, devices, "gpu.topodra.dev/socket")
}
