package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"topodra.dev/tests/e2e/harness"
)

// TestAPFSeparatesThePreparePath sends requests with the plugin's real identity (a
// token bound to a pod on node-b) to the real API server with the APF objects of
// deploy/manifests, and reads the priority level the server classified each into
// from its X-Kubernetes-PF-PriorityLevel-UID response header: claim reads (what a pod
// waits on to start) go to the plugin's prepare level, everything else (slices, the
// Node) to its publishing level, so no amount of publishing delays a claim read.
func TestAPFSeparatesThePreparePath(t *testing.T) {
	e := manifestsOnlyEnv(t)
	c, admin := e.c, e.admin
	ctx := context.Background()

	levels := map[string]string{}
	for _, name := range []string{"topodra-kubelet-plugin", "topodra-kubelet-plugin-prepare"} {
		pl, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		levels[string(pl.UID)] = name
	}

	kubeconfig := filepath.Join(c.Dir, "kubeconfigs", "plugin-node-b.kubeconfig")
	if err := harness.PluginIdentity(ctx, admin, c.Server, c.PKI.CAPEM(), "node-b", kubeconfig, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	levelOf := func(path string) (string, error) {
		resp, err := client.Get(cfg.Host + path)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		uid := resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")
		if name, ok := levels[uid]; ok {
			return name, nil
		}
		return "", fmt.Errorf("GET %s: status %d, priority level %q is not one of ours", path, resp.StatusCode, uid)
	}
	for path, want := range map[string]string{
		"/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-1":            "topodra-kubelet-plugin-prepare",
		"/apis/resource.k8s.io/v1/namespaces/team-b/resourceclaims/claim-2":            "topodra-kubelet-plugin-prepare",
		"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-b": "topodra-kubelet-plugin",
		"/api/v1/nodes/node-b": "topodra-kubelet-plugin",
	} {
		// The API server picks up new APF objects in the background.
		eventually(t, time.Minute, func() error {
			got, err := levelOf(path)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("GET %s went to %s, want %s", path, got, want)
			}
			return nil
		})
		t.Logf("GET %s -> %s", path, want)
	}
}
