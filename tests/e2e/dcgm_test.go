package e2e

// NVIDIA's DCGM exporter and topodra's drop-in mode (docs/deployment.md, "Per-pod GPU
// metrics with NVIDIA's DCGM exporter"). The exporter labels a GPU's metrics with the
// pod that holds it; under DRA it finds that pod through the kubelet's PodResources
// API and the ResourceSlices, and only for the driver name gpu.nvidia.com. These tests
// run the kubelet's own PodResources server over the harness's DRA manager and redo
// the exporter's mapping (see exporterMapping for where each step comes from), so
// what they check is the part between the plugin and the exporter: names, API
// version and attributes. They run no DCGM and no exporter process.
//
// The exporter's files named below are in github.com/NVIDIA/dcgm-exporter as read at
// commit d5e5f510a1b6 (main after release 4.5.3-4.8.2). Its mapping is an internal/
// package, so it cannot be imported, and the Go module proxy does not serve the module.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"topodra.dev/tests/e2e/harness"
)

// dcgmDriverName is the only DRA driver name the DCGM exporter maps
// (internal/pkg/transformation/const.go, DRAGPUDriverName).
const dcgmDriverName = "gpu.nvidia.com"

// v1beta1Runtime serves resource.k8s.io/v1beta1, which the exporter's ResourceSlice
// informer reads: Kubernetes 1.37 serves only v1 by default (pkg/controlplane,
// betaAPIGroupVersionsDisabledByDefault).
const v1beta1Runtime = "--runtime-config=resource.k8s.io/v1beta1=true"

// dcgmDevice is what the exporter keeps per device of a gpu.nvidia.com slice, keyed
// by "<pool>/<device>" (internal/pkg/transformation/dra.go, onAddOrUpdate): the UUID
// of a whole GPU, or a MIG device's parent UUID, profile and own UUID.
type dcgmDevice struct {
	uuid                        string // type "gpu"
	parentUUID, profile, migUID string // type "mig"
}

// dcgmPod is one entry of the exporter's DRA map (kubernetes.go, toDeviceToPodsDRA),
// as the labels it puts on the GPU's metrics (kubernetes.go, Process: pod,
// namespace, container, dra_*).
type dcgmPod map[string]string

// exporterSlices reads the ResourceSlices as the exporter does: resource.k8s.io
// v1beta1, every slice of the cluster, only those of driver gpu.nvidia.com, each
// device's attributes under basic (dra.go, NewDRAResourceSliceManager and
// onAddOrUpdate; the exporter watches through an informer, this lists once). Devices
// of an unknown type are skipped; a MIG device without parentUUID too.
func exporterSlices(t *testing.T, client kubernetes.Interface) map[string]dcgmDevice {
	t.Helper()
	l, err := client.ResourceV1beta1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing resource.k8s.io/v1beta1 ResourceSlices as the exporter: %v", err)
	}
	str := func(a map[resourcev1beta1.QualifiedName]resourcev1beta1.DeviceAttribute, k resourcev1beta1.QualifiedName) string {
		if v, ok := a[k]; ok && v.StringValue != nil {
			return *v.StringValue
		}
		return ""
	}
	out := map[string]dcgmDevice{}
	for _, s := range l.Items {
		if s.Spec.Driver != dcgmDriverName {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Basic == nil || d.Basic.Attributes == nil {
				continue
			}
			// The bare names: the exporter looks the attributes up without the
			// driver's domain, as drivers write them.
			a := d.Basic.Attributes
			key := s.Spec.Pool.Name + "/" + d.Name
			switch str(a, "type") {
			case "gpu":
				if u := str(a, "uuid"); u != "" {
					out[key] = dcgmDevice{uuid: u}
				}
			case "mig":
				if p := str(a, "parentUUID"); p != "" {
					out[key] = dcgmDevice{parentUUID: p, profile: str(a, "profile"), migUID: str(a, "uuid")}
				}
			}
		}
	}
	return out
}

// exporterMapping is the exporter's pod mapping under DRA (kubernetes.go,
// toDeviceToPodsDRA): for each pod and container of the PodResources List, each
// claim resource of driver gpu.nvidia.com is looked up by pool and device name in the
// slices; a whole GPU maps to its UUID, a MIG device to its parent's UUID (the key
// the exporter matches a GPU's metrics by, with --kubernetes-gpu-id-type=uid, its
// default), with the MIG profile and UUID as extra labels. A pod and container is
// counted once per GPU.
func exporterMapping(resp *podresourcesapi.ListPodResourcesResponse, devices map[string]dcgmDevice) map[string][]dcgmPod {
	out := map[string][]dcgmPod{}
	seen := map[string]bool{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() != dcgmDriverName {
						continue
					}
					dev, ok := devices[cr.GetPoolName()+"/"+cr.GetDeviceName()]
					if !ok {
						continue
					}
					gpu := dev.uuid
					if dev.parentUUID != "" {
						gpu = dev.parentUUID
					}
					once := gpu + "|" + pod.GetName() + "/" + pod.GetNamespace() + "/" + c.GetName()
					if seen[once] {
						continue
					}
					seen[once] = true
					labels := dcgmPod{
						"pod": pod.GetName(), "namespace": pod.GetNamespace(), "container": c.GetName(),
						"dra_claim_name": dr.GetClaimName(), "dra_claim_namespace": dr.GetClaimNamespace(),
						"dra_driver_name": cr.GetDriverName(), "dra_pool_name": cr.GetPoolName(),
						"dra_device_name": cr.GetDeviceName(),
					}
					if dev.parentUUID != "" {
						labels["dra_mig_profile"] = dev.profile
						labels["dra_mig_device_uuid"] = dev.migUID
					}
					out[gpu] = append(out[gpu], labels)
				}
			}
		}
	}
	return out
}

// listPodResources calls List on the PodResources socket the way the exporter
// dials it: gRPC over the unix socket, no TLS (kubernetes.go, connectToServer and
// listPods).
func listPodResources(t *testing.T, socket string) *podresourcesapi.ListPodResourcesResponse {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("PodResources List: %v", err)
	}
	return resp
}

// servePodResources serves the kubelet's PodResources API for the env's node at the
// kubelet's path under its root, until the test ends.
func (e *env) servePodResources() string {
	e.t.Helper()
	socket := harness.PodResourcesSocket(e.kubeletRoot)
	stop, err := e.h.ServePodResources(context.Background(), socket)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(stop)
	return socket
}

// exporterClient is a client with the exporter's own RBAC: its Helm chart's
// ClusterRole (deployment/templates/clusterrole.yaml: get, list and watch on pods
// and resourceslices) bound to a ServiceAccount, so the test reads the slices with no
// more rights than the exporter has.
func (e *env) exporterClient() kubernetes.Interface {
	e.t.Helper()
	ctx := context.Background()
	const ns, name = "gpu-monitoring", "dcgm-exporter"
	e.createNamespace(ns)
	if _, err := e.admin.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-read-pods"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"", "resource.k8s.io"}, Resources: []string{"pods", "resourceslices"},
			Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-read-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name + "-read-pods"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	path := filepath.Join(e.c.Dir, "kubeconfigs", "dcgm-exporter.kubeconfig")
	if err := harness.ServiceAccountKubeconfig(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), ns, name, path, time.Hour); err != nil {
		e.t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		e.t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return client
}

// dropInEnv is an env whose plugin runs under the driver name gpu.nvidia.com with the
// chart's objects rendered for that name (DeviceClass, RBAC, admission policies),
// as `helm install --set driverName=gpu.nvidia.com` deploys them, and an API server
// that serves resource.k8s.io/v1beta1.
func dropInEnv(t *testing.T, profile string) *env {
	t.Helper()
	e := newEnv(t, envOptions{profile: profile, fromChart: true, apiServerArgs: []string{v1beta1Runtime},
		pluginArgs: []string{"--driver-name=" + dcgmDriverName}})
	rendered := helmTemplate(t, e.c.Dir, "--set", "driverName="+dcgmDriverName)
	e.createNamespace(harness.PluginNamespace)
	e.kubectlApply(manifestDocs(t, rendered, func(kind string) bool { return kind != "DaemonSet" && kind != "Deployment" }))
	e.pluginKubeconfig = filepath.Join(e.c.Dir, "kubeconfigs", "plugin-"+e.node+".kubeconfig")
	if err := harness.PluginIdentity(context.Background(), e.admin, e.c.Server, e.c.PKI.CAPEM(), e.node, e.pluginKubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.plugin = e.startPlugin(e.pluginKubeconfig)
	t.Cleanup(func() {
		e.plugin.stop(t)
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", e.plugin.log, tailFile(e.plugin.log, 40))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.h.WaitRegistered(ctx, dcgmDriverName); err != nil {
		t.Fatalf("%v; plugin log:\n%s", err, tailFile(e.plugin.log, 30))
	}
	return e
}

// dropInTemplate is a ResourceClaimTemplate for count devices of the gpu.nvidia.com
// class that pass a CEL selector; attributes are under the driver's own domain,
// gpu.nvidia.com, in drop-in mode.
func dropInTemplate(ns, name, class string, count int, selector string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: %s
  namespace: %s
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: %s
            count: %d
            selectors:
              - cel:
                  expression: %q
`, name, ns, class, count, selector)
}

// v1String is a device's string attribute (bare name, the driver's domain) in v1.
func v1String(d resourceapi.Device, name string) string {
	if v, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

// TestDCGMExporterMapping: with the driver name gpu.nvidia.com and v1beta1 served,
// the exporter's mapping from the kubelet's PodResources List and the v1beta1 slices
// finds exactly the GPUs allocated to each pod: two whole GPUs of one pod by their
// UUIDs, and a MIG device of another pod by its parent's UUID with its profile and
// MIG UUID, each labelled with the pod, container and claim.
func TestDCGMExporterMapping(t *testing.T) {
	t.Parallel()
	e := dropInEnv(t, "dgx-a100-mig")
	devices := e.waitDevicesOf(dcgmDriverName, 7+3+5, time.Minute)

	const ns = "dcgm"
	e.createNamespace(ns)
	dom := `device.attributes["` + dcgmDriverName + `"]`
	e.kubectlApply(dropInTemplate(ns, "two-gpus", dcgmDriverName, 2, dom+`.type == "gpu"`))
	e.kubectlApply(dropInTemplate(ns, "one-3g", "mig.nvidia.com", 1, dom+`.profile == "3g.20gb"`))
	e.createPod(ns, "train", "two-gpus")
	e.createPod(ns, "infer", "one-3g")
	train := e.waitPodRunning(ns, "train", 2*time.Minute)
	infer := e.waitPodRunning(ns, "infer", 2*time.Minute)

	// What the mapping must find, from the allocations and the v1 slices.
	want := map[string]dcgmPod{}
	trainClaim, trainDevs := e.allocationOf(train, dcgmDriverName)
	for _, d := range trainDevs {
		u := v1String(devices[d], "uuid")
		if !strings.HasPrefix(u, "GPU-") || v1String(devices[d], "type") != "gpu" {
			t.Fatalf("train got %s (type %q, uuid %q), want whole GPUs", d, v1String(devices[d], "type"), u)
		}
		want[u] = dcgmPod{"pod": "train", "namespace": ns, "container": "main", "dra_claim_name": trainClaim.Name,
			"dra_claim_namespace": ns, "dra_driver_name": dcgmDriverName, "dra_pool_name": e.node, "dra_device_name": d}
	}
	inferClaim, inferDevs := e.allocationOf(infer, dcgmDriverName)
	if len(inferDevs) != 1 || v1String(devices[inferDevs[0]], "type") != "mig" {
		t.Fatalf("infer got %v, want one MIG device", inferDevs)
	}
	mig := devices[inferDevs[0]]
	want[v1String(mig, "parentUUID")] = dcgmPod{"pod": "infer", "namespace": ns, "container": "main", "dra_claim_name": inferClaim.Name,
		"dra_claim_namespace": ns, "dra_driver_name": dcgmDriverName, "dra_pool_name": e.node, "dra_device_name": inferDevs[0],
		"dra_mig_profile": v1String(mig, "profile"), "dra_mig_device_uuid": v1String(mig, "uuid")}
	if len(want) != 3 {
		t.Fatalf("want %d GPUs, 3 expected (the MIG device's parent is not one of train's GPUs): %v", len(want), want)
	}

	resp := listPodResources(t, e.servePodResources())
	slicesSeen := exporterSlices(t, e.exporterClient())
	if len(slicesSeen) != len(devices) {
		t.Errorf("the exporter's v1beta1 view has %d devices, the v1 slices %d: %v", len(slicesSeen), len(devices), slicesSeen)
	}
	got := exporterMapping(resp, slicesSeen)
	for gpu, pods := range got {
		if len(pods) != 1 {
			t.Errorf("GPU %s maps to %d pods, want 1: %v", gpu, len(pods), pods)
			continue
		}
		w, ok := want[gpu]
		if !ok {
			t.Errorf("GPU %s maps to %v, but no pod holds it", gpu, pods[0])
			continue
		}
		if fmt.Sprint(pods[0]) != fmt.Sprint(w) {
			t.Errorf("GPU %s: labels\n  %v\nwant\n  %v", gpu, pods[0], w)
		}
	}
	for gpu, w := range want {
		if _, ok := got[gpu]; !ok {
			t.Errorf("GPU %s of pod %s has no mapping; PodResources said %v", gpu, w["pod"], resp)
		}
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("exporter mapping: %s -> %v", k, got[k])
	}
}

// TestDCGMDefaultDriverNameUnmapped: the defect the drop-in mode fixes. Under
// topodra's default driver name the kubelet reports the pod's GPUs in PodResources,
// the slices are there in v1beta1, and still the exporter's mapping finds nothing,
// because it skips every driver but gpu.nvidia.com.
func TestDCGMDefaultDriverNameUnmapped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100", apiServerArgs: []string{v1beta1Runtime}})
	e.waitRegistered(2 * time.Minute)
	e.waitDevices(8, time.Minute)
	const ns = "dcgm"
	e.createNamespace(ns)
	e.kubectlApply(claimTemplate(ns, "one", 1, ""))
	e.createPod(ns, "train", "one")
	e.waitPodRunning(ns, "train", 2*time.Minute)

	resp := listPodResources(t, e.servePodResources())
	var drivers []string
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					drivers = append(drivers, cr.GetDriverName())
				}
			}
		}
	}
	if !slices.Equal(drivers, []string{driverName}) {
		t.Fatalf("PodResources reports claim resources of drivers %v, want [%s]", drivers, driverName)
	}
	beta, err := e.admin.ResourceV1beta1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(beta.Items) == 0 {
		t.Fatalf("v1beta1 slices: %v (%d)", err, len(beta.Items))
	}
	if got := exporterMapping(resp, exporterSlices(t, e.exporterClient())); len(got) != 0 {
		t.Fatalf("the exporter's mapping found %v under driver %s", got, driverName)
	}
	t.Logf("under %s: PodResources reports the claim, the exporter's mapping finds no GPU", driverName)
}

// TestDCGMChartDropIn: `--set driverName=gpu.nvidia.com` is the whole drop-in
// configuration of the chart; every object the chart derives from the name follows
// it, and nothing of topodra's own name is left but the opaque config's API group
// (gpu.topodra.dev/v1alpha1, which names the schema, not the driver).
func TestDCGMChartDropIn(t *testing.T) {
	t.Parallel()
	rendered := helmTemplate(t, t.TempDir(), "--set", "driverName="+dcgmDriverName)
	b, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for i, line := range strings.Split(text, "\n") {
		if strings.Contains(strings.ReplaceAll(line, "gpu.topodra.dev/v1alpha1", ""), "gpu.topodra.dev") {
			t.Errorf("rendered line %d still names gpu.topodra.dev: %s", i+1, strings.TrimSpace(line))
		}
	}
	classes := map[string]string{}
	for _, doc := range strings.Split(manifestDocs(t, rendered, func(k string) bool { return k == "DeviceClass" }), "\n---\n") {
		c := decode[*resourceapi.DeviceClass](t, doc)
		var exprs []string
		for _, s := range c.Spec.Selectors {
			exprs = append(exprs, s.CEL.Expression)
		}
		classes[c.Name] = strings.Join(exprs, " && ")
	}
	// NVIDIA's two classes: whole GPUs, and MIG devices.
	dom := `device.attributes["` + dcgmDriverName + `"]`
	for name, typ := range map[string]string{dcgmDriverName: "gpu", "mig.nvidia.com": "mig"} {
		want := `device.driver == "` + dcgmDriverName + `" && ` + dom + `.type == "` + typ + `"`
		if sel, ok := classes[name]; !ok || sel != want {
			t.Errorf("DeviceClasses %v: want %s selecting %s", classes, name, want)
		}
	}
	ds := decode[*appsv1.DaemonSet](t, manifestDoc(t, rendered, "DaemonSet"))
	dep := decode[*appsv1.Deployment](t, manifestDoc(t, rendered, "Deployment"))
	for what, args := range map[string][]string{
		"the plugin's DaemonSet":      ds.Spec.Template.Spec.Containers[0].Args,
		"the controller's Deployment": dep.Spec.Template.Spec.Containers[0].Args,
	} {
		if !slices.Contains(args, "--driver-name="+dcgmDriverName) {
			t.Errorf("%s: args %v lack --driver-name=%s", what, args, dcgmDriverName)
		}
	}
}
