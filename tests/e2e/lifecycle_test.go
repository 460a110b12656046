package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// lifecycleTemplates asks for 4 GPUs of one NUMA node if there are, otherwise any 4.
var lifecycleTemplates = claimSpec{ns: "life", name: "aligned-then-any", firstAvailable: []claimSpec{
	{name: "aligned", count: 4, match: "resource.kubernetes.io/numaNode"},
	{name: "any", count: 4},
}}.yaml()

// numaSelector is a CEL selector for the GPUs of one NUMA node.
func numaSelector(node int) string {
	return fmt.Sprintf(`device.attributes["resource.kubernetes.io"].numaNode == %d`, node)
}

// badConfigTemplate has an opaque config the plugin refuses at prepare time (a
// misspelled field, requireAlignedd); the chart's admission policy refuses it
// already at creation.
var badConfigTemplate = claimSpec{ns: "life", name: "bad-config", count: 1, parameters: "numa:\n  requireAlignedd: true\n"}.yaml()

// TestDGXH100Lifecycle: firstAvailable (aligned if possible, otherwise any), a bad
// opaque config surfacing in the pod's events, a plugin restart with claims
// prepared, and the kubelet wiping the slices of a plugin gone for 30 s.
func TestDGXH100Lifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100"})
	ctx := context.Background()
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8, time.Minute)
	const ns = "life"
	e.createNamespace(ns)
	e.kubectlApply(lifecycleTemplates +
		"---\n" + claimSpec{ns: "life", name: "one-gpu-numa0", count: 1, selector: numaSelector(0)}.yaml() +
		"---\n" + claimSpec{ns: "life", name: "one-gpu-numa1", count: 1, selector: numaSelector(1)}.yaml())
	top := t

	t.Run("firstAvailable aligned when possible, otherwise any", func(t *testing.T) {
		e.t = t
		e.createPod(ns, "fa-aligned", "aligned-then-any")
		pod := e.waitPodRunning(ns, "fa-aligned", 2*time.Minute)
		claim, devs := e.allocation(pod)
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Request != "gpus/aligned" {
				t.Errorf("fa-aligned: result %s/%s for request %q, want gpus/aligned", r.Pool, r.Device, r.Request)
			}
		}
		numas := map[int64]bool{}
		for _, d := range devs {
			numas[numaOf(t, devices[d])] = true
		}
		if len(numas) != 1 {
			t.Errorf("fa-aligned: %v span NUMA nodes %v", devs, numas)
		}
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "fa-aligned", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "fa-aligned", time.Minute)

		// One GPU taken on each NUMA node: 3+3 free, no four on one node.
		e.createPod(ns, "one-0", "one-gpu-numa0")
		e.createPod(ns, "one-1", "one-gpu-numa1")
		e.waitPodRunning(ns, "one-0", 2*time.Minute)
		e.waitPodRunning(ns, "one-1", 2*time.Minute)
		e.createPod(ns, "fa-any", "aligned-then-any")
		pod = e.waitPodRunning(ns, "fa-any", 2*time.Minute)
		claim, devs = e.allocation(pod)
		numas = map[int64]bool{}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Request != "gpus/any" {
				t.Errorf("fa-any: result %s for request %q, want gpus/any", r.Device, r.Request)
			}
			numas[numaOf(t, devices[r.Device])] = true
		}
		if len(devs) != 4 || len(numas) != 2 {
			t.Errorf("fa-any: %v on NUMA nodes %v, want 4 GPUs across both", devs, numas)
		}
		t.Logf("fa-any fell back to %v across NUMA nodes %v", devs, numas)
	})

	t.Run("bad opaque config names the field in the pod's events", func(t *testing.T) {
		e.t = t
		// Free a GPU so the pod can be scheduled.
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "one-0", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "one-0", time.Minute)
		// With the chart's opaque config policy the template cannot even be created;
		// without it (a cluster that left configPolicy off, or a template from before
		// the policy) the plugin refuses the config at prepare time.
		err := e.kubectlApplyErr(badConfigTemplate)
		if err == nil || !strings.Contains(err.Error(), "spec.spec.devices.config[0].opaque.parameters.numa.requireAlignedd: unknown field") {
			t.Fatalf("creating the bad-config template: %v, want refused by the opaque config policy", err)
		}
		t.Logf("bad-config template refused at creation: %v", err)
		if err := e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, configPolicy, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, func() error { return e.kubectlApplyErr(badConfigTemplate) })
		e.createPod(ns, "bad", "bad-config")
		msg := e.waitEvent(ns, "bad", "FailedPrepareDynamicResources", regexp.MustCompile(`requireAlignedd`), 2*time.Minute)
		t.Logf("event: %s", msg)
		p, err := e.admin.CoreV1().Pods(ns).Get(ctx, "bad", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == "Running" {
			t.Errorf("pod with a bad config is Running")
		}
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "bad", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "bad", time.Minute)
	})

	t.Run("plugin restart with claims prepared", func(t *testing.T) {
		e.t = t
		pod, err := e.admin.CoreV1().Pods(ns).Get(ctx, "fa-any", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claim, _ := e.allocation(pod)
		spec := filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_"+string(claim.UID)+".json")
		if _, err := os.Stat(spec); err != nil {
			t.Fatal(err)
		}
		e.plugin.stop(t)
		e.plugin = e.startPlugin(e.pluginKubeconfig)
		e.waitRegistered(time.Minute)
		// Prepare after the restart.
		e.createPod(ns, "after-restart", "one-gpu-numa0")
		e.waitPodRunning(ns, "after-restart", 2*time.Minute)
		// Unprepare of a claim prepared before the restart.
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "fa-any", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "fa-any", time.Minute)
		if _, err := os.Stat(spec); !os.IsNotExist(err) {
			t.Errorf("CDI spec of fa-any still there after unprepare: %v", err)
		}
	})

	t.Run("kubelet wipes the slices 30s after the plugin is gone, they come back with it", func(t *testing.T) {
		e.t = t
		e.plugin.stop(t)
		stopped := time.Now()
		eventually(t, 30*time.Second, func() error {
			if e.h.Registered(driverName) {
				return errString("still registered")
			}
			return nil
		})
		// Still there well inside the grace period.
		time.Sleep(time.Until(stopped.Add(20 * time.Second)))
		if n := len(e.slices(ctx)); n == 0 {
			t.Fatalf("slices wiped after %s, before the kubelet's 30s", time.Since(stopped))
		}
		eventually(t, 45*time.Second, func() error {
			if n := len(e.slices(ctx)); n > 0 {
				return errString("slices still there")
			}
			return nil
		})
		t.Logf("slices wiped %s after the plugin stopped", time.Since(stopped).Round(time.Second))
		e.plugin = e.startPlugin(e.pluginKubeconfig)
		e.waitRegistered(time.Minute)
		e.waitDevices(8, time.Minute)
	})
	e.t = top
}

type errString string

func (e errString) Error() string { return string(e) }
