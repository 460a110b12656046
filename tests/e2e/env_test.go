package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

const driverName = "gpu.topodra.dev"

// globalKlogPath is where klog's process-global logger writes, for the whole run.
var globalKlogPath string

// TestMain: the tests run in parallel (go test -parallel; all but the deployment
// guide, which rebuilds the release artifacts the others read), and some of the
// kubelet code the harness runs logs through klog's process-global logger rather than
// the harness's own (which writes into each test's log directory). One global logger
// cannot follow each test, so it writes one file for the run, named when a test fails.
func TestMain(m *testing.M) {
	f, err := os.CreateTemp("", "topodra-e2e-klog-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: the global klog file:", err)
		os.Exit(1)
	}
	globalKlogPath = f.Name()
	klog.SetLogger(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(f), textlogger.Verbosity(4))))
	code := m.Run()
	klog.SetLogger(logr.Discard())
	f.Close()
	if code == 0 {
		os.Remove(f.Name())
	}
	os.Exit(code)
}

// repoRoot is the repository root (this package is tests/e2e).
func repoRoot(t testing.TB) string {
	t.Helper()
	abs, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// binary finds a binary built by cargo: $env, else target/debug/<name>.
func binary(t testing.TB, env, name string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = filepath.Join(repoRoot(t), "target", "debug", name)
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		build := "cargo build -p topodra-kubelet-plugin -p topodra-fake-nvml"
		if example, ok := strings.CutPrefix(name, "examples/"); ok {
			build = "cargo build -p dra-kubeletplugin --example " + example
		}
		msg := fmt.Sprintf("%s not found at %s (build it: %s, or set %s)", name, p, build, env)
		if cluster.RequireTools() {
			t.Fatal(msg)
		}
		t.Skip("skipping: " + msg)
	}
	return p
}

// env is one cluster with one harness node running the real plugin.
type env struct {
	t     *testing.T
	c     *cluster.Cluster
	admin kubernetes.Interface
	node  string
	dir   string // node directory: sim/, cdi/, kubelet/

	kubeletRoot string // the kubelet root: plugins_registry/ and plugins/
	h           *harness.Harness
	plugin      *proc
	profile     string
	args        []string // extra plugin flags

	pluginKubeconfig string

	// With envOptions.cpuDriver: the simulated node's CPU sysfs root, and the
	// directory of the harness's NRI socket.
	cpuHostRoot string
	nriDir      string
}

type envOptions struct {
	profile    string
	node       string
	pluginArgs []string
	// apiServerArgs are extra kube-apiserver flags (an audit log, say).
	apiServerArgs []string
	// fromChart leaves the deployment to the test: no manifests applied, no plugin
	// identity made, no plugin started (the test installs the chart with helm and
	// runs the DaemonSet's container).
	fromChart bool
	// harnessOnly is the cluster and the harness node alone, for another driver's
	// plugin: no simulated machine, no manifests, no topodra plugin.
	harnessOnly bool
	// cpuDriver prepares the node for kubernetes-sigs' dra-driver-cpu beside our
	// plugin (startCPUDriver): the simulated node's CPU sysfs, the harness as the
	// runtime end of NRI, and the plugin mount namespace under /var/lib/kubelet.
	cpuDriver bool
}

// manifestsOnlyEnv is a cluster with the objects of deploy/manifests applied and no
// node or plugin, for tests of the deployment objects themselves.
func manifestsOnlyEnv(t *testing.T) *env {
	t.Helper()
	return manifestsOnlyEnvWith(t)
}

// manifestsOnlyEnvWith is manifestsOnlyEnv with extra kube-apiserver flags.
func manifestsOnlyEnvWith(t *testing.T, apiServerArgs ...string) *env {
	t.Helper()
	c := cluster.StartT(t, cluster.Options{ExtraArgs: map[string][]string{cluster.APIServer: apiServerArgs}})
	admin, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, c: c, admin: admin}
	e.applyManifests()
	return e
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	var simNode string
	if !o.harnessOnly {
		binary(t, "TOPODRA_PLUGIN_BIN", "topodra-kubelet-plugin") // skip early when absent
		simNode = binary(t, "TOPODRA_SIM_NODE_BIN", "topodra-sim-node")
	}
	if o.node == "" {
		o.node = "gpu-node-a"
	}
	c := cluster.StartT(t, cluster.Options{ExtraArgs: map[string][]string{cluster.APIServer: o.apiServerArgs}})
	admin, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, c: c, admin: admin, node: o.node, dir: filepath.Join(c.Dir, "node-"+o.node), profile: o.profile, args: o.pluginArgs}
	// The kubelet root holds the sockets: under the test's long temporary path
	// (named after the test) their paths would pass the 108 bytes a unix socket
	// path may have, the more so with a pod UID in the name. A real one is
	// /var/lib/kubelet.
	short, err := os.MkdirTemp("", "kr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(short) })
	e.kubeletRoot = short
	for _, d := range []string{filepath.Join(e.kubeletRoot, "plugins_registry"), filepath.Join(e.kubeletRoot, "plugins"), filepath.Join(e.dir, "cdi"), filepath.Join(e.dir, "kubelet")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.dir, "boot_id"), []byte("e2e-boot-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !o.harnessOnly {
		simArgs := []string{o.profile, filepath.Join(e.dir, "sim")}
		if o.cpuDriver {
			simArgs = append([]string{"--print-cpu-host-root"}, simArgs...)
		}
		out, err := exec.Command(simNode, simArgs...).Output()
		if err != nil {
			t.Fatalf("topodra-sim-node %s: %v", o.profile, err)
		}
		// One plugin flag a line, and with --print-cpu-host-root a last line
		// HOST_ROOT=<dir>.
		var flags []string
		for _, line := range strings.Fields(string(out)) {
			if root, ok := strings.CutPrefix(line, "HOST_ROOT="); ok {
				e.cpuHostRoot = root
				continue
			}
			flags = append(flags, line)
		}
		if o.cpuDriver && e.cpuHostRoot == "" {
			t.Fatalf("topodra-sim-node --print-cpu-host-root printed no HOST_ROOT= line:\n%s", out)
		}
		e.args = append(flags, e.args...)
	}

	if !o.fromChart && !o.harnessOnly {
		e.applyManifests()
	}

	nodeKubeconfig, err := c.NodeKubeconfig(o.node)
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(c.LogsDir, "kubelet-harness-"+o.node+".log"))
	if err != nil {
		t.Fatal(err)
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(4)))
	hcfg := harness.Config{
		Kubeconfig: nodeKubeconfig, NodeName: o.node,
		RegistryDir: filepath.Join(e.kubeletRoot, "plugins_registry"), CDIDir: filepath.Join(e.dir, "cdi"),
		StateDir: filepath.Join(e.dir, "kubelet"), FeatureGates: c.Gates, Logger: logger,
	}
	if o.cpuDriver {
		// Under the short kubelet root too: a socket path has at most 108 bytes.
		e.nriDir = filepath.Join(e.kubeletRoot, "nri")
		hcfg.NRISocket = filepath.Join(e.nriDir, "nri.sock")
		hcfg.PluginPaths = cpuDriverPluginPaths(e.kubeletRoot)
	}
	e.h, err = harness.New(hcfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := e.h.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		e.h.Stop()
		logFile.Close()
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", logFile.Name(), tailFile(logFile.Name(), 40))
			t.Logf("the kubelet code's process-global log of every test: %s", globalKlogPath)
		}
	})
	if o.fromChart || o.harnessOnly {
		return e
	}
	// The plugin runs as in a deployment: the ServiceAccount of deploy/manifests
	// with a token bound to a pod on this node, under its RBAC, admission policy
	// and APF objects.
	e.pluginKubeconfig = filepath.Join(c.Dir, "kubeconfigs", "plugin-"+o.node+".kubeconfig")
	if err := harness.PluginIdentity(context.Background(), admin, c.Server, c.PKI.CAPEM(), o.node, e.pluginKubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.plugin = e.startPlugin(e.pluginKubeconfig)
	t.Cleanup(func() {
		e.plugin.stop(t)
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", e.plugin.log, tailFile(e.plugin.log, 40))
		}
	})
	return e
}

// proc is a binary under test, run as a child process with its output in a log
// file, killed if the test process dies.
type proc struct {
	what string
	cmd  *exec.Cmd
	log  string
	http string // its HTTP endpoint, host:port
	done chan struct{}
}

// startProc starts bin with args and extra environment, logging to logPath.
func startProc(t testing.TB, what, bin string, args, env []string, logPath, httpAddr string) *proc {
	t.Helper()
	return startProcEnv(t, what, bin, args, append(os.Environ(), env...), logPath, httpAddr)
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (e *env) startPlugin(kubeconfig string) *proc {
	t := e.t
	addr := freeAddr(t)
	logPath := filepath.Join(e.c.LogsDir, fmt.Sprintf("plugin-%s-%d.log", e.node, time.Now().UnixNano()))
	args := append([]string{"serve",
		"--node-name=" + e.node,
		"--kubelet-registry-dir=" + filepath.Join(e.kubeletRoot, "plugins_registry"),
		"--kubelet-plugins-dir=" + filepath.Join(e.kubeletRoot, "plugins"),
		"--cdi-dir=" + filepath.Join(e.dir, "cdi"),
		"--http-addr=" + addr,
		"--boot-id-file=" + filepath.Join(e.dir, "boot_id"),
	}, e.args...)
	bin := binary(t, "TOPODRA_PLUGIN_BIN", "topodra-kubelet-plugin")
	return startProc(t, "plugin", bin, args, []string{"KUBECONFIG=" + kubeconfig, "TOPODRA_LOG=info"}, logPath, addr)
}

// stop sends SIGTERM and waits; a process that ignores it for 20 s fails the test.
func (p *proc) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s ignored SIGTERM for 20s; killing it", p.what)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// applyManifests applies deploy/manifests without the DaemonSet and the controller's
// Deployment (the tests start those processes themselves): namespace,
// ServiceAccounts, RBAC, DeviceClasses, APF objects and admission policies.
func (e *env) applyManifests() {
	dir := filepath.Join(repoRoot(e.t), "deploy", "manifests")
	ns, err := os.ReadFile(filepath.Join(dir, "00-namespace.yaml"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.kubectlApply(string(ns))
	e.kubectlApply(manifestDocs(e.t, filepath.Join(dir, "topodra.yaml"), func(kind string) bool { return kind != "DaemonSet" && kind != "Deployment" }))
}

func (e *env) kubectlApply(yaml string) {
	e.t.Helper()
	f := filepath.Join(e.c.Dir, fmt.Sprintf("apply-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, "apply", "-f", f); err != nil {
		e.t.Fatalf("%v", err)
	} else {
		e.t.Logf("kubectl apply: %s", strings.TrimSpace(string(out)))
	}
}

// manifestDoc returns the YAML documents of file whose kind is kind.
func manifestDoc(t testing.TB, file, kind string) string {
	t.Helper()
	return manifestDocs(t, file, func(k string) bool { return k == kind })
}

// manifestDocs returns the YAML documents of file whose top-level kind passes keep.
func manifestDocs(t testing.TB, file string, keep func(kind string) bool) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^kind:\s*(\S+)\s*$`)
	var out []string
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if m := re.FindStringSubmatch(doc); m != nil && keep(m[1]) {
			out = append(out, strings.TrimSpace(doc))
		}
	}
	if len(out) == 0 {
		t.Fatalf("no matching documents in %s", file)
	}
	return strings.Join(out, "\n---\n") + "\n"
}

func (e *env) waitRegistered(timeout time.Duration) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ep, err := e.h.WaitRegistered(ctx, driverName)
	if err != nil {
		e.t.Fatalf("%v; plugin log:\n%s", err, tailFile(e.plugin.log, 30))
	}
	e.t.Logf("plugin registered through the kubelet's plugin manager, DRA endpoint %s", ep)
}

// slices lists this node's slices of our driver.
func (e *env) slices(ctx context.Context) []resourceapi.ResourceSlice {
	e.t.Helper()
	return e.slicesOf(ctx, driverName)
}

// slicesOf lists this node's slices of driver.
func (e *env) slicesOf(ctx context.Context, driver string) []resourceapi.ResourceSlice {
	e.t.Helper()
	l, err := e.admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", e.node),
			fields.OneTermEqualSelector("spec.driver", driver)).String(),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

// waitDevices waits until the node's slices (a complete pool) publish n devices.
func (e *env) waitDevices(n int, timeout time.Duration) map[string]resourceapi.Device {
	e.t.Helper()
	return e.waitDevicesOf(driverName, n, timeout)
}

// waitDevicesOf waits until the node's slices of driver (a complete pool) publish n
// devices, and returns them by name.
func (e *env) waitDevicesOf(driver string, n int, timeout time.Duration) map[string]resourceapi.Device {
	e.t.Helper()
	var got map[string]resourceapi.Device
	eventually(e.t, timeout, func() error {
		got = map[string]resourceapi.Device{}
		ss := e.slicesOf(context.Background(), driver)
		for _, s := range ss {
			if int64(len(ss)) != s.Spec.Pool.ResourceSliceCount {
				return fmt.Errorf("%d slices, pool says %d", len(ss), s.Spec.Pool.ResourceSliceCount)
			}
			for _, d := range s.Spec.Devices {
				got[d.Name] = d
			}
		}
		if len(got) != n {
			return fmt.Errorf("%d devices of %s published, want %d", len(got), driver, n)
		}
		return nil
	})
	return got
}

// attr returns a device attribute by name; names without a domain are the driver's.
func attr(d resourceapi.Device, name string) (resourceapi.DeviceAttribute, bool) {
	for k, v := range d.Attributes {
		full := string(k)
		if !strings.Contains(full, "/") {
			full = driverName + "/" + full
		}
		if full == name || (!strings.Contains(name, "/") && full == driverName+"/"+name) {
			return v, true
		}
	}
	return resourceapi.DeviceAttribute{}, false
}

// numaOf is the device's own NUMA node (the first entry of the list form).
func numaOf(t testing.TB, d resourceapi.Device) int64 {
	a, ok := attr(d, "resource.kubernetes.io/numaNode")
	if !ok {
		t.Fatalf("device %s has no numaNode", d.Name)
	}
	if a.IntValue != nil {
		return *a.IntValue
	}
	if v := listInts(a); len(v) > 0 {
		return v[0]
	}
	t.Fatalf("device %s: numaNode %+v is neither an int nor a list of ints", d.Name, a)
	return -1
}

func (e *env) createNamespace(name string) {
	e.t.Helper()
	_, err := e.admin.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	// The service-account controller adds "default"; pods need it.
	eventually(e.t, time.Minute, func() error {
		_, err := e.admin.CoreV1().ServiceAccounts(name).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
}

// createPod creates a one-container pod using the claim template tmpl.
func (e *env) createPod(ns, name, tmpl string) *v1.Pod {
	e.t.Helper()
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PodSpec{
			RestartPolicy:                 v1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptrTo[int64](5),
			ResourceClaims:                []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &tmpl}},
			Containers: []v1.Container{{
				Name: "main", Image: "ubuntu:24.04", Command: []string{"sleep", "3600"},
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpus"}}},
			}},
		},
	}
	out, err := e.admin.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) waitPodRunning(ns, name string, timeout time.Duration) *v1.Pod {
	e.t.Helper()
	var pod *v1.Pod
	eventually(e.t, timeout, func() error {
		var err error
		pod, err = e.admin.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Status.Phase != v1.PodRunning {
			return fmt.Errorf("pod %s/%s is %s (node %q); events: %s", ns, name, pod.Status.Phase, pod.Spec.NodeName, e.eventsOf(ns, name))
		}
		return nil
	})
	return pod
}

func (e *env) waitPodGone(ns, name string, timeout time.Duration) {
	e.t.Helper()
	eventually(e.t, timeout, func() error {
		p, err := e.admin.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("pod %s/%s still exists (%s, deletionTimestamp %v)", ns, name, p.Status.Phase, p.DeletionTimestamp)
	})
}

// eventsOf renders the events of a pod as "Reason: message" lines.
func (e *env) eventsOf(ns, name string) string {
	l, err := e.admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.kind", "Pod"),
			fields.OneTermEqualSelector("involvedObject.name", name)).String(),
	})
	if err != nil {
		return err.Error()
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].LastTimestamp.Before(&l.Items[j].LastTimestamp) })
	var lines []string
	for _, ev := range l.Items {
		lines = append(lines, fmt.Sprintf("%s %s (%s): %s", ev.Type, ev.Reason, ev.Source.Component, ev.Message))
	}
	return strings.Join(lines, "\n")
}

// waitEvent waits for an event of the pod with reason whose message matches re.
func (e *env) waitEvent(ns, name, reason string, re *regexp.Regexp, timeout time.Duration) string {
	e.t.Helper()
	var msg string
	eventually(e.t, timeout, func() error {
		l, err := e.admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", name),
				fields.OneTermEqualSelector("reason", reason)).String(),
		})
		if err != nil {
			return err
		}
		for _, ev := range l.Items {
			if re.MatchString(ev.Message) {
				msg = ev.Message
				return nil
			}
		}
		return fmt.Errorf("no %s event matching %q on %s/%s; events:\n%s", reason, re, ns, name, e.eventsOf(ns, name))
	})
	return msg
}

// allocation returns the devices allocated to the pod's claim "gpus", with the claim.
func (e *env) allocation(pod *v1.Pod) (*resourceapi.ResourceClaim, []string) {
	e.t.Helper()
	return e.allocationOf(pod, driverName)
}

// allocationOf returns the devices allocated to the pod's claim "gpus", all of driver
// on the env's node, with the claim.
func (e *env) allocationOf(pod *v1.Pod, driver string) (*resourceapi.ResourceClaim, []string) {
	e.t.Helper()
	var claimName string
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == "gpus" && s.ResourceClaimName != nil {
			claimName = *s.ResourceClaimName
		}
	}
	if claimName == "" {
		e.t.Fatalf("pod %s has no generated claim: %+v", pod.Name, pod.Status.ResourceClaimStatuses)
	}
	claim, err := e.admin.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), claimName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if claim.Status.Allocation == nil {
		e.t.Fatalf("claim %s not allocated", claimName)
	}
	var devs []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver || r.Pool != e.node {
			e.t.Fatalf("claim %s: result %+v is not of %s on %s", claimName, r, driver, e.node)
		}
		devs = append(devs, r.Device)
	}
	sort.Strings(devs)
	return claim, devs
}

func eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// tailFile is the last n lines of the file at path; "" when it cannot be read.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return tail(string(b), n)
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func ptrTo[T any](v T) *T { return &v }

func minorOf(dev string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(dev, "gpu-"))
	return n
}

func t0ctx() context.Context          { return context.Background() }
func getOpts() metav1.GetOptions      { return metav1.GetOptions{} }
func deleteNow() metav1.DeleteOptions { return metav1.DeleteOptions{} }
func readRecord(e *env, pod *v1.Pod) (*harness.PodRecord, error) {
	return harness.ReadRecord(e.h.RecordPath(pod.Namespace, pod.Name, pod.UID))
}
