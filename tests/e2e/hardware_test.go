package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHGXSwitchPlaceholder: an HGX H100 board whose NVSwitch links report a
// placeholder PCI address, as NVML does on some platforms and drivers. Discovery
// must classify the links by remote device type, so all 8 GPUs share one
// nvlinkDomain and one claim of 8 GPUs with matchAttribute nvlinkDomain fits.
func TestHGXSwitchPlaceholder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "hgx-h100-placeholder"})
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8, time.Minute)
	var names []string
	for name := range devices {
		names = append(names, name)
	}
	sort.Strings(names)
	if d := common(devices, names, "gpu.topodra.dev/nvlinkDomain"); len(d) != 1 {
		t.Fatalf("8 GPUs on one NVSwitch board share nvlinkDomain %v, want exactly one", d)
	}
	const ns = "nvswitch"
	e.createNamespace(ns)
	e.kubectlApply(claimTemplate(ns, "eight-one-nvlink", 8, "gpu.topodra.dev/nvlinkDomain"))
	got := e.fill(ns, "eight-one-nvlink", "nvl", 1, 8, devices, "gpu.topodra.dev/nvlinkDomain")
	pod, err := e.admin.CoreV1().Pods(ns).Get(t0ctx(), "nvl-0", getOpts())
	if err != nil {
		t.Fatal(err)
	}
	checkInjected(t, e, pod, got[0])
}

// migClass is the chart's class of MIG devices.
const migClass = "mig.topodra.dev"

// migTemplate renders a ResourceClaimTemplate for one MIG device of a profile.
func migTemplate(ns, name, profile string) string {
	return claimSpec{ns: ns, name: name, class: migClass, selector: fmt.Sprintf(
		`device.attributes["gpu.topodra.dev"].type == "mig" && device.attributes["gpu.topodra.dev"].profile == %q`,
		profile)}.yaml()
}

// TestDGXA100MIG: a DGX A100 with GPU 0 split into 7 x 1g.5gb, GPU 1 into
// 3g.20gb + 2g.10gb + 1g.5gb, GPU 2 waiting for a MIG mode change, the rest whole.
// The pool offers the MIG devices and the whole GPUs, never a MIG GPU whole nor the
// pending one; a claim for a 3g.20gb device is prepared with the parent's device
// node and the MIG capability nodes, and the pending GPU is explained by an Event.
func TestDGXA100MIG(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-a100-mig"})
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(7+3+5, time.Minute)
	var mig, whole []string
	for name, d := range devices {
		switch v := attrValues(d, "type"); {
		case slices.Equal(v, []string{"mig"}):
			mig = append(mig, name)
			if len(attrValues(d, "parentUUID")) != 1 || len(attrValues(d, "profile")) != 1 {
				t.Errorf("%s: MIG device without parentUUID or profile: %v", name, d.Attributes)
			}
			if len(attrValues(d, "resource.kubernetes.io/numaNode")) != 1 {
				t.Errorf("%s: MIG device without its parent's numaNode", name)
			}
		case slices.Equal(v, []string{"gpu"}):
			whole = append(whole, name)
		default:
			t.Errorf("%s: type %v", name, v)
		}
	}
	sort.Strings(mig)
	sort.Strings(whole)
	if len(mig) != 10 || len(whole) != 5 {
		t.Fatalf("MIG devices %v and whole GPUs %v, want 10 and 5", mig, whole)
	}
	for _, w := range whole {
		if m := minorOf(w); m <= 2 {
			t.Errorf("GPU %s is offered whole while in MIG mode or pending a MIG change", w)
		}
	}

	const ns = "mig"
	e.createNamespace(ns)
	e.kubectlApply(migTemplate(ns, "one-3g", "3g.20gb"))
	e.createPod(ns, "mig-0", "one-3g")
	pod := e.waitPodRunning(ns, "mig-0", 2*time.Minute)
	_, devs := e.allocation(pod)
	if len(devs) != 1 || !strings.Contains(devs[0], "-mig-") {
		t.Fatalf("mig-0 got %v, want one MIG device", devs)
	}
	parent := attrValues(devices[devs[0]], "parentMinor")
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	nodes := rec.Containers[0].DeviceNodes
	caps := 0
	for _, n := range nodes {
		if regexp.MustCompile(`^/dev/nvidia-caps/nvidia-cap\d+$`).MatchString(n) {
			caps++
		}
	}
	if len(parent) != 1 || !slices.Contains(nodes, "/dev/nvidia"+parent[0]) || caps != 2 {
		t.Errorf("mig-0 (%s, parent minor %v): injected %v, want the parent's node and 2 MIG capability nodes", devs[0], parent, nodes)
	}
	t.Logf("mig-0: %s injected %v", devs[0], nodes)

	// A second 3g.20gb does not exist: the claim stays Pending.
	e.createPod(ns, "mig-1", "one-3g")
	msg := e.waitEvent(ns, "mig-1", "FailedScheduling", regexp.MustCompile(`cannot allocate all claims`), 2*time.Minute)
	t.Logf("mig-1 stays Pending: %s", msg)

	eventually(t, time.Minute, func() error {
		l, err := e.admin.EventsV1().Events("").List(t0ctx(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range l.Items {
			if ev.Reason == "GpuNotOffered" && ev.Regarding.Kind == "Node" && ev.Regarding.Name == e.node &&
				strings.Contains(ev.Note, "MIG mode change pending") {
				t.Logf("event on the node: %s", ev.Note)
				return nil
			}
		}
		return fmt.Errorf("no GpuNotOffered event for the MIG-pending GPU among %d events", len(l.Items))
	})
}

// TestNodeEventsInDescribeNode: the plugin's Events on its Node (here GpuNotOffered,
// for the GPU of dgx-a100-mig waiting for a MIG mode change) name the Node's uid, so
// `kubectl describe node` lists them: it selects a Node's Events by kind, name and
// uid (the Node's, or the name for the kubelet's own), never by name alone.
func TestNodeEventsInDescribeNode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-a100-mig"})
	e.waitRegistered(2 * time.Minute)
	node, err := e.admin.CoreV1().Nodes().Get(t0ctx(), e.node, getOpts())
	if err != nil {
		t.Fatal(err)
	}
	var regarding v1.ObjectReference
	eventually(t, time.Minute, func() error {
		l, err := e.admin.EventsV1().Events("").List(t0ctx(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, ev := range l.Items {
			if ev.Reason == "GpuNotOffered" {
				regarding = ev.Regarding
				return nil
			}
		}
		return fmt.Errorf("no GpuNotOffered event yet among %d", len(l.Items))
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := e.c.Kubectl(ctx, "describe", "node", e.node)
	if err != nil {
		t.Fatal(err)
	}
	_, events, _ := strings.Cut(string(out), "\nEvents:")
	if !regexp.MustCompile(`Warning\s+GpuNotOffered\s+.*MIG mode change pending`).MatchString(events) {
		t.Errorf("kubectl describe node %s does not show the plugin's GpuNotOffered event (it regards %+v):\n%s", e.node, regarding, out)
	}
	if regarding.Kind != "Node" || regarding.Name != e.node || regarding.UID != node.UID {
		t.Errorf("GpuNotOffered regards %+v, want Node %s with uid %s", regarding, e.node, node.UID)
	}
	t.Logf("kubectl describe node, events:%s", events)
}
