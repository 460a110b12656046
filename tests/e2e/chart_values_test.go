package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// helmTemplateOut renders the chart as helmTemplate does and returns what helm
// printed on stderr when it refused the values.
func helmTemplateOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	chart := filepath.Join(repoRoot(t), "deploy", "helm", "topodra")
	argv := append([]string{"template", "topodra", chart, "--namespace", "topodra-system", "--kube-version", "1.37.0"}, args...)
	var stderr bytes.Buffer
	cmd := exec.Command(helmBinary(t), argv...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return stderr.String(), err
	}
	return string(out), nil
}

// TestChartRefusesValuesThatCannotWork: values that pass YAML but break every node,
// or silently do nothing, fail `helm template` (so `helm install`) naming the value;
// the chart's own checks say the same when schema validation is skipped. Values
// next to them that work still render.
func TestChartRefusesValuesThatCannotWork(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
		want string // in helm's error
	}{
		{"plugin port 0", []string{"--set", "kubeletPlugin.httpPort=0"}, "/kubeletPlugin/httpPort"},
		{"plugin port 70000", []string{"--set", "kubeletPlugin.httpPort=70000"}, "/kubeletPlugin/httpPort"},
		{"controller port 0", []string{"--set", "controller.httpPort=0"}, "/controller/httpPort"},
		{"controller port 65536", []string{"--set", "controller.httpPort=65536"}, "/controller/httpPort"},
		{"driver root with a trailing slash", []string{"--set", "kubeletPlugin.driverRoot=/run/nvidia/driver/"}, "/kubeletPlugin/driverRoot"},
		{"driver root with a doubled slash", []string{"--set", "kubeletPlugin.driverRoot=/run//nvidia"}, "/kubeletPlugin/driverRoot"},
		{"two writers", []string{"--set", "controller.leaderElection.enabled=false"}, "/controller/replicas"},
		{"memory limit in bytes by accident", []string{"--set", "kubeletPlugin.resources.limits.memory=256"}, "/kubeletPlugin/resources/limits/memory"},
		{"memory limit without a unit", []string{"--set-string", "kubeletPlugin.resources.limits.memory=256"}, "/kubeletPlugin/resources/limits/memory"},
		{"controller memory without a unit", []string{"--set", "controller.resources.requests.memory=64"}, "/controller/resources/requests/memory"},
		{"plugin log level verbose", []string{"--set", "kubeletPlugin.logLevel=verbose"}, "/kubeletPlugin/logLevel"},
		{"controller log level verbose", []string{"--set", "controller.logLevel=verbose"}, "/controller/logLevel"},
		{"bare target", []string{"--set", "kubeletPlugin.logLevel=info\\,topodra_node"}, "/kubeletPlugin/logLevel"},
		{"boolean label value", []string{"--set", "kubeletPlugin.nodeSelector.topodra\\.dev/gpu=true"}, "/kubeletPlugin/nodeSelector"},
		// What the schema refuses, the templates refuse too.
		{"no schema: port", []string{"--skip-schema-validation", "--set", "kubeletPlugin.httpPort=70000"}, "kubeletPlugin.httpPort must be a port number from 1 to 65535"},
		{"no schema: driver root", []string{"--skip-schema-validation", "--set", "kubeletPlugin.driverRoot=/run/nvidia/driver/"}, "without a trailing or doubled slash"},
		{"no schema: two writers", []string{"--skip-schema-validation", "--set", "controller.leaderElection.enabled=false"}, "enable leader election or run one replica"},
		{"dashboard namespace not a name", []string{"--set", "metrics.grafanaDashboard.namespace=Monitoring"}, "/metrics/grafanaDashboard/namespace"},
		{"relative hook path", []string{"--set", "kubeletPlugin.cdiHook.hostPath=usr/bin/nvidia-cdi-hook"}, "/kubeletPlugin/cdiHook/hostPath"},
		{"hook path with a trailing slash", []string{"--set", "kubeletPlugin.cdiHook.hostPath=/usr/bin/"}, "/kubeletPlugin/cdiHook/hostPath"},
		{"no schema: hook path", []string{"--skip-schema-validation", "--set", "kubeletPlugin.cdiHook.hostPath=/usr//bin/nvidia-cdi-hook"}, "kubeletPlugin.cdiHook.hostPath must be an absolute path"},
		{"unqualified NUMA alias", []string{"--set", "kubeletPlugin.numaNodeAliases={numaNode}"}, "/kubeletPlugin/numaNodeAliases/0"},
		{"NUMA alias twice", []string{"--set", "kubeletPlugin.numaNodeAliases={dra.net/numaNode,dra.net/numaNode}"}, "/kubeletPlugin/numaNodeAliases"},
		{"NUMA alias in the standard domain", []string{"--set", "kubeletPlugin.numaNodeAliases={resource.kubernetes.io/numaNode}"}, "an alias is another driver's name"},
		{"NUMA alias in our own domain", []string{"--set", "kubeletPlugin.numaNodeAliases={gpu.topodra.dev/numa}"}, "an alias is another driver's name"},
		{"more NUMA aliases than fit", []string{"--set", "kubeletPlugin.numaNodeAliases={a.io/n0,a.io/n1,a.io/n2,a.io/n3,a.io/n4,a.io/n5,a.io/n6,a.io/n7,a.io/n8,a.io/n9}"}, "/kubeletPlugin/numaNodeAliases"},
		{"CPU class on a name the plugin does not publish", []string{"--set", "cpuDriver.alignedClass.enabled=true"}, "add it to kubeletPlugin.numaNodeAliases"},
		{"CPU class without the GPU class", []string{"--set", "cpuDriver.alignedClass.enabled=true", "--set", "kubeletPlugin.numaNodeAliases={dra.net/numaNode}",
			"--set", "alignedClass.enabled=false"}, "needs alignedClass.enabled"},
		{"MIG resource not a profile", []string{"--set", "deviceClass.migExtendedResources={mig-1g.10gb}"}, "/deviceClass/migExtendedResources/0"},
		{"no schema: MIG resource not a profile", []string{"--skip-schema-validation", "--set", "deviceClass.migExtendedResources={1g.10GB}"}, "is not a MIG profile name"},
		{"aligned MIG class named as the MIG class", []string{"--set", "alignedClass.migName=mig.topodra.dev"}, "alignedClass.migName must differ"},
		{"aligned MIG class not a DNS name", []string{"--set", "alignedClass.migName=MIG_aligned"}, "set alignedClass.migName"},
		{"MIG mode without dynamic MIG", []string{"--set", "kubeletPlugin.enableMigMode=true"}, "needs kubeletPlugin.dynamicMig"},
	} {
		out, err := helmTemplateOut(t, c.args...)
		if err == nil {
			t.Errorf("%s (%v): rendered, want a refusal naming %s", c.name, c.args, c.want)
		} else if !strings.Contains(out, c.want) {
			t.Errorf("%s (%v): %v\n%s\nwant it to name %s", c.name, c.args, err, out, c.want)
		}
	}
	for _, args := range [][]string{
		{"--set", "kubeletPlugin.logLevel=info\\,topodra_node=debug\\,kube=WARN"},
		{"--set", "kubeletPlugin.logLevel=off", "--set", "controller.logLevel=trace"},
		{"--set", "kubeletPlugin.driverRoot=/"},
		{"--set", "kubeletPlugin.driverRoot=/run/nvidia/driver"},
		{"--set", "kubeletPlugin.httpPort=1", "--set", "controller.httpPort=65535"},
		{"--set", "controller.replicas=1", "--set", "controller.leaderElection.enabled=false"},
		{"--set", "controller.enabled=false", "--set", "controller.leaderElection.enabled=false"},
		{"--set-string", "kubeletPlugin.resources.limits.memory=0.5Gi", "--set", "controller.resources.limits.memory=1G"},
		{"--set", "kubeletPlugin.cdiHook.hostPath=/usr/bin/nvidia-cdi-hook"},
		{"--set", "kubeletPlugin.cdiHook.hostPath="},
		{"--set", "kubeletPlugin.numaNodeAliases={dra.net/numaNode}", "--set", "cpuDriver.alignedClass.enabled=true"},
		{"--set", "cpuDriver.alignedClass.enabled=true", "--set", "cpuDriver.alignedClass.numaAttribute=resource.kubernetes.io/numaNode"},
		{"--set", "cpuDriver.name="},
		{"--set", "deviceClass.migExtendedResources={1g.10gb,1g.10gb+me,7g.80gb}"},
		{"--set", "kubeletPlugin.dynamicMig=true", "--set", "kubeletPlugin.enableMigMode=true"},
	} {
		if out, err := helmTemplateOut(t, args...); err != nil {
			t.Errorf("%v: refused: %v\n%s", args, err, out)
		}
	}
}

// TestChartNodeSelection: by default the plugin runs on a node with any one of the
// labels NVIDIA's charts select GPU nodes by (NFD's PCI vendor, NFD's Tegra CPU
// vendor, GPU feature discovery's gpu.present), and on no other node; a nodeSelector
// or an affinity of the user's replaces that default instead of being ANDed with it.
// Matching is the scheduler's and the DaemonSet controller's own code
// (component-helpers nodeaffinity); the API server accepts each DaemonSet.
func TestChartNodeSelection(t *testing.T) {
	t.Parallel()
	node := func(labels map[string]string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}}
	}
	nfd := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"}
	tegra := map[string]string{"feature.node.kubernetes.io/cpu-model.vendor_id": "NVIDIA"}
	operator := map[string]string{"nvidia.com/gpu.present": "true"}
	cpuOnly := map[string]string{"feature.node.kubernetes.io/cpu-model.vendor_id": "AMD", "nvidia.com/gpu.present": "false"}
	own := map[string]string{"topodra.dev/gpu": "true"}
	ownAndOperator := map[string]string{"topodra.dev/gpu": "true", "nvidia.com/gpu.present": "true"}
	accel := map[string]string{"example.com/accelerator": "h100"}

	affinityValues := filepath.Join(t.TempDir(), "affinity.yaml")
	if err := os.WriteFile(affinityValues, []byte(`kubeletPlugin:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - key: example.com/accelerator
                operator: In
                values: [h100, a100]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		args  []string
		runs  []map[string]string
		skips []map[string]string
	}{
		{"default", nil, []map[string]string{nfd, tegra, operator, ownAndOperator}, []map[string]string{cpuOnly, own, accel, {}}},
		{"nodeSelector", []string{"--set-string", "kubeletPlugin.nodeSelector.topodra\\.dev/gpu=true"},
			[]map[string]string{own, ownAndOperator}, []map[string]string{nfd, tegra, operator, accel}},
		{"affinity", []string{"-f", affinityValues}, []map[string]string{accel}, []map[string]string{nfd, tegra, operator, own}},
	}
	e := manifestsOnlyEnv(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, c := range cases {
		ds := decode[*appsv1.DaemonSet](t, manifestDoc(t, helmTemplate(t, t.TempDir(), c.args...), "DaemonSet"))
		spec := ds.Spec.Template.Spec
		if c.name == "nodeSelector" && spec.Affinity != nil {
			t.Errorf("%s: the default affinity is still there, ANDed with the nodeSelector: %+v", c.name, spec.Affinity)
		}
		if c.name != "nodeSelector" && len(spec.NodeSelector) != 0 {
			t.Errorf("%s: a nodeSelector %v is ANDed with the affinity", c.name, spec.NodeSelector)
		}
		required := nodeaffinity.GetRequiredNodeAffinity(&v1.Pod{Spec: spec})
		for want, nodes := range map[bool][]map[string]string{true: c.runs, false: c.skips} {
			for _, labels := range nodes {
				got, err := required.Match(node(labels))
				if err != nil || got != want {
					t.Errorf("%s: node labelled %v: runs the plugin %t (%v), want %t", c.name, labels, got, err, want)
				}
			}
		}
		if _, err := e.admin.AppsV1().DaemonSets("topodra-system").Create(context.Background(), ds, dryRun); err != nil {
			t.Errorf("%s: the API server refuses the DaemonSet: %v", c.name, err)
		}
	}
}

// TestChartOpaqueConfigPolicyFollowsDriverName: with another driverName the policy
// judges the configs whose opaque.driver is that name, with the apiVersion the
// plugin's decoder serves under every driver name (gpu.topodra.dev/v1alpha1: the group
// names the schema, not the installation); configs for the default name are another
// driver's now and are left alone.
func TestChartOpaqueConfigPolicyFollowsDriverName(t *testing.T) {
	t.Parallel()
	const renamed = "gpu.example.com"
	rendered := helmTemplate(t, t.TempDir(), "--set", "driverName="+renamed)
	e := manifestsOnlyEnv(t) // the default policy, replaced by the renamed one below
	e.kubectlApply(manifestDocs(t, rendered, func(kind string) bool {
		return kind == "ValidatingAdmissionPolicy" || kind == "ValidatingAdmissionPolicyBinding" || kind == "DeviceClass"
	}))
	ctx := context.Background()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(driver, params string) error {
		_, err := e.admin.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: renamed}}},
				Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
					Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}},
			}},
		}, dryRun)
		return err
	}
	// Until the renamed policy is loaded, a config for the renamed driver is not judged.
	waitPolicy(t, true, func() error {
		return create(renamed, `{"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": 1}`)
	})

	if err := create(renamed, `{"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": {"requireAligned": true}}`); err != nil {
		t.Errorf("a valid GpuConfig for %s is refused: %v", renamed, err)
	}
	err := create(renamed, `{"apiVersion": "`+renamed+`/v1alpha1", "kind": "GpuConfig"}`)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "invalid GpuConfig for driver "+renamed) ||
		!strings.Contains(err.Error(), "accepts apiVersion gpu.topodra.dev/v1alpha1") {
		t.Errorf("apiVersion %s/v1alpha1: %v, want the policy's refusal naming gpu.topodra.dev/v1alpha1", renamed, err)
	}
	if err := create(driverName, `{"apiVersion": 7}`); err != nil {
		t.Errorf("a config for %s, another driver now, is judged: %v", driverName, err)
	}
}

// TestChartServiceMonitors: one ServiceMonitor per component, each switched on its
// own; the plugin's keeps the node name as `node` (the alerts group by it), the
// controller's the pod name as `pod` (replicas report the same figures), and the
// operator's own relabelings and metricRelabelings follow on both.
func TestChartServiceMonitors(t *testing.T) {
	t.Parallel()
	type endpoint struct {
		Relabelings       []map[string]any `json:"relabelings"`
		MetricRelabelings []map[string]any `json:"metricRelabelings"`
	}
	type monitor struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Spec     struct {
			Endpoints []endpoint `json:"endpoints"`
		} `json:"spec"`
	}
	render := func(args ...string) map[string]monitor {
		t.Helper()
		rendered := helmTemplate(t, t.TempDir(), append([]string{"--set", "metrics.serviceMonitor.enabled=true"}, args...)...)
		out := map[string]monitor{}
		for _, doc := range strings.Split(manifestDoc(t, rendered, "ServiceMonitor"), "\n---\n") {
			var m monitor
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				t.Fatal(err)
			}
			out[m.Metadata.Name] = m
		}
		return out
	}
	target := func(e endpoint, i int) string {
		if i >= len(e.Relabelings) {
			return ""
		}
		return fmt.Sprint(e.Relabelings[i]["sourceLabels"], "->", e.Relabelings[i]["targetLabel"])
	}
	all := render("--set", "metrics.serviceMonitor.relabelings[0].targetLabel=cluster",
		"--set", "metrics.serviceMonitor.relabelings[0].replacement=gpu-west",
		"--set", "metrics.serviceMonitor.metricRelabelings[0].action=drop",
		"--set", "metrics.serviceMonitor.metricRelabelings[0].regex=go_.*",
		"--set", "metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__")
	for name, want := range map[string]string{
		"topodra-kubelet-plugin": "[__meta_kubernetes_pod_node_name]->node",
		"topodra-controller":     "[__meta_kubernetes_pod_name]->pod",
	} {
		m, ok := all[name]
		if !ok || len(m.Spec.Endpoints) != 1 {
			t.Errorf("no ServiceMonitor %s with one endpoint: %+v", name, all)
			continue
		}
		e := m.Spec.Endpoints[0]
		if got := target(e, 0); got != want {
			t.Errorf("%s: first relabeling %s, want %s", name, got, want)
		}
		if len(e.Relabelings) != 2 || e.Relabelings[1]["targetLabel"] != "cluster" {
			t.Errorf("%s: the operator's relabeling does not follow the chart's: %v", name, e.Relabelings)
		}
		if len(e.MetricRelabelings) != 1 || e.MetricRelabelings[0]["action"] != "drop" {
			t.Errorf("%s: metricRelabelings %v", name, e.MetricRelabelings)
		}
	}
	if got := render("--set", "metrics.serviceMonitor.controller.enabled=false"); len(got) != 1 || got["topodra-kubelet-plugin"].Metadata.Name == "" {
		t.Errorf("with the controller's switched off: %v", got)
	}
	if got := render("--set", "metrics.serviceMonitor.kubeletPlugin.enabled=false"); len(got) != 1 || got["topodra-controller"].Metadata.Name == "" {
		t.Errorf("with the plugin's switched off: %v", got)
	}
}

// TestChartImageReferences: registry, repository, tag and digest make each pod's image
// reference; global.imageRegistry replaces both registries (what make push's values
// file sets); pull secrets from global and the chart's own list reach both pods, each
// once; a repository that still starts with a registry host (the chart before 0.4
// took it whole) is refused with how to split it, rather than pulled from
// ghcr.io/topodra/ghcr.io/....
func TestChartImageReferences(t *testing.T) {
	t.Parallel()
	images := func(args ...string) (plugin, controller string, secrets [][]string) {
		t.Helper()
		out, err := helmTemplateOut(t, args...)
		if err != nil {
			t.Fatalf("helm template %v: %v\n%s", args, err, out)
		}
		for _, doc := range strings.Split(out, "\n---\n") {
			var obj struct {
				Kind string `json:"kind"`
				Spec struct {
					Template struct {
						Spec v1.PodSpec `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range obj.Spec.Template.Spec.ImagePullSecrets {
				names = append(names, s.Name)
			}
			switch obj.Kind {
			case "DaemonSet":
				plugin = obj.Spec.Template.Spec.Containers[0].Image
				secrets = append(secrets, names)
			case "Deployment":
				controller = obj.Spec.Template.Spec.Containers[0].Image
				secrets = append(secrets, names)
			}
		}
		return plugin, controller, secrets
	}
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for _, c := range []struct {
		name               string
		args               []string
		plugin, controller string
		secrets            []string
	}{
		{"defaults", nil, "ghcr.io/topodra/topodra-kubelet-plugin:0.1.0", "ghcr.io/topodra/topodra-controller:0.1.0", nil},
		{"global registry and digests, as make push writes them",
			[]string{"--set", "global.imageRegistry=registry.example.com:5000/gpu", "--set", "image.digest=" + d1, "--set", "controller.image.digest=" + d1},
			"registry.example.com:5000/gpu/topodra-kubelet-plugin:0.1.0@" + d1, "registry.example.com:5000/gpu/topodra-controller:0.1.0@" + d1, nil},
		{"own registries and a tag",
			[]string{"--set", "image.registry=a.example.com", "--set", "controller.image.registry=b.example.com/x", "--set", "image.tag=dev"},
			"a.example.com/topodra-kubelet-plugin:dev", "b.example.com/x/topodra-controller:0.1.0", nil},
		{"no registry: the repository is the whole name",
			[]string{"--set", "image.registry=", "--set", "controller.image.registry=", "--set", "image.repository=docker.io/me/plugin"},
			"docker.io/me/plugin:0.1.0", "topodra-controller:0.1.0", nil},
		{"pull secrets from both lists, each once",
			[]string{"--set", "global.imagePullSecrets[0].name=a", "--set", "imagePullSecrets[0].name=b", "--set", "imagePullSecrets[1].name=a"},
			"ghcr.io/topodra/topodra-kubelet-plugin:0.1.0", "ghcr.io/topodra/topodra-controller:0.1.0", []string{"a", "b"}},
	} {
		plugin, controller, secrets := images(c.args...)
		if plugin != c.plugin || controller != c.controller {
			t.Errorf("%s: plugin %s, controller %s; want %s, %s", c.name, plugin, controller, c.plugin, c.controller)
		}
		if len(secrets) != 2 {
			t.Fatalf("%s: rendered %d pod templates, want the DaemonSet and the Deployment", c.name, len(secrets))
		}
		for _, got := range secrets {
			if strings.Join(got, ",") != strings.Join(c.secrets, ",") {
				t.Errorf("%s: imagePullSecrets %v, want %v", c.name, got, c.secrets)
			}
		}
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"old-style repository", []string{"--set", "image.repository=ghcr.io/topodra/topodra-kubelet-plugin"},
			`set the registry to "ghcr.io" and the repository to "topodra/topodra-kubelet-plugin"`},
		{"localhost repository", []string{"--set", "controller.image.repository=localhost/c"}, `set the registry to "localhost"`},
		{"tag in the repository", []string{"--set", "image.repository=topodra-kubelet-plugin:1.0"}, "/image/repository"},
		{"scheme in the registry", []string{"--set", "global.imageRegistry=https://r.example.com"}, "/global/imageRegistry"},
		{"trailing slash", []string{"--set", "image.registry=r.example.com/"}, "/image/registry"},
		{"pull secret without a name", []string{"--set", "global.imagePullSecrets[0].x=y"}, "/global/imagePullSecrets/0"},
	} {
		out, err := helmTemplateOut(t, c.args...)
		if err == nil {
			t.Errorf("%s: rendered", c.name)
		} else if !strings.Contains(out, c.want) {
			t.Errorf("%s: helm said %s; want %q in it", c.name, out, c.want)
		}
	}
}
