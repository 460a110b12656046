package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

const exampleDriver = "minimal.example.com"

const exampleObjects = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: minimal.example.com
spec:
  selectors:
    - cel:
        expression: device.driver == "minimal.example.com"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-device
  namespace: example
spec:
  spec:
    devices:
      requests:
        - name: dev
          exactly:
            deviceClassName: minimal.example.com
`

// TestExamplePlugin runs the kubeletplugin crate's example (examples/minimal.rs)
// against the kubelet harness: it registers, publishes its one-device slice, and a
// pod's claim is prepared (the CDI library injects the spec it wrote) and unprepared
// (the spec is gone).
func TestExamplePlugin(t *testing.T) {
	t.Parallel()
	bin := binary(t, "TOPODRA_EXAMPLE_PLUGIN_BIN", filepath.Join("examples", "minimal"))
	e := newEnv(t, envOptions{harnessOnly: true})
	ctx := context.Background()
	cdiDir := filepath.Join(e.dir, "cdi")
	logPath := filepath.Join(e.c.LogsDir, "example-plugin.log")
	p := startProc(t, "example plugin", bin, []string{
		"--node-name=" + e.node, "--kubelet-dir=" + e.kubeletRoot, "--cdi-dir=" + cdiDir,
	}, []string{"KUBECONFIG=" + e.c.Kubeconfig, "RUST_LOG=info"}, logPath, "")
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", logPath, tailFile(logPath, 40))
		}
	})

	regCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := e.h.WaitRegistered(regCtx, exampleDriver); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, func() error {
		l, err := e.admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", e.node),
				fields.OneTermEqualSelector("spec.driver", exampleDriver)).String(),
		})
		if err != nil {
			return err
		}
		if len(l.Items) != 1 || len(l.Items[0].Spec.Devices) != 1 || l.Items[0].Spec.Devices[0].Name != "dev-0" {
			return fmt.Errorf("want one slice with dev-0, got %+v", l.Items)
		}
		if o := l.Items[0].OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].Name != e.node {
			return fmt.Errorf("slice owners %+v, want Node %s", o, e.node)
		}
		return nil
	})

	e.createNamespace("example")
	e.kubectlApply(exampleObjects)
	pod := e.createPod("example", "uses-dev-0", "one-device")
	pod = e.waitPodRunning("example", pod.Name, time.Minute)
	var claimName string
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			claimName = *s.ResourceClaimName
		}
	}
	claim, err := e.admin.ResourceV1().ResourceClaims("example").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 ||
		a.Devices.Results[0].Driver != exampleDriver || a.Devices.Results[0].Pool != e.node || a.Devices.Results[0].Device != "dev-0" {
		t.Fatalf("claim %s allocation %+v, want dev-0 of %s", claimName, claim.Status.Allocation, e.node)
	}
	spec := filepath.Join(cdiDir, fmt.Sprintf("minimal-example-com-%s.json", claim.UID))
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("prepare wrote no CDI spec: %v", err)
	}
	rec, err := readRecord(e, pod)
	if err != nil {
		t.Fatal(err)
	}
	wantID := fmt.Sprintf("%s/device=%s-dev-0", exampleDriver, claim.UID)
	if len(rec.Containers) != 1 || !slices.Equal(rec.Containers[0].CDIDevices, []string{wantID}) ||
		!slices.Contains(rec.Containers[0].Env, "MINIMAL_DEVICE=dev-0") {
		t.Fatalf("injected %+v, want CDI device %s setting MINIMAL_DEVICE=dev-0", rec.Containers, wantID)
	}
	t.Logf("prepared: %s injected MINIMAL_DEVICE=dev-0 from %s", wantID, spec)

	if err := e.admin.CoreV1().Pods("example").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodGone("example", pod.Name, time.Minute)
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Fatalf("the CDI spec outlived the pod (unprepare did not run?): %v", err)
	}
}
