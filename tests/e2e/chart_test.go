package e2e

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"

	"topodra.dev/tests/cluster"
)

// helmTemplate renders the chart of deploy/helm with extra helm arguments, as
// deploy/render.sh does, and writes it to a file in dir.
func helmTemplate(t *testing.T, dir string, args ...string) string {
	t.Helper()
	helm := helmBinary(t)
	chart := filepath.Join(repoRoot(t), "deploy", "helm", "topodra")
	argv := append([]string{"template", "topodra", chart, "--namespace", "topodra-system", "--kube-version", "1.37.0"}, args...)
	out, err := exec.Command(helm, argv...).Output()
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(argv, " "), err)
	}
	f := filepath.Join(dir, "rendered.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// helmBinary is the pinned helm of the tools cache, or skips (fails with tools
// required).
func helmBinary(t *testing.T) string {
	t.Helper()
	helm, err := cluster.FindTool(os.Getenv(cluster.ToolsEnv), "helm")
	if err != nil {
		if cluster.RequireTools() {
			t.Fatal(err)
		}
		t.Skipf("skipping: %v", err)
	}
	return helm
}

// decode parses one manifest document into its typed object.
func decode[T any](t *testing.T, doc string) T {
	t.Helper()
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
	if err != nil {
		t.Fatalf("decoding:\n%s\n%v", doc, err)
	}
	typed, ok := obj.(T)
	if !ok {
		t.Fatalf("decoded a %T", obj)
	}
	return typed
}

// TestChartHTTPEndpointExposure checks what the chart does for the plugin's HTTP
// endpoint against the real API server: by default the DaemonSet binds it to the
// pod's IP (downward API) and no NetworkPolicy is rendered; with
// networkPolicy.enabled one policy per component (the plugin's, the controller's)
// admits only that component's HTTP port from the configured namespaces and pods and
// selects exactly its pods, and the API server accepts every object.
func TestChartHTTPEndpointExposure(t *testing.T) {
	t.Parallel()
	manifests := filepath.Join(repoRoot(t), "deploy", "manifests", "topodra.yaml")
	if docs := manifestDocs(t, manifests, func(string) bool { return true }); strings.Contains(docs, "kind: NetworkPolicy") {
		t.Errorf("the default manifests have a NetworkPolicy; it is off by default")
	}
	ds := decode[*appsv1.DaemonSet](t, manifestDoc(t, manifests, "DaemonSet"))
	c0 := ds.Spec.Template.Spec.Containers[0]
	i := slices.IndexFunc(c0.Env, func(e v1.EnvVar) bool { return e.Name == "TOPODRA_HTTP_BIND_ADDRESS" })
	if i < 0 || c0.Env[i].ValueFrom == nil || c0.Env[i].ValueFrom.FieldRef == nil || c0.Env[i].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("TOPODRA_HTTP_BIND_ADDRESS is not the pod IP from the downward API: %+v", c0.Env)
	}
	for _, want := range []string{"--http-port=9464", "--http-header-read-timeout-seconds=5", "--http-max-connections=32",
		"--max-concurrent-claims-per-call=16", "--max-concurrent-claims=64"} {
		if !slices.Contains(c0.Args, want) {
			t.Errorf("DaemonSet args lack %s: %v", want, c0.Args)
		}
	}
	if slices.ContainsFunc(c0.Args, func(a string) bool {
		return strings.HasPrefix(a, "--http-addr") || strings.HasPrefix(a, "--http-bind-address")
	}) {
		t.Errorf("a flag overrides the pod IP: %v", c0.Args)
	}
	if ds.Spec.Template.Spec.HostNetwork {
		t.Errorf("the DaemonSet uses hostNetwork: the pod IP would be the node's, and NetworkPolicy would not apply")
	}

	e := manifestsOnlyEnv(t)
	admin := e.admin
	rendered := helmTemplate(t, t.TempDir(),
		"--set", "networkPolicy.enabled=true",
		"--set", "networkPolicy.namespaceSelector.matchLabels.team=observability",
		"--set", "networkPolicy.podSelector.matchLabels.app=prometheus",
		"--set", "kubeletPlugin.httpPort=9500")
	rds := decode[*appsv1.DaemonSet](t, manifestDoc(t, rendered, "DaemonSet"))
	rctl := decode[*appsv1.Deployment](t, manifestDoc(t, rendered, "Deployment"))
	policies := map[string]*networkingv1.NetworkPolicy{}
	for _, doc := range strings.Split(manifestDoc(t, rendered, "NetworkPolicy"), "\n---\n") {
		np := decode[*networkingv1.NetworkPolicy](t, doc)
		policies[np.Name] = np
	}
	// One policy per component, each selecting exactly its pods and admitting its port.
	for _, c := range []struct {
		name   string
		labels map[string]string
		port   int
	}{
		{"topodra-kubelet-plugin", rds.Spec.Template.Labels, 9500},
		{"topodra-controller", rctl.Spec.Template.Labels, 9465},
	} {
		np, ok := policies[c.name]
		if !ok {
			t.Errorf("no NetworkPolicy %s among %v", c.name, slices.Collect(maps.Keys(policies)))
			continue
		}
		checkNetworkPolicy(t, np, c.labels, c.port)
		for other, np2 := range policies {
			sel, _ := metav1.LabelSelectorAsSelector(&np2.Spec.PodSelector)
			if other != c.name && sel.Matches(labels.Set(c.labels)) {
				t.Errorf("NetworkPolicy %s also selects the pods of %s", other, c.name)
			}
		}
	}

	ctx := context.Background()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, np := range policies {
		if _, err := admin.NetworkingV1().NetworkPolicies("topodra-system").Create(ctx, np, dryRun); err != nil {
			t.Errorf("the API server refuses the NetworkPolicy %s: %v", np.Name, err)
		}
	}
	if _, err := admin.AppsV1().DaemonSets("topodra-system").Create(ctx, ds, dryRun); err != nil {
		t.Errorf("the API server refuses the default DaemonSet: %v", err)
	}
}

// checkNetworkPolicy: np selects the pods with podLabels, admits ingress only, on the
// TCP port only, from one peer with both selectors of the test's values.
func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, podLabels map[string]string, port int) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: podSelector %v does not select the pods %v (%v)", np.Name, np.Spec.PodSelector, podLabels, err)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("%s: policyTypes %v, want [Ingress] only (egress to the API server stays open)", np.Name, np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 1 {
		t.Errorf("%s: %d ingress rules, want 1: %+v", np.Name, len(np.Spec.Ingress), np.Spec.Ingress)
		return
	}
	rule := np.Spec.Ingress[0]
	if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || rule.Ports[0].Port.IntValue() != port || *rule.Ports[0].Protocol != v1.ProtocolTCP {
		t.Errorf("%s: ports %+v, want TCP %d only", np.Name, rule.Ports, port)
	}
	// One peer with both selectors: pods labelled app=prometheus in namespaces
	// labelled team=observability (two peers would admit either).
	if len(rule.From) != 1 || rule.From[0].NamespaceSelector == nil || rule.From[0].PodSelector == nil ||
		rule.From[0].NamespaceSelector.MatchLabels["team"] != "observability" || rule.From[0].PodSelector.MatchLabels["app"] != "prometheus" {
		t.Errorf("%s: from %+v, want one peer with namespaceSelector team=observability and podSelector app=prometheus", np.Name, rule.From)
	}
}

// TestChartHostMounts checks the least-privilege host mounts of the DaemonSet: with
// the driver installed on the host (driverRoot "/", the default) only the host's /usr
// is mounted, read-only, never the host root; with a containerized driver its root
// is; /dev and /sys are read-only; only the kubelet and CDI directories are writable.
func TestChartHostMounts(t *testing.T) {
	t.Parallel()
	check := func(ds *appsv1.DaemonSet, wantDriverPath, wantMountPath string) {
		t.Helper()
		spec := ds.Spec.Template.Spec
		mounts := map[string]v1.VolumeMount{}
		for _, m := range spec.Containers[0].VolumeMounts {
			mounts[m.Name] = m
		}
		writable := []string{}
		for _, vol := range spec.Volumes {
			if vol.HostPath == nil {
				continue
			}
			if vol.HostPath.Path == "/" {
				t.Errorf("volume %s mounts the host root", vol.Name)
			}
			if m := mounts[vol.Name]; !m.ReadOnly {
				writable = append(writable, vol.HostPath.Path)
			}
			if vol.Name == "driver-root" {
				if vol.HostPath.Path != wantDriverPath || mounts[vol.Name].MountPath != wantMountPath {
					t.Errorf("driver root: host %s at %s, want %s at %s", vol.HostPath.Path, mounts[vol.Name].MountPath, wantDriverPath, wantMountPath)
				}
			}
		}
		slices.Sort(writable)
		want := []string{"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi"}
		if !slices.Equal(writable, want) {
			t.Errorf("writable host paths %v, want %v", writable, want)
		}
	}
	manifests := filepath.Join(repoRoot(t), "deploy", "manifests", "topodra.yaml")
	def := decode[*appsv1.DaemonSet](t, manifestDoc(t, manifests, "DaemonSet"))
	check(def, "/usr", "/driver-root/usr")
	rendered := helmTemplate(t, t.TempDir(), "--set", "kubeletPlugin.driverRoot=/run/nvidia/driver")
	check(decode[*appsv1.DaemonSet](t, manifestDoc(t, rendered, "DaemonSet")), "/run/nvidia/driver", "/driver-root")

	// The nvidia-cdi-hook: by default installed from the image into the plugins
	// directory (already writable), nothing more mounted; with cdiHook.hostPath the
	// host toolkit's hook, read-only at its own path, and a missing file fails the pod.
	hookEnv := func(ds *appsv1.DaemonSet) (string, bool) {
		for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "TOPODRA_CDI_HOOK_HOST_PATH" || e.Name == "TOPODRA_CDI_HOOK_SOURCE" {
				return e.Name + "=" + e.Value, true
			}
		}
		return "", false
	}
	if env, ok := hookEnv(def); ok {
		t.Errorf("default DaemonSet sets %s", env)
	}
	for _, v := range def.Spec.Template.Spec.Volumes {
		if v.Name == "cdi-hook" {
			t.Error("default DaemonSet mounts a host nvidia-cdi-hook")
		}
	}
	const host = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
	ds := decode[*appsv1.DaemonSet](t, manifestDoc(t, helmTemplate(t, t.TempDir(), "--set", "kubeletPlugin.cdiHook.hostPath="+host), "DaemonSet"))
	check(ds, "/usr", "/driver-root/usr")
	if env, _ := hookEnv(ds); env != "TOPODRA_CDI_HOOK_HOST_PATH="+host {
		t.Errorf("with cdiHook.hostPath the plugin gets %q", env)
	}
	var vol *v1.Volume
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "cdi-hook" {
			vol = &ds.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.HostPath == nil || vol.HostPath.Path != host || vol.HostPath.Type == nil || *vol.HostPath.Type != v1.HostPathFile {
		t.Fatalf("cdi-hook volume %+v, want hostPath %s of type File", vol, host)
	}
	found := false
	for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.Name == "cdi-hook" {
			found = true
			if m.MountPath != host || !m.ReadOnly {
				t.Errorf("cdi-hook mounted at %s (read-only %v), want %s read-only", m.MountPath, m.ReadOnly, host)
			}
		}
	}
	if !found {
		t.Error("the cdi-hook volume is not mounted")
	}
}
