package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"topodra.dev/tests/cluster"
)

func TestClientNamesTheProgram(t *testing.T) {
	for ua, want := range map[string]string{
		"kube-scheduler/v1.37.2 (linux/amd64) kubernetes/abc/scheduler": "kube-scheduler",
		"topodra-controller/0.1.0":                                      "topodra-controller",
		"":                                                              "unknown",
	} {
		if got := client(ua); got != want {
			t.Errorf("client(%q) = %q, want %q", ua, got, want)
		}
	}
}

func TestAuditCountsByClientInTheWindow(t *testing.T) {
	dir := t.TempDir()
	at := func(s int) string { return time.Unix(1_800_000_000+int64(s), 0).UTC().Format(time.RFC3339Nano) }
	lines := []string{
		`{"verb":"patch","userAgent":"topodra-controller/0.1.0","objectRef":{"resource":"noderesourcetopologies"},"requestReceivedTimestamp":"` + at(10) + `"}`,
		`{"verb":"update","userAgent":"topodra-controller/0.1.0","objectRef":{"resource":"leases"},"requestReceivedTimestamp":"` + at(11) + `"}`,
		`{"verb":"list","userAgent":"topodra-controller/0.1.0","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"` + at(12) + `"}`,
		`{"verb":"watch","userAgent":"topodra-controller/0.1.0","objectRef":{"resource":"pods"},"requestReceivedTimestamp":"` + at(99) + `"}`,
	}
	path := filepath.Join(dir, "audit.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	counts, err := auditCounts(path, time.Unix(1_800_000_000, 0), time.Unix(1_800_000_050, 0))
	if err != nil {
		t.Fatal(err)
	}
	w, lw, l := writesAndLists(counts["topodra-controller"])
	if w != 1 || lw != 1 || l != 1 {
		t.Errorf("writes %d, lease writes %d, lists %d; want 1 each (the watch is outside the window)", w, lw, l)
	}
}

func TestPercentilesAndMedians(t *testing.T) {
	v := []float64{1, 2, 3, 4, 100}
	if p := percentile(v, 0.5); p != 3 {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(v, 0.99); p != 100 {
		t.Errorf("p99 = %v", p)
	}
	rs := []waveResult{{PodsPerSec: 10}, {PodsPerSec: 30}, {PodsPerSec: 20}, {PodsPerSec: 40}}
	if m := median(rs, func(r waveResult) float64 { return r.PodsPerSec }); m != 25 {
		t.Errorf("median = %v", m)
	}
}

func TestNvidiaEquivalentKeepsTheirAttributeSet(t *testing.T) {
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: ptr.To(s)} }
	s := resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Devices: []resourcev1.Device{{
		Name: "gpu-0",
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type": str("gpu"), "uuid": str("GPU-1"), "socket": {IntValue: ptr.To[int64](0)},
			"resource.kubernetes.io/pciBusID": str("0000:18:00.0"), "resource.kubernetes.io/numaNode": {IntValue: ptr.To[int64](0)},
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}, "multiprocessors": {Value: resource.MustParse("132")}},
	}}}}
	nv := nvidiaEquivalent(s)
	d := nv.Spec.Devices[0]
	for _, gone := range []resourcev1.QualifiedName{"socket", "resource.kubernetes.io/numaNode"} {
		if _, ok := d.Attributes[gone]; ok {
			t.Errorf("%s kept", gone)
		}
	}
	if *d.Attributes["pcieBusID"].StringValue != "0000:18:00.0" {
		t.Errorf("pcieBusID: %v", d.Attributes["pcieBusID"])
	}
	if len(d.Capacity) != 1 {
		t.Errorf("capacity %v", d.Capacity)
	}
	if len(s.Spec.Devices[0].Attributes) != 5 {
		t.Error("the original was changed")
	}
	if sliceBytesPerGPU([]resourcev1.ResourceSlice{nv}) >= sliceBytesPerGPU([]resourcev1.ResourceSlice{s}) {
		t.Error("the NVIDIA form is not smaller")
	}
}

// NFD's updater writes a node on an admission (its state-directory trigger),
// not on a removal; -updater-on-delete adds the removal.
func TestUpdaterTriggersOnDeletionOnlyWhenAsked(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "scale", UID: k8stypes.UID("uid-a")},
		Spec: corev1.PodSpec{NodeName: nodeName(0), Containers: []corev1.Container{{
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(1, resource.DecimalSI)}}}}},
	}
	for _, onDelete := range []bool{false, true} {
		u := newUpdater(nil, nil, 1, onDelete)
		u.bound(pod)
		if !u.triggered[nodeName(0)] {
			t.Fatalf("onDelete %v: an admission does not trigger a write", onDelete)
		}
		delete(u.triggered, nodeName(0)) // written
		u.gone(pod)
		if u.triggered[nodeName(0)] != onDelete || !u.dirty[nodeName(0)] {
			t.Errorf("onDelete %v: after the pod left, triggered %v, dirty %v", onDelete, u.triggered[nodeName(0)], u.dirty[nodeName(0)])
		}
	}
}

func TestUpdaterPlacesLikeTheTopologyManager(t *testing.T) {
	u := newUpdater(nil, nil, 1, false)
	pod := func(name string, k int) *corev1.Pod {
		q := *resource.NewQuantity(int64(k), resource.DecimalSI)
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "scale", UID: k8stypes.UID("uid-" + name)},
			Spec: corev1.PodSpec{NodeName: nodeName(0), Containers: []corev1.Container{{
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": q}}}}},
		}
	}
	u.bound(pod("a", 3))
	u.bound(pod("b", 3))
	u.bound(pod("c", 2)) // 1 + 1 free: no zone has 2
	if got := *u.free[nodeName(0)]; got != [numaZones]int{1, 1} {
		t.Fatalf("free %v", got)
	}
	if m := u.takeMisaligned(); m != 1 {
		t.Errorf("misaligned %d, want 1", m)
	}
	u.gone(pod("a", 3))
	u.bound(pod("d", 2))
	if got := *u.free[nodeName(0)]; got != [numaZones]int{2, 1} {
		t.Errorf("free %v after a leaves and d (2) comes", got)
	}
	if len(u.pods[nodeName(0)]) != 3 {
		t.Errorf("pod set %v: b, c and d are on the node", u.pods[nodeName(0)])
	}

	// c is refused once kwok has given it its status, and only once.
	c := pod("c", 2)
	if u.mustRefuse(c) {
		t.Error("refused before kwok's first status (kwok would overwrite it)")
	}
	c.Status.PodIP, c.Status.Phase = "10.0.0.3", corev1.PodRunning
	if !u.mustRefuse(c) || u.mustRefuse(c) {
		t.Error("c must be refused exactly once")
	}
	if d := pod("d", 2); func() bool { d.Status.PodIP = "10.0.0.4"; return u.mustRefuse(d) }() {
		t.Error("d has a zone: not refused")
	}
}

// The controller's writes are read from the audit log by resource: its own counter
// adds Events to NodeResourceTopology writes, and Lease renewals follow time.
func TestControllerWritesSplitByResource(t *testing.T) {
	s := &stackResult{PodsBound: 200, RequestsByClient: map[string]map[string]int{
		"topodra-controller": {"patch noderesourcetopologies": 18, "delete noderesourcetopologies": 2,
			"create events": 5, "patch events": 1, "update leases": 30, "get leases": 9, "watch pods": 1},
		"kube-scheduler": {"patch noderesourcetopologies": 99},
	}}
	want := "20 NodeResourceTopology writes for 200 bound pods, 0.100 a pod; 6 Events (0.030 a pod), 30 Lease writes, 0 other writes."
	if got := controllerWritesLine(s); !strings.Contains(got, want) {
		t.Errorf("got %q, want %q in it", got, want)
	}
}

// A count the harness stopped waiting for says so: it is not "until settled".
func TestControllerWritesCutShortSaySo(t *testing.T) {
	s := &stackResult{PodsBound: 100, RequestsByClient: map[string]map[string]int{},
		ControllerUntilSettled:  map[string]int{"patch noderesourcetopologies": 40},
		ControllerSettleSeconds: 1200}
	if got := controllerWritesLine(s); !strings.Contains(got, "Until no node waited for a write (1200 s after the waves): 40") {
		t.Errorf("settled: got %q", got)
	}
	s.ControllerStillWaiting = 7
	got := controllerWritesLine(s)
	if strings.Contains(got, "Until no node waited") || !strings.Contains(got, "7 nodes still waiting for a write, so the count is cut short): 40") {
		t.Errorf("cut short: got %q", got)
	}
	// The limit leaves the budget room for every node: here half a write a second.
	half := &controllerPacing{10, 60, 0.5}
	for nodes, want := range map[int]time.Duration{100: 20 * time.Minute, 500: 25 * time.Minute, 2000: 100 * time.Minute} {
		if got := settleLimit(nodes, half); got != want {
			t.Errorf("settleLimit(%d) = %s, want %s", nodes, got, want)
		}
	}
}

func TestWriteLagFromTheHistogram(t *testing.T) {
	m := map[string]float64{
		"topodra_controller_nrt_write_lag_seconds_count":             100,
		"topodra_controller_nrt_write_lag_seconds_sum":               1500,
		`topodra_controller_nrt_write_lag_seconds_bucket{le="8.0"}`:  10,
		`topodra_controller_nrt_write_lag_seconds_bucket{le="16.0"}`: 60,
		`topodra_controller_nrt_write_lag_seconds_bucket{le="64.0"}`: 99,
		`topodra_controller_nrt_write_lag_seconds_bucket{le="+Inf"}`: 100,
	}
	n, mean, p50, p99 := writeLag(m)
	if n != 100 || mean != 15 || p50 != 16 || p99 != 64 {
		t.Errorf("got %v %v %v %v", n, mean, p50, p99)
	}
}

// Each kind's window counts only the controller's NodeResourceTopology writes made
// in it, and the table gives them a pod and a second.
func TestControllerWritesByKindWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	kinds := []kindResult{
		{Size: 1, Kind: "aligned", Waves: []waveResult{{Bound: 100}}, from: at(0), to: at(50), WindowSeconds: 50},
		{Size: 1, Kind: "aligned-steady", Rate: 20, Waves: []waveResult{{Bound: 200}}, from: at(50), to: at(100), WindowSeconds: 50},
		{Kind: "mixed-churn", Rate: 10}, // no window: not counted
	}
	ev := func(s int, agent, verb, res string) cluster.AuditEvent {
		e := cluster.AuditEvent{Verb: verb, UserAgent: agent, RequestReceivedTimestamp: at(s)}
		e.ObjectRef = &struct {
			Resource string `json:"resource"`
			Name     string `json:"name"`
		}{Resource: res}
		return e
	}
	const ctrl = "topodra-controller/0.1"
	evs := []cluster.AuditEvent{
		ev(10, ctrl, "patch", "noderesourcetopologies"),
		ev(20, ctrl, "create", "events"),
		ev(30, "kube-scheduler/v1.37.2", "patch", "noderesourcetopologies"),
		ev(49, ctrl, "get", "noderesourcetopologies"),
		ev(50, ctrl, "patch", "noderesourcetopologies"), // the second window's
		ev(60, ctrl, "delete", "noderesourcetopologies"),
		ev(100, ctrl, "patch", "noderesourcetopologies"), // after both
	}
	nrtWritesByKind(kinds, evs)
	if kinds[0].NRTWrites == nil || *kinds[0].NRTWrites != 1 || *kinds[1].NRTWrites != 2 || kinds[2].NRTWrites != nil {
		t.Fatalf("counts %v %v %v, want 1, 2, none", kinds[0].NRTWrites, kinds[1].NRTWrites, kinds[2].NRTWrites)
	}
	got := controllerWritesByKind(&stackResult{Kinds: kinds})
	for _, want := range []string{
		"| 1 | aligned | as fast as scheduled | 100 | 50 | 1 | 0.010 | 0.02 |",
		"| 1 | aligned-steady | 20 pods/s | 200 | 50 | 2 | 0.010 | 0.04 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "mixed-churn") {
		t.Errorf("a kind without a window is in the table:\n%s", got)
	}
}

// Each stack's scheduler and its release head the report where the run recorded
// them, and nothing where it did not.
func TestSchedulersText(t *testing.T) {
	r := results{DRA: stackResult{Scheduler: "kube-scheduler: Kubernetes v1.37.2"},
		Legacy: &stackResult{Scheduler: "topology-aware-scheduler: Kubernetes v1.34.7+scheduler-plugins.v0.34.7"}}
	want := "Schedulers (--version): kube-scheduler: Kubernetes v1.37.2; topology-aware-scheduler: Kubernetes v1.34.7+scheduler-plugins.v0.34.7.\n\n"
	if got := r.schedulersText(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := (results{}).schedulersText(); got != "" {
		t.Errorf("a run without the record: got %q", got)
	}
}
