package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

// imageRootfsEnv names the unpacked root filesystem of the plugin's image (make e2e
// unpacks target/image's OCI layout there).
const imageRootfsEnv = "TOPODRA_IMAGE_ROOTFS"

// imageRootfs is the unpacked plugin image, or skips (fails with tools required).
func imageRootfs(t *testing.T) string {
	t.Helper()
	skip := func(why string) {
		if cluster.RequireTools() {
			t.Fatal(why)
		}
		t.Skip("skipping: " + why)
	}
	dir := os.Getenv(imageRootfsEnv)
	if dir == "" {
		skip(imageRootfsEnv + " is not set (make e2e builds the image and unpacks it)")
	}
	readsReleaseBuild(t)
	if _, err := os.Stat(filepath.Join(dir, "usr", "bin", "topodra-kubelet-plugin")); err != nil {
		t.Fatalf("%s=%s holds no plugin binary: %v", imageRootfsEnv, dir, err)
	}
	if why := canRunContainers(); why != "" {
		skip("running the image " + why)
	}
	return dir
}

// chartDeployment is the chart installed with helm into an env made with fromChart,
// and the DaemonSet's containers run from the image on the env's simulated node.
type chartDeployment struct {
	e      *env
	helm   string
	rootfs string
	values string // values file pointing the chart at the simulated node
	runs   int
}

func newChartDeployment(t *testing.T, e *env, rootfs string, extra ...map[string]any) *chartDeployment {
	t.Helper()
	helm := helmBinary(t)
	// The simulated node's files as an operator would point the chart at a node
	// with a non-standard layout: its kubelet root, CDI directory, driver root and
	// /dev are where the sim laid them out; its NVML (the fake one), hwloc topology,
	// /proc/devices copy and MIG capabilities come in through extraVolumes.
	sim := filepath.Join(e.dir, "sim")
	flag := func(name string) string {
		for _, a := range e.args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				rel, err := filepath.Rel(sim, v)
				if err != nil || strings.HasPrefix(rel, "..") {
					t.Fatalf("--%s=%s is outside the simulated node %s", name, v, sim)
				}
				return rel
			}
		}
		t.Fatalf("topodra-sim-node printed no --%s", name)
		return ""
	}
	port, err := strconv.Atoi(strings.Split(freeAddr(t), ":")[1])
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]any{
		"kubeletPlugin": map[string]any{
			"kubeletDir": e.kubeletRoot,
			"cdiDir":     filepath.Join(e.dir, "cdi"),
			"driverRoot": filepath.Join(sim, flag("driver-root")),
			"devRoot":    filepath.Join(sim, flag("dev-root")),
			"nvmlLib":    "/sim/" + flag("nvml-lib"),
			"hwlocXml":   "/sim/" + flag("hwloc-xml"),
			"httpPort":   port,
			"logFormat":  "text",
			"extraArgs": []string{
				"--proc-devices=/sim/" + flag("proc-devices"),
				"--nvidia-capabilities-dir=/sim/" + flag("nvidia-capabilities-dir"),
			},
			"extraVolumes":      []any{map[string]any{"name": "sim", "hostPath": map[string]any{"path": sim, "type": "Directory"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "sim", "mountPath": "/sim", "readOnly": true}},
		},
	}
	plugin := values["kubeletPlugin"].(map[string]any)
	for _, x := range extra {
		for k, v := range x {
			plugin[k] = v
		}
	}
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(e.c.Dir, "chart-values.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return &chartDeployment{e: e, helm: helm, rootfs: rootfs, values: f}
}

// run runs helm against the env's API server.
func (d *chartDeployment) run(args ...string) string {
	d.e.t.Helper()
	argv := append(args, "--kubeconfig", d.e.c.Kubeconfig, "--namespace", harness.PluginNamespace)
	cmd := exec.Command(d.helm, argv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		d.e.t.Fatalf("helm %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	d.e.t.Logf("helm %s", strings.Join(args, " "))
	return string(out)
}

// daemonSet is the plugin's DaemonSet as the API server holds it now.
func (d *chartDeployment) daemonSet() *appsv1.DaemonSet {
	d.e.t.Helper()
	ds, err := d.e.admin.AppsV1().DaemonSets(harness.PluginNamespace).Get(context.Background(), "topodra-kubelet-plugin", metav1.GetOptions{})
	if err != nil {
		d.e.t.Fatal(err)
	}
	return ds
}

// startPod runs the DaemonSet's container as a new pod of it would run: its own pod
// UID, the plugin identity of this node.
func (d *chartDeployment) startPod(name string) *proc {
	e := d.e
	e.t.Helper()
	d.runs++
	ds := d.daemonSet()
	if e.pluginKubeconfig == "" {
		e.pluginKubeconfig = filepath.Join(e.c.Dir, "kubeconfigs", "plugin-"+e.node+".kubeconfig")
		if err := harness.PluginIdentity(context.Background(), e.admin, e.c.Server, e.c.PKI.CAPEM(), e.node, e.pluginKubeconfig, 2*time.Hour); err != nil {
			e.t.Fatal(err)
		}
	}
	dir := filepath.Join(e.c.Dir, "pods", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	port := ""
	for _, p := range ds.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == "metrics" {
			port = fmt.Sprint(p.ContainerPort)
		}
	}
	r := containerRun{
		rootfs: d.rootfs, spec: ds.Spec.Template.Spec, dir: dir,
		// Each pod its own IP, as pod networks give them: the chart binds the HTTP
		// endpoint to the pod IP, so two pods of a rolling update use the same port.
		id:       podIdentity{node: e.node, uid: fmt.Sprintf("00000000-0000-4000-8000-%012d", d.runs), ip: fmt.Sprintf("127.0.0.%d", 1+d.runs), kubeconfig: e.pluginKubeconfig},
		hostPath: func(p string) string { return p },
	}
	p := r.start(e.t, name, r.id.ip+":"+port)
	e.t.Cleanup(func() {
		p.stop(e.t)
		if e.t.Failed() {
			e.t.Logf("--- tail of %s:\n%s", p.log, tailFile(p.log, 40))
		}
	})
	return p
}

// waitServing waits until the plugin run as pod uid is the one registered with the
// kubelet: its sockets carry the pod UID, so a registration by the old pod does not
// count.
func (d *chartDeployment) waitServing(p *proc, uidSuffix string, timeout time.Duration) {
	e := d.e
	e.t.Helper()
	eventually(e.t, timeout, func() error {
		select {
		case <-p.done:
			e.t.Fatalf("%s exited; log:\n%s", p.what, tailFile(p.log, 40))
		default:
		}
		if ep := e.h.Endpoint(driverName); !strings.Contains(ep, uidSuffix) {
			return fmt.Errorf("registered endpoint %q is not %s's", ep, p.what)
		}
		return nil
	})
	e.t.Logf("%s registered with the kubelet", p.what)
}

// TestImageRunsTheChartsDaemonSet runs the plugin from its own image: the root
// filesystem unpacked from the OCI layout that make image wrote, with the command,
// arguments, environment and host mounts of the DaemonSet that helm installed into
// the real API server (not a copy written for the test), the in-cluster identity a
// pod gets, against the kubelet's own plugin-manager and DRA code. It registers,
// publishes the node's 8 GPUs, and prepares and unprepares a pod's claim, whose CDI
// spec lands in the host's CDI directory. A library the binary needs and the image
// lacks, a path the chart mounts elsewhere than the binary reads, or a flag the
// binary does not know fails here.
func TestImageRunsTheChartsDaemonSet(t *testing.T) {
	t.Parallel()
	rootfs := imageRootfs(t)
	e := newEnv(t, envOptions{profile: "dgx-h100", fromChart: true})
	d := newChartDeployment(t, e, rootfs)
	d.run("install", "topodra", filepath.Join(repoRoot(t), "deploy", "helm", "topodra"), "--values", d.values, "--wait=false", "--create-namespace")
	e.plugin = d.startPod("plugin-image")
	d.waitServing(e.plugin, fmt.Sprintf("%012d", d.runs), 2*time.Minute)
	e.waitDevices(8, time.Minute)

	// The image's nvidia-cdi-hook, installed on the (simulated) host in the plugin's
	// directory under the kubelet's: a regular executable file, byte for byte the
	// image's /usr/bin/nvidia-cdi-hook.
	installed := filepath.Join(e.kubeletRoot, "plugins", driverName, "nvidia-cdi-hook")
	checkInstalledHook(t, installed, filepath.Join(rootfs, "usr", "bin", "nvidia-cdi-hook"))
	if !logHas(e.plugin, "nvidia-cdi-hook ready") || !logHas(e.plugin, installed) {
		t.Errorf("the plugin did not log the installed hook %s; log:\n%s", installed, tailFile(e.plugin.log, 30))
	}

	const ns = "image"
	e.createNamespace(ns)
	e.kubectlApply(twoGPUTemplate(ns))
	e.createPod(ns, "two", "two-gpus")
	pod := e.waitPodRunning(ns, "two", 2*time.Minute)
	claim, devs := e.allocation(pod)
	spec := filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_"+string(claim.UID)+".json")
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the CDI spec of the claim prepared in the image: %v", err)
	}
	t.Logf("claim %s prepared from the image: %v, CDI spec %s", claim.Name, devs, filepath.Base(spec))
	// The spec's hooks run the installed copy: the host path, not the image's.
	checkSpecHooks(t, spec, installed, true)
	if err := e.admin.CoreV1().Pods(ns).Delete(context.Background(), "two", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitPodGone(ns, "two", time.Minute)
	eventually(t, time.Minute, func() error {
		if _, err := os.Stat(spec); err == nil {
			return fmt.Errorf("%s still there after unprepare", spec)
		}
		return nil
	})
}

// checkInstalledHook checks that the plugin installed the hook at path as a regular,
// executable file with the bytes of want (the image's copy).
func checkInstalledHook(t *testing.T, path, want string) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("the installed nvidia-cdi-hook: %v", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm() != 0o755 {
		t.Errorf("%s: mode %v, want a regular file with mode 0755", path, st.Mode())
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, image) {
		t.Errorf("%s (%d bytes) is not %s (%d bytes)", path, len(got), want, len(image))
	}
}

// checkSpecHooks checks that every hook of the CDI spec (its containerEdits and its
// devices') runs the hook at path, and with atLeastOne that there is a hook.
func checkSpecHooks(t *testing.T, spec, path string, atLeastOne bool) {
	t.Helper()
	raw, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	type edits struct {
		Hooks []struct {
			HookName string `json:"hookName"`
			Path     string `json:"path"`
			Args     []string
		} `json:"hooks"`
	}
	var doc struct {
		ContainerEdits edits `json:"containerEdits"`
		Devices        []struct {
			ContainerEdits edits `json:"containerEdits"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", spec, err)
	}
	all := []edits{doc.ContainerEdits}
	for _, d := range doc.Devices {
		all = append(all, d.ContainerEdits)
	}
	n := 0
	for _, e := range all {
		for _, h := range e.Hooks {
			n++
			if h.Path != path {
				t.Errorf("%s: hook %s %v runs %s, want %s", filepath.Base(spec), h.HookName, h.Args, h.Path, path)
			}
		}
	}
	if atLeastOne && n == 0 {
		t.Errorf("%s has no hooks; want update-ldcache and the others, each running %s", filepath.Base(spec), path)
	}
}

// TestImageUsesTheHostsHook: with kubeletPlugin.cdiHook.hostPath the chart mounts the
// host toolkit's hook read-only at the same path, the plugin from the image names it
// and installs nothing. The "host toolkit" here is a copy of the image's own hook in
// the simulated host's directory.
func TestImageUsesTheHostsHook(t *testing.T) {
	t.Parallel()
	rootfs := imageRootfs(t)
	e := newEnv(t, envOptions{profile: "dgx-h100", fromChart: true})
	host := filepath.Join(e.dir, "host-toolkit", "usr", "bin", "nvidia-cdi-hook")
	image, err := os.ReadFile(filepath.Join(rootfs, "usr", "bin", "nvidia-cdi-hook"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host, image, 0o755); err != nil {
		t.Fatal(err)
	}
	d := newChartDeployment(t, e, rootfs, map[string]any{"cdiHook": map[string]any{"hostPath": host}})
	d.run("install", "topodra", filepath.Join(repoRoot(t), "deploy", "helm", "topodra"), "--values", d.values, "--wait=false", "--create-namespace")
	e.plugin = d.startPod("plugin-host-hook")
	d.waitServing(e.plugin, fmt.Sprintf("%012d", d.runs), 2*time.Minute)
	if !logHas(e.plugin, "action=HostHook") || !logHas(e.plugin, host) {
		t.Errorf("the plugin did not log the host's hook %s; log:\n%s", host, tailFile(e.plugin.log, 30))
	}
	installed := filepath.Join(e.kubeletRoot, "plugins", driverName, "nvidia-cdi-hook")
	if _, err := os.Lstat(installed); err == nil {
		t.Errorf("%s installed although the chart names the host's hook", installed)
	}

	const ns = "hosthook"
	e.createNamespace(ns)
	e.kubectlApply(twoGPUTemplate(ns))
	e.createPod(ns, "two", "two-gpus")
	pod := e.waitPodRunning(ns, "two", 2*time.Minute)
	claim, _ := e.allocation(pod)
	checkSpecHooks(t, filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_"+string(claim.UID)+".json"), host, false)
}

// twoGPUTemplate is a claim template for two GPUs on one NUMA node.
func twoGPUTemplate(ns string) string {
	return claimTemplate(ns, "two-gpus", 2, "resource.kubernetes.io/numaNode")
}

// previousChart extracts the chart of the last commit whose Chart.yaml names another
// version than the working tree's: the release an operator upgrades from.
func previousChart(t *testing.T) (dir, version string) {
	t.Helper()
	root := repoRoot(t)
	chartYAML := "deploy/helm/topodra/Chart.yaml"
	versionOf := func(text string) string {
		m := regexp.MustCompile(`(?m)^version:\s*(\S+)`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no version in Chart.yaml:\n%s", text)
		}
		return m[1]
	}
	cur, err := os.ReadFile(filepath.Join(root, chartYAML))
	if err != nil {
		t.Fatal(err)
	}
	current := versionOf(string(cur))
	git := func(args ...string) string {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			if cluster.RequireTools() {
				t.Fatalf("git %v: %v (the upgrade test needs the repository's history)", args, err)
			}
			t.Skipf("skipping: git %v: %v (the upgrade test needs the repository's history)", args, err)
		}
		return string(out)
	}
	for _, rev := range strings.Fields(git("log", "--format=%H", "--", chartYAML)) {
		v := versionOf(git("show", rev+":"+chartYAML))
		if v == current {
			continue
		}
		dir = t.TempDir()
		archive := exec.Command("git", "-C", root, "archive", "--format=tar", rev, "deploy/helm/topodra")
		untar := exec.Command("tar", "-x", "-C", dir)
		pipe, err := archive.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		untar.Stdin = pipe
		if err := untar.Start(); err != nil {
			t.Fatal(err)
		}
		if err := archive.Run(); err != nil {
			t.Fatal(err)
		}
		if err := untar.Wait(); err != nil {
			t.Fatal(err)
		}
		t.Logf("previous chart: %s at %.12s (this tree: %s)", v, rev, current)
		return filepath.Join(dir, "deploy", "helm", "topodra"), v
	}
	t.Fatalf("no earlier chart version than %s in the history", current)
	return "", ""
}

// TestChartUpgradeAndRollbackKeepClaims upgrades a running installation from the
// previous chart version to this one with helm, and rolls it back, with claims
// prepared, as a cluster's DaemonSet controller would roll the pods: with the
// chart's maxSurge 1 and maxUnavailable 0 the new pod starts next to the old one on
// the same host paths, takes the node's state over (the lock in the state directory),
// registers under its own socket names before the old pod is deleted, and unprepares
// the claims the old pod prepared. Nothing is lost: every claim prepared on either
// side of the upgrade and of the rollback is unprepared in the end, its CDI spec
// removed, the checkpoint empty.
func TestChartUpgradeAndRollbackKeepClaims(t *testing.T) {
	t.Parallel()
	rootfs := imageRootfs(t)
	prevDir, prevVersion := previousChart(t)
	e := newEnv(t, envOptions{profile: "dgx-h100", fromChart: true})
	d := newChartDeployment(t, e, rootfs)
	current := filepath.Join(repoRoot(t), "deploy", "helm", "topodra")
	ctx := context.Background()
	const ns = "upgrade"

	d.run("install", "topodra", prevDir, "--values", d.values, "--wait=false", "--create-namespace")
	if v := d.daemonSet().Labels["helm.sh/chart"]; v != "topodra-"+prevVersion {
		t.Fatalf("installed DaemonSet is chart %q, want topodra-%s", v, prevVersion)
	}
	old := d.startPod("plugin-" + prevVersion)
	d.waitServing(old, fmt.Sprintf("%012d", d.runs), 2*time.Minute)
	e.plugin = old
	e.waitDevices(8, time.Minute)
	e.createNamespace(ns)
	e.kubectlApply(twoGPUTemplate(ns))

	claimUID := func(pod string) string {
		p, err := e.admin.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claim, _ := e.allocation(p)
		return string(claim.UID)
	}
	specOf := func(pod string) string {
		return filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_"+claimUID(pod)+".json")
	}
	prepare := func(pod string) string {
		e.createPod(ns, pod, "two-gpus")
		e.waitPodRunning(ns, pod, 2*time.Minute)
		spec := specOf(pod)
		if _, err := os.Stat(spec); err != nil {
			t.Fatalf("%s prepared, but its CDI spec: %v", pod, err)
		}
		return spec
	}
	unprepare := func(pod, spec string) {
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, pod, time.Minute)
		eventually(t, time.Minute, func() error {
			if _, err := os.Stat(spec); err == nil {
				return fmt.Errorf("%s still there after %s was deleted", filepath.Base(spec), pod)
			}
			return nil
		})
	}
	// unpreparedBy checks that by, a later pod than the one that prepared it,
	// unprepared the claim: it read the claim from the checkpoint it took over.
	unpreparedBy := func(by *proc, uid string) {
		eventually(t, time.Minute, func() error {
			if !logHas(by, `unprepared claim="`+uid+`"`) && !logHas(by, "unprepared claim="+uid) {
				return fmt.Errorf("%s did not log the unprepare of claim %s", by.what, uid)
			}
			return nil
		})
	}

	specA := prepare("a") // by the previous version's pod
	uidA := claimUID("a")
	d.run("upgrade", "topodra", current, "--values", d.values, "--wait=false")
	upgraded := d.daemonSet()
	t.Logf("upgraded: DaemonSet %s, generation %d", upgraded.Labels["helm.sh/chart"], upgraded.Generation)
	cur := d.roll(old, "plugin-upgraded")
	specB := prepare("b") // by this version's pod
	uidB := claimUID("b")
	unprepare("a", specA)
	unpreparedBy(cur, uidA)

	d.run("rollback", "topodra", "1", "--wait=false")
	if v := d.daemonSet().Labels["helm.sh/chart"]; v != "topodra-"+prevVersion {
		t.Fatalf("rolled back DaemonSet is chart %q, want topodra-%s", v, prevVersion)
	}
	back := d.roll(cur, "plugin-rolled-back")
	specC := prepare("c")
	unprepare("b", specB)
	unpreparedBy(back, uidB)
	unprepare("c", specC)

	entries, err := os.ReadDir(filepath.Join(e.dir, "cdi"))
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if strings.Contains(en.Name(), "claim_") {
			t.Errorf("CDI spec %s left behind", en.Name())
		}
	}
	checkpoint, err := os.ReadFile(filepath.Join(e.kubeletRoot, "plugins", driverName, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`"claims":\{\s*\}`).FindString(string(checkpoint)) == "" {
		t.Errorf("checkpoint still records claims after every pod was deleted:\n%s", checkpoint)
	}
}

// roll replaces the running pod with one of the DaemonSet as it is now, the way
// maxSurge 1 does: the new one starts first, the old one is deleted once the new one
// serves and has taken the node state over.
func (d *chartDeployment) roll(from *proc, name string) *proc {
	e, t := d.e, d.e.t
	t.Helper()
	ds := d.daemonSet()
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil ||
		intstr.ValueOrDefault(ru.MaxSurge, intstr.FromInt32(0)).IntValue() != 1 ||
		intstr.ValueOrDefault(ru.MaxUnavailable, intstr.FromInt32(1)).IntValue() != 0 {
		t.Fatalf("DaemonSet update strategy %+v: the handover needs maxSurge 1, maxUnavailable 0", ds.Spec.UpdateStrategy)
	}
	next := d.startPod(name)
	d.waitServing(next, fmt.Sprintf("%012d", d.runs), 2*time.Minute)
	select {
	case <-from.done:
		t.Fatalf("%s exited before the new pod was serving; log:\n%s", from.what, tailFile(from.log, 30))
	default:
	}
	// The new pod asked for the state and got it; the old one was still running
	// (the handover, not a crash, made room).
	if !logHas(next, "took over the node state") {
		t.Fatalf("%s registered without taking the node state over from %s; log:\n%s", next.what, from.what, tailFile(next.log, 30))
	}
	from.stop(t)
	e.plugin = next
	return next
}

// logHas reports whether p's log contains s.
func logHas(p *proc, s string) bool {
	b, err := os.ReadFile(p.log)
	return err == nil && strings.Contains(string(b), s)
}
