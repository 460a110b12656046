package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"topodra.dev/tests/e2e/harness"
)

// TestSliceNameSquatting: the plugin identity of another node may create a
// ResourceSlice of its own node under any name the admission policy allows, among
// them this node's old slice name `<node>-gpu.topodra.dev-0`. With fixed names the
// plugin here would apply to that object for ever (spec.pool.name is immutable)
// and never become ready. Its slices are named by the API server now: it
// publishes, turns ready, never writes the squatter's object, and reports it in
// an Event on its Node.
func TestSliceNameSquatting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100"})
	ctx := context.Background()
	e.waitRegistered(60 * time.Second)
	e.waitDevices(8, 60*time.Second)

	// The squatter: node-b's plugin identity, a slice of node-b under node-a's name.
	const other = "gpu-node-b"
	squatted := e.node + "-" + driverName + "-0"
	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "plugin-"+other+".kubeconfig")
	if err := harness.PluginIdentity(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), other, kubeconfig, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	evil := kubernetes.NewForConfigOrDie(cfg).ResourceV1().ResourceSlices()
	if _, err := evil.Create(ctx, policySlice(squatted, other, nil), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the policy refused the squatter, so this test proves nothing new: %v", err)
	}

	// A restart from nothing: the plugin's slices gone, the squatter in place.
	e.plugin.stop(t)
	for _, s := range e.slices(ctx) {
		if err := e.admin.ResourceV1().ResourceSlices().Delete(ctx, s.Name, deleteNow()); err != nil {
			t.Fatal(err)
		}
	}
	e.plugin = e.startPlugin(e.pluginKubeconfig)
	e.waitRegistered(60 * time.Second)
	e.waitDevices(8, 60*time.Second)
	for _, s := range e.slices(ctx) {
		if s.Name == squatted || !strings.HasPrefix(s.Name, e.node+"-"+driverName+"-") {
			t.Errorf("slice %s: not a name the API server generated", s.Name)
		}
	}
	eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + e.plugin.http + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
	got, err := e.admin.ResourceV1().ResourceSlices().Get(ctx, squatted, getOpts())
	if err != nil {
		t.Fatal(err)
	}
	if *got.Spec.NodeName != other || got.Generation != 1 {
		t.Errorf("the squatter was written to: node %s, generation %d", *got.Spec.NodeName, got.Generation)
	}
	for _, f := range got.ManagedFields {
		if strings.Contains(f.Manager, "kubelet-plugin") {
			t.Errorf("the plugin wrote the squatter: %+v", f)
		}
	}
	msg := e.waitEvent("default", e.node, "ResourceSliceNameSquatted", regexp.MustCompile(regexp.QuoteMeta(squatted)), 30*time.Second)
	t.Logf("event: %s", msg)
}
