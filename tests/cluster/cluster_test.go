package cluster

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// TestClusterLifecycle starts the real control plane, proves the DRA API and
// the list-typed attribute gate, proves a minted node identity is confined by
// the Node authorizer + NodeRestriction, and checks that Stop leaves nothing.
func TestClusterLifecycle(t *testing.T) {
	c := StartT(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}

	// Versions: the binaries must say v1.37.2 (the ldflags of build.sh).
	for _, n := range []string{APIServer, ControllerManager, Scheduler} {
		if !strings.Contains(c.Versions[n], KubernetesVersion) {
			t.Errorf("%s --version = %q, want %s", n, c.Versions[n], KubernetesVersion)
		}
	}
	sv, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if sv.GitVersion != KubernetesVersion {
		t.Errorf("server version %s, want %s", sv.GitVersion, KubernetesVersion)
	}

	// Every component's /metrics answers the admin user: the scale benchmark
	// reads its Go heap, its client limiter and the scheduler's own figures.
	for _, n := range []string{APIServer, ControllerManager, Scheduler} {
		url := c.MetricsURL(n)
		if url == "" {
			t.Errorf("%s: no metrics URL", n)
			continue
		}
		page, err := c.Scrape(ctx, url)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		for _, want := range []string{"go_memstats_heap_inuse_bytes ", "rest_client_rate_limiter_duration_seconds_count"} {
			if n == APIServer && strings.HasPrefix(want, "rest_client") {
				continue // its loopback client has no limiter
			}
			if !strings.Contains(string(page), want) {
				t.Errorf("%s /metrics lacks %s", n, want)
			}
		}
	}

	// A Node object, as kwok or the kubelet-side harness would own it.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"topodra.dev/test": "true"}}}
	node, err = cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}

	// resource.k8s.io/v1 is served and lists resourceslices (through kubectl, as the issue asks).
	out, err := c.Kubectl(ctx, "get", "--raw", "/apis/resource.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	var rl metav1.APIResourceList
	if err := json.Unmarshal(out, &rl); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	var names []string
	for _, r := range rl.APIResources {
		names = append(names, r.Name)
	}
	for _, want := range []string{"resourceslices", "resourceclaims", "resourceclaimtemplates", "deviceclasses"} {
		if !slices.Contains(names, want) {
			t.Errorf("resource.k8s.io/v1 lacks %s (has %v)", want, names)
		}
	}

	// A ResourceSlice with a list-typed (ints) attribute survives the round trip
	// only when DRAListTypeAttributes is on (off, the field is dropped and the
	// attribute has no value, which validation rejects).
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a-gpu.topodra.dev"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   "gpu.topodra.dev",
			NodeName: ptr.To("node-a"),
			Pool:     resourcev1.ResourcePool{Name: "node-a", ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{
				Name: "gpu-0",
				Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
					"resource.kubernetes.io/numaNode": {IntValues: []int64{0, 1}},
					"index":                           {IntValue: ptr.To[int64](0)},
				},
			}},
		},
	}
	got, err := cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ResourceSlice with a list attribute (is DRAListTypeAttributes on?): %v", err)
	}
	if v := got.Spec.Devices[0].Attributes["resource.kubernetes.io/numaNode"].IntValues; !slices.Equal(v, []int64{0, 1}) {
		t.Fatalf("list attribute came back as %v, want [0 1]: the DRAListTypeAttributes gate is off", v)
	}

	// The node identity: may read its own node, not write another's slices,
	// and NodeRestriction stops it labelling itself with a restricted label.
	nodeKC, err := c.NodeKubeconfig("node-a")
	if err != nil {
		t.Fatal(err)
	}
	ncfg, err := clientcmd.BuildConfigFromFlags("", nodeKC)
	if err != nil {
		t.Fatal(err)
	}
	ncs := kubernetes.NewForConfigOrDie(ncfg)
	if _, err := ncs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Errorf("node-a reading its own Node: %v", err)
	}
	other := slice.DeepCopy()
	other.ObjectMeta = metav1.ObjectMeta{Name: "node-b-gpu.topodra.dev"}
	other.Spec.NodeName = ptr.To("node-b")
	other.Spec.Pool.Name = "node-b"
	if _, err := ncs.ResourceV1().ResourceSlices().Create(ctx, other, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node-a creating node-b's slice: got %v, want Forbidden", err)
	}
	n2, err := ncs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err == nil {
		n2.Labels["node-restriction.kubernetes.io/topodra"] = "x"
		if _, err := ncs.CoreV1().Nodes().Update(ctx, n2, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node-a setting a node-restriction.kubernetes.io label: got %v, want Forbidden (NodeRestriction)", err)
		}
	}
	_ = node

	// Stop: every process (and process group) gone, pidfile removed.
	pids := c.Pids()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for name, ps := range pids {
		for _, pid := range ps {
			if err := syscall.Kill(pid, 0); err == nil {
				t.Errorf("%s pid %d still exists after Stop", name, pid)
			}
			if groupAlive(pid) {
				t.Errorf("%s process group %d still has members after Stop", name, pid)
			}
		}
	}
	if kids := childrenOf(os.Getpid()); len(kids) > 0 {
		t.Errorf("child processes left after Stop: %v", kids)
	}
	if _, err := os.Stat(pidFilePath(c.Dir)); !os.IsNotExist(err) {
		t.Errorf("pidfile still present: %v", err)
	}
	if Running(c.Dir) {
		t.Error("Running() true after Stop")
	}
}

// TestStartFailureKeepsLogs: a component that cannot start makes Start fail
// with its log tail, stops what did start, and keeps the logs.
func TestStartFailureKeepsLogs(t *testing.T) {
	if _, err := FindTool(ToolsBin(""), APIServer); err != nil {
		if RequireTools() {
			t.Fatal(err)
		}
		t.Skipf("skipping: %v", err)
	}
	dir := t.TempDir()
	_, err := Start(context.Background(), Options{
		Dir:       dir,
		ExtraArgs: map[string][]string{APIServer: {"--no-such-flag"}},
	})
	if err == nil {
		t.Fatal("Start succeeded with a bad kube-apiserver flag")
	}
	if !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("error does not name the component and quote its log: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "logs", "kube-apiserver.log")); !strings.Contains(string(b), "no-such-flag") {
		t.Errorf("kube-apiserver.log not kept: %q", b)
	}
	if kids := childrenOf(os.Getpid()); len(kids) > 0 {
		t.Errorf("child processes left after a failed Start: %v", kids)
	}
}

// childrenOf lists live (non-zombie) processes whose parent is pid.
func childrenOf(pid int) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == pid {
			out = append(out, s[:i+1]+" pid "+strconv.Itoa(p))
		}
	}
	return out
}

func TestParseFeatureGates(t *testing.T) {
	m, err := ParseFeatureGates("A=true, B=false,")
	if err != nil || !m["A"] || m["B"] || len(m) != 2 {
		t.Fatalf("got %v %v", m, err)
	}
	if _, err := ParseFeatureGates("A"); err == nil {
		t.Fatal("want error for A")
	}
	merged := mergeGates(map[string]bool{"DRAConsumableCapacity": false, "X": true})
	if FeatureGatesFlag(merged) != "DRAConsumableCapacity=false,DRAListTypeAttributes=true,DRAPartitionableDevices=true,X=true" {
		t.Fatalf("merged flag %s", FeatureGatesFlag(merged))
	}
}

func TestPKIAndNodeKubeconfig(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPKI(filepath.Join(dir, "certs"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPKI(p.Dir); err != nil {
		t.Fatal(err)
	}
	path, err := NodeKubeconfig(dir, "https://127.0.0.1:1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ai := cfg.AuthInfos["system:node:n1"]
	if ai == nil || len(ai.ClientCertificateData) == 0 {
		t.Fatalf("no client cert for system:node:n1 in %s", path)
	}
}

func TestFindToolMissing(t *testing.T) {
	if _, err := FindTool("", "kube-apiserver"); err == nil {
		t.Fatal("want error")
	}
	if _, err := FindTool(t.TempDir(), "kube-apiserver"); err == nil {
		t.Fatal("want error")
	}
}

// TestCleanupAfterCrash: `down` (Cleanup) stops processes recorded in the
// pidfile by a launcher that is gone, and leaves a reused pid alone.
func TestCleanupAfterCrash(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	start, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	pf := pidFile{
		Supervisor: pidRecord{Name: "launcher", Pid: 1 << 22, Start: 1}, // long gone
		Processes: []pidRecord{
			{Name: "stale-record", Pid: os.Getpid(), Start: 12345}, // pid reused: must be left alone
			{Name: "sleeper", Pid: cmd.Process.Pid, Start: start},
		},
	}
	if err := writeJSONAtomic(pidFilePath(dir), pf); err != nil {
		t.Fatal(err)
	}
	if !Running(dir) {
		t.Fatal("Running() = false with a live recorded process")
	}
	killed, err := Cleanup(dir, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(killed, []string{"sleeper"}) {
		t.Errorf("killed %v, want [sleeper]", killed)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("sleeper still running after Cleanup")
	}
	if _, err := os.Stat(pidFilePath(dir)); !os.IsNotExist(err) {
		t.Errorf("pidfile not removed: %v", err)
	}
}

// TestKwokPodWithClaim: with kwok managing a fake node that publishes a
// ResourceSlice, a pod whose claim comes from a template is given a claim by the
// resourceclaim controller, allocated by the real scheduler from that slice,
// bound to the node and run by kwok. This is the control-plane half of the DRA
// path that the e2e suite builds on.
func TestKwokPodWithClaim(t *testing.T) {
	if _, err := FindTool(ToolsBin(""), Kwok); err != nil {
		if RequireTools() {
			t.Fatal(err)
		}
		t.Skipf("skipping: %v (tests/tools/build.sh kwok)", err)
	}
	c := StartT(t, Options{Kwok: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	const node = "fake-gpu-1"
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:        node,
		Annotations: map[string]string{KwokNodeAnnotation: "fake"},
		Labels:      map[string]string{"kubernetes.io/hostname": node, "type": "kwok"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.topodra.dev"},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.topodra.dev"`},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dev := func(name string, numa int64) resourcev1.Device {
		return resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"resource.kubernetes.io/numaNode": {IntValue: ptr.To(numa)},
		}}
	}
	if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.topodra.dev"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   "gpu.topodra.dev",
			NodeName: ptr.To(node),
			Pool:     resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices:  []resourcev1.Device{dev("gpu-0", 0), dev("gpu-1", 0), dev("gpu-2", 1), dev("gpu-3", 1)},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "two-gpus-one-numa"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: "gpu.topodra.dev", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
			}}},
			Constraints: []resourcev1.DeviceConstraint{{MatchAttribute: ptr.To[resourcev1.FullyQualifiedName]("resource.kubernetes.io/numaNode")}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-pod", Namespace: "default"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "c", Image: "example.invalid/none",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("two-gpus-one-numa")}},
			Tolerations:    []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	for {
		got, err = cs.CoreV1().Pods("default").Get(ctx, "gpu-pod", metav1.GetOptions{})
		if err == nil && got.Status.Phase == corev1.PodRunning {
			break
		}
		select {
		case <-ctx.Done():
			ev, _ := c.Kubectl(context.Background(), "get", "events", "-A")
			t.Fatalf("pod not Running: %+v\nevents:\n%s", got.Status, ev)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if got.Spec.NodeName != node {
		t.Errorf("pod on %q, want %q", got.Spec.NodeName, node)
	}
	if len(got.Status.ResourceClaimStatuses) != 1 || got.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("no generated claim in pod status: %+v", got.Status.ResourceClaimStatuses)
	}
	claim, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, *got.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 2 {
		t.Fatalf("claim not allocated with 2 devices: %+v", claim.Status)
	}
	numa := map[string]int64{"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}
	r := claim.Status.Allocation.Devices.Results
	if r[0].Pool != node || numa[r[0].Device] != numa[r[1].Device] {
		t.Errorf("allocation %s/%s + %s/%s is not on one NUMA node of %s", r[0].Pool, r[0].Device, r[1].Pool, r[1].Device, node)
	}
	t.Logf("allocated %s and %s on %s", r[0].Device, r[1].Device, node)

	// A pod-bound service-account token carries the node it runs on
	// (ServiceAccountTokenPodNodeInfo), as the kubelet would request it.
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "default", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{BoundObjectRef: &authv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: got.Name, UID: got.UID,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tr.Status.Token, ".")
	if len(parts) != 3 {
		t.Fatalf("token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		K8s struct {
			Node struct {
				Name string `json:"name"`
			} `json:"node"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	if claims.K8s.Node.Name != node {
		t.Errorf("token's kubernetes.io.node.name = %q, want %q (payload %s)", claims.K8s.Node.Name, node, payload)
	}
}
