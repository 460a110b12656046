package main

import (
	"context"
	"math"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestRequestKindKeepsLeasesAndPeriodicApart(t *testing.T) {
	for vr, want := range map[string]string{
		"update leases":                leaseRequest,
		"get leases":                   leaseRequest,
		"watch leases":                 periodicRequest,
		"watch resourceclaims":         periodicRequest,
		"get -":                        periodicRequest,
		"patch nodes":                  periodicRequest,
		"get nodes":                    perPodRequest,
		"get resourceclaims":           perPodRequest,
		"create resourceslices":        perPodRequest,
		"patch noderesourcetopologies": perPodRequest,
	} {
		if got := requestKind(vr); got != want {
			t.Errorf("requestKind(%q) = %q, want %q", vr, got, want)
		}
	}
}

// A stack of 100 bound pods, 20 of them on the 2 nodes of the node path, over a
// 360 s window: the kubelet read one claim per pod there, the plugins one each
// and renewed nothing but a watch; the controller wrote and renewed its Lease.
func nodePathStack() *stackResult {
	return &stackResult{
		PodsBound: 100,
		RequestsByClient: map[string]map[string]int{
			"kube-scheduler":          {"patch pods": 100, "create bindings": 100, "update leases": 40},
			kubeletClient:             {"get resourceclaims": 20},
			pluginClient:              {"get resourceclaims": 20, "watch resourceslices": 2, "create events": 2},
			controllerClient:          {"patch noderesourcetopologies": 999},
			"kube-controller-manager": {"create resourceclaims": 100},
		},
		ControllerUntilSettled:  map[string]int{"patch noderesourcetopologies": 50, "update leases": 36, "watch pods": 1},
		ControllerSettleSeconds: 0,
		NodePath:                &nodePathFigures{Nodes: 2, Pods: 20, WavesSeconds: 360},
	}
}

func TestNodePathPerPodAndEveryPod(t *testing.T) {
	s := nodePathStack()
	per := s.nodePathPerPod()
	// kubelet 20 / 20; plugins (20 GETs + 2 Events) / 20, the watches apart.
	if !near(per[kubeletClient], 1) || !near(per[pluginClient], 1.1) {
		t.Errorf("per node-path pod %v, want kubelet 1, plugin 1.1", per)
	}
	// All: 240 + 20 + 24 + 999 + 100 = 1383 over 100 pods = 13.83; the node
	// path's per-pod 42 / 100 = 0.42 per bound pod becomes 2.1.
	v, ok := s.allPerPodEveryNodePath()
	if !ok || !near(v, 13.83-0.42+2.1) {
		t.Errorf("every pod's node path: %v %v, want %v", v, ok, 13.83-0.42+2.1)
	}
	s.NodePath.Pods = 0
	if _, ok := s.allPerPodEveryNodePath(); ok || s.nodePathPerPod() != nil {
		t.Error("no pod on the node path: no figure")
	}
	s.NodePath = nil
	if _, ok := s.allPerPodEveryNodePath(); ok {
		t.Error("no node path: no figure")
	}
}

func TestTopodraRequestsPerPodAndPerNodeHour(t *testing.T) {
	s := nodePathStack()
	rows := topodraRequests(s, 10)
	got := map[string]topodraRequest{}
	for _, r := range rows {
		got[r.Process+" "+r.Request] = r
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows: %v", len(rows), rows)
	}
	if rows[0].Process != pluginClient || rows[len(rows)-1].Process != controllerClient {
		t.Errorf("the plugins' rows first, then the controller's: %v", rows)
	}
	// The plugins: per pod over the 20 pods on their nodes; the watch over 2
	// nodes × 0.1 h.
	if r := got[pluginClient+" get resourceclaims"]; r.Kind != perPodRequest || !near(r.PerPod, 1) || r.PerNodeHour != 0 {
		t.Errorf("plugin GETs %+v", r)
	}
	if r := got[pluginClient+" watch resourceslices"]; r.Kind != periodicRequest || !near(r.PerNodeHour, 10) || r.PerPod != 0 {
		t.Errorf("plugin watches %+v", r)
	}
	// The controller: its counts until settled (not the waves' 999), per bound
	// pod, and its Lease over the 10-node fleet × 0.1 h.
	if r := got[controllerClient+" patch noderesourcetopologies"]; r.Count != 50 || !near(r.PerPod, 0.5) {
		t.Errorf("controller writes %+v", r)
	}
	if r := got[controllerClient+" update leases"]; r.Kind != leaseRequest || !near(r.PerNodeHour, 36) {
		t.Errorf("controller Lease %+v", r)
	}
	// Its settle time lengthens its window: 360 + 360 s halves the rate.
	s.ControllerSettleSeconds = 360
	for _, r := range topodraRequests(s, 10) {
		if r.Process == controllerClient && r.Request == "update leases" && !near(r.PerNodeHour, 18) {
			t.Errorf("controller Lease over 720 s: %+v", r)
		}
	}
	// Without its settled counts, the waves' own.
	s.ControllerUntilSettled = nil
	for _, r := range topodraRequests(s, 10) {
		if r.Process == controllerClient && r.Count != 999 {
			t.Errorf("controller from the waves' counts: %+v", r)
		}
	}
	s.NodePath = nil
	if topodraRequests(s, 10) != nil {
		t.Error("no node path: no rows")
	}
}

func TestTheReportShowsTheNodePath(t *testing.T) {
	s := nodePathStack()
	s.NodePath.Prepared, s.NodePath.Unprepared, s.NodePath.PrepareErrors = 19, 19, 1
	s.NodePath.Prepare = latency{N: 19, P50Ms: 4.5, P99Ms: 30}
	s.NodePath.Errors = []string{"prepare scale/p on kwok-gpu-0001: boom"}
	r := results{Nodes: 10, DRA: *s}
	md := r.markdown()
	for _, want := range []string{
		"## The node path: 2 of the 10 nodes",
		"| 1 | 20 | 19 | 19 | 4.5 | 30.0 |",
		"| kubelet | 20 | 0.20 | 1.00 |",
		"| topodra-kubelet-plugin | 24 | 0.24 | 1.10 |",
		"| kube-scheduler | 240 | 2.40 | - |",
		"- prepare scale/p on kwok-gpu-0001: boom",
		"| topodra-kubelet-plugin | watch resourceslices | other periodic | 2 | - | 10.0 |",
		"| topodra-controller | update leases | Lease renewals | 36 | - | 36.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	s.NodePath = nil
	if md := (results{Nodes: 10, DRA: *s}).markdown(); strings.Contains(md, "node path") || strings.Contains(md, "node-path") {
		t.Errorf("-node-path 0: the report names the node path:\n%s", md)
	}
}

func TestLatencySummary(t *testing.T) {
	l := summarizeMs([]float64{5, 1, 3, 2, 4})
	if l.N != 5 || l.P50Ms != 3 || l.P99Ms != 5 || l.MaxMs != 5 {
		t.Errorf("%+v", l)
	}
	if (summarizeMs(nil) != latency{}) {
		t.Error("empty")
	}
}

func TestCheckPreparedAsTheKubeletAndBeyond(t *testing.T) {
	claims := []*drapb.Claim{{Uid: "a", Name: "ca"}, {Uid: "b", Name: "cb"}}
	dev := func(cdi ...string) *drapb.Device { return &drapb.Device{CdiDeviceIds: cdi} }
	want := map[string]int{"a": 1, "b": 2}
	ok := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{
		"a": {Devices: []*drapb.Device{dev("x")}}, "b": {Devices: []*drapb.Device{dev("y"), dev("z", "w")}},
	}}
	if d, c, err := checkPrepared(ok, claims, want); err != nil || d != 3 || c != 4 {
		t.Errorf("%d devices, %d CDI IDs, %v", d, c, err)
	}
	for name, resp := range map[string]*drapb.NodePrepareResourcesResponse{
		"a claim left out": {Claims: map[string]*drapb.NodePrepareResourceResponse{"a": {Devices: []*drapb.Device{dev("x")}}}},
		"an error":         {Claims: map[string]*drapb.NodePrepareResourceResponse{"a": {Error: "no"}, "b": {Devices: []*drapb.Device{dev(), dev()}}}},
		"too few devices":  {Claims: map[string]*drapb.NodePrepareResourceResponse{"a": {Devices: []*drapb.Device{dev("x")}}, "b": {Devices: []*drapb.Device{dev()}}}},
		"an unknown claim": {Claims: map[string]*drapb.NodePrepareResourceResponse{"a": {Devices: []*drapb.Device{dev()}}, "b": {Devices: []*drapb.Device{dev(), dev()}}, "c": {}}},
	} {
		if _, _, err := checkPrepared(resp, claims, want); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := checkUnprepared(&drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{"a": {}, "b": {Error: "busy"}}}, claims); err == nil {
		t.Error("unprepare error not seen")
	}
	if err := checkUnprepared(&drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{"a": {}, "b": {}}}, claims); err != nil {
		t.Error(err)
	}
}

// fakePlugin is a DRA plugin on a unix socket that prepares any claim with
// one device per call's claim (the test allocates one) and records the calls.
type fakePlugin struct {
	drapb.UnimplementedDRAPluginServer
	mu                  sync.Mutex
	prepared, unprepare []string
}

func (f *fakePlugin) NodePrepareResources(_ context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		f.prepared = append(f.prepared, c.Name)
		out.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Devices: []*drapb.Device{{DeviceName: "gpu-0", CdiDeviceIds: []string{"k8s.gpu.topodra.dev/gpu=" + c.Uid}}}}
	}
	return out, nil
}

func (f *fakePlugin) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{}}
	for _, c := range req.Claims {
		f.unprepare = append(f.unprepare, c.Name)
		out.Claims[c.Uid] = &drapb.NodeUnprepareResourceResponse{}
	}
	return out, nil
}

// The stand-in prepares a pod bound to its node (the claim read from the API
// server, the reservation checked), unprepares it once it is being deleted,
// leaves pods of other nodes alone, counts a pod its claim is not reserved for
// as an error, and one deleted while its claim was read as cut short, without
// calling the plugin for it.
func TestKubeletStandInPreparesAndUnprepares(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "dra.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	plugin := &fakePlugin{}
	drapb.RegisterDRAPluginServer(srv, plugin)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	ctx := context.Background()
	kubelet := fake.NewSimpleClientset()
	node := &npNode{name: nodeName(0), conn: conn, dra: drapb.NewDRAPluginClient(conn)}
	np := &nodePathRun{kubelet: kubelet, nodes: map[string]*npNode{node.name: node}, pods: map[k8stypes.UID]*npPod{}, stopCh: make(chan struct{})}

	pod := func(name, nodeName string, reserved bool) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: name, UID: k8stypes.UID("uid-" + name)},
			Spec: corev1.PodSpec{NodeName: nodeName, ResourceClaims: []corev1.PodResourceClaim{
				{Name: "gpus", ResourceClaimTemplateName: ptr.To("t")}}},
			Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpus", ResourceClaimName: ptr.To(name + "-gpus")}}},
		}
		claim := &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: name + "-gpus", UID: k8stypes.UID("claim-" + name),
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: p.UID, Controller: ptr.To(true)}}},
			Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
				Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpus", Driver: driverName, Pool: nodeName, Device: "gpu-0"}}}}},
		}
		if reserved {
			claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: p.UID}}
		}
		if _, err := kubelet.ResourceV1().ResourceClaims("scale").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, elsewhere, unreserved := pod("a", nodeName(0), true), pod("b", nodeName(1), true), pod("c", nodeName(0), false)
	cut := pod("d", nodeName(0), true)
	deleting := func(p *corev1.Pod) *corev1.Pod {
		p = p.DeepCopy()
		p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		return p
	}
	// d is deleted while the kubelet reads its claim.
	kubelet.PrependReactor("get", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.(k8stesting.GetAction).GetName() == "d-gpus" {
			np.seen(ctx, deleting(cut))
		}
		return false, nil, nil
	})
	for _, p := range []*corev1.Pod{a, elsewhere, unreserved, cut} {
		np.seen(ctx, p)
		np.seen(ctx, p) // an update of a pod already seen starts nothing
	}
	np.seen(ctx, deleting(pod("e", nodeName(0), true))) // first seen being deleted: left alone
	np.settle(ctx, false, 10*time.Second)
	np.seen(ctx, deleting(a)) // a graceful deletion: the kubelet unprepares before the pod goes
	unprepared := func() string {
		plugin.mu.Lock()
		defer plugin.mu.Unlock()
		return strings.Join(plugin.unprepare, ",")
	}
	for end := time.Now().Add(10 * time.Second); unprepared() == "" && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if got := unprepared(); got != "a-gpus" {
		t.Errorf("a being deleted: unprepares %q", got)
	}
	for _, p := range []*corev1.Pod{a, elsewhere, unreserved, cut} {
		np.deleted(ctx, p)
	}
	np.settle(ctx, true, 10*time.Second)

	f := np.figures()
	if f.Pods != 3 || f.Prepared != 1 || f.Unprepared != 1 || f.PrepareErrors != 1 || f.UnprepareErrors != 0 || f.CutShort != 1 {
		t.Errorf("figures %+v", f)
	}
	if f.Claims != 1 || f.Devices != 1 || f.Allocated != 1 || f.CDIDevices != 1 || f.Prepare.N != 1 || f.NodePrepare.N != 1 || f.Unprepare.N != 1 {
		t.Errorf("what was prepared: %+v", f)
	}
	if len(f.Errors) != 1 || !strings.Contains(f.Errors[0], "c-gpus") {
		t.Errorf("errors %q", f.Errors)
	}
	if strings.Join(plugin.prepared, ",") != "a-gpus" || strings.Join(plugin.unprepare, ",") != "a-gpus" {
		t.Errorf("the plugin saw prepares %v, unprepares %v: want a's claim once each", plugin.prepared, plugin.unprepare)
	}
	// The kubelet's reads: one GET of the claim of a, c and d each, none to
	// unprepare.
	gets := 0
	for _, a := range kubelet.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "resourceclaims" {
			gets++
		}
	}
	if gets != 3 {
		t.Errorf("%d claim GETs, want 3", gets)
	}
}
