package main

// The node path (-node-path N). Elsewhere the harness publishes every node's
// ResourceSlices itself and kwok plays the kubelets, so nothing ever prepares a
// claim, and DRA's cost per pod leaves out what a node does for it. Here the
// first N kwok nodes each run a real topodra-kubelet-plugin from the start of
// the DRA stack (the simulated DGX H100 that -plugins runs too, a state and
// CDI directory of its own), publishing its own slices, and the harness plays those
// nodes' kubelets: their plugin registration and their DRA manager's part in a
// pod's life. Their requests reach the audit log under the kubelet's user agent,
// apart from the harness's own; the plugins' under topodra-kubelet-plugin.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"topodra.dev/tests/cluster"
)

// kubeletUserAgent is the stand-in's user agent: the audit log counts its
// requests as the kubelet's (client() takes the program before the "/"), as a
// real kubelet's "kubelet/v1.37.2 (linux/amd64) kubernetes/<commit>" would be.
const kubeletUserAgent = "kubelet/v1.37.2 (linux/amd64) kubernetes/scale-harness"

// kubeletCallTimeout is the kubelet's limit on one NodePrepareResources or
// NodeUnprepareResources call (defaultClientCallTimeout, pkg/kubelet/cm/dra/plugin).
const kubeletCallTimeout = 45 * time.Second

// nodePathRun is the plugins of the first nodes and the kubelet stand-in that
// calls them.
type nodePathRun struct {
	fleet   *pluginFleet
	kubelet kubernetes.Interface
	nodes   map[string]*npNode
	stopped sync.Once
	stopCh  chan struct{}
	// startSeconds is from the plugins' start until every slice of the fleet
	// was published, startup their requests in it.
	startSeconds float64
	startup      map[string]int

	mu   sync.Mutex
	pods map[types.UID]*npPod
	// preparing and unpreparing are the calls under way; lastBound is when
	// the last newly bound pod was seen.
	preparing, unpreparing int
	lastBound              time.Time
	rec                    nodePathRecord
}

// npNode is one node's plugin as its kubelet holds it after registration.
type npNode struct {
	name string
	conn *grpc.ClientConn
	dra  drapb.DRAPluginClient
}

// npPod is one pod bound to a node of the node path.
type npPod struct {
	node    *npNode
	ns      string
	name    string
	done    chan struct{} // closed once its prepare has finished, well or not
	called  bool          // NodePrepareResources was sent: the kubelet then unprepares
	claims  []*drapb.Claim
	deleted bool
	gone    bool // unprepared (or nothing to unprepare)
}

// nodePathRecord is what the stand-in saw, pod by pod.
type nodePathRecord struct {
	pods, prepared, unprepared, claims, devices, allocated, cdiDevices int
	otherDriverClaims                                                  int
	prepareErrors, unprepareErrors, cutShort, unsettled                int
	errors                                                             []string
	prepareMs, nodePrepareMs, unprepareMs                              []float64
}

// maxErrorsKept caps the error messages kept for the report: the count says
// how many there were.
const maxErrorsKept = 10

// startNodePath starts the plugins of nodes 0..n-1, registers each as its
// kubelet's plugin manager would, and dials its DRA socket. The plugins publish
// their slices on their own; the caller waits for them.
func startNodePath(ctx context.Context, cl *cluster.Cluster, c config, simFlagsAll []string, n int) (*nodePathRun, error) {
	rest, err := cl.RESTConfig()
	if err != nil {
		return nil, err
	}
	// One client for all N kubelets, with the harness's lifted limits: a real
	// kubelet's own limiter (50 QPS) would not bind at one GET per claim.
	rest.QPS, rest.Burst, rest.UserAgent = clientQPS, 2*clientQPS, kubeletUserAgent
	kubelet, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, err
	}
	np := &nodePathRun{kubelet: kubelet, nodes: map[string]*npNode{}, pods: map[types.UID]*npPod{}, stopCh: make(chan struct{})}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	root := filepath.Join(cl.Dir, "node-path")
	np.fleet, err = startPluginsOn(cl, c, simFlagsAll, root, "node-path-plugin-", idx)
	if err != nil {
		np.stop()
		return nil, err
	}
	err = parallel(n, 8, func(i int) error {
		node, err := register(ctx, filepath.Join(root, nodeName(i), "registry"), nodeName(i), 2*time.Minute)
		if err != nil {
			return fmt.Errorf("%s (log: %s): %w", nodeName(i), filepath.Join(cl.LogsDir, "node-path-plugin-"+nodeName(i)+".log"), err)
		}
		np.mu.Lock()
		np.nodes[node.name] = node
		np.mu.Unlock()
		return nil
	})
	if err != nil {
		np.stop()
		return nil, err
	}
	return np, nil
}

// register does what the kubelet's plugin manager does with a new socket in its
// registry directory: GetInfo, a check of the plugin's type, name and DRA
// services against the kubelet's (k8s.io/kubernetes v1.37.2 pkg/kubelet/cm/dra/plugin,
// validateSupportedServices), then NotifyRegistrationStatus; it dials the DRA
// endpoint the plugin named, as the kubelet does.
func register(ctx context.Context, registry, node string, timeout time.Duration) (*npNode, error) {
	sock := filepath.Join(registry, driverName+"-reg.sock")
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no registration socket %s after %s", sock, timeout)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := reg.GetInfo(cctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo: %w", err)
	}
	var why string
	switch {
	case info.Type != registerapi.DRAPlugin:
		why = fmt.Sprintf("type %q, want %q", info.Type, registerapi.DRAPlugin)
	case info.Name != driverName:
		why = fmt.Sprintf("driver %q, want %q", info.Name, driverName)
	case !slices.Contains(info.SupportedVersions, drapb.DRAPluginService):
		why = fmt.Sprintf("services %q lack %q", info.SupportedVersions, drapb.DRAPluginService)
	}
	if _, err := reg.NotifyRegistrationStatus(cctx, &registerapi.RegistrationStatus{PluginRegistered: why == "", Error: why}); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	if why != "" {
		return nil, errors.New("registration refused: " + why)
	}
	dra, err := grpc.NewClient("unix:"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &npNode{name: node, conn: dra, dra: drapb.NewDRAPluginClient(dra)}, nil
}

// watch follows every pod from an informer (the harness's client: one watch
// stands in for the N kubelets' own pod watches, which are no per-pod request)
// and plays the kubelet for those bound to a node of the node path.
func (np *nodePathRun) watch(ctx context.Context, cs kubernetes.Interface) error {
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, fields.Everything())
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { np.seen(ctx, obj) },
		UpdateFunc: func(_, obj any) { np.seen(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				np.deleted(ctx, p)
			}
		},
	}); err != nil {
		return err
	}
	go inf.Run(np.stopCh)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		return errors.New("node path: the pod informer did not sync within a minute")
	}
	return nil
}

// seen starts the prepare of a pod newly bound to a node of the node path, and
// the unprepare of one being deleted: the kubelet unprepares a pod once its
// containers have stopped, before the pod object goes (kwok deletes it at
// once). A pod first seen while being deleted is left alone, as the kubelet
// does not start one.
func (np *nodePathRun) seen(ctx context.Context, obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return
	}
	if p.DeletionTimestamp != nil {
		np.deleted(ctx, p)
		return
	}
	np.mu.Lock()
	defer np.mu.Unlock()
	node := np.nodes[p.Spec.NodeName]
	if node == nil || np.pods[p.UID] != nil {
		return
	}
	st := &npPod{node: node, ns: p.Namespace, name: p.Name, done: make(chan struct{})}
	np.pods[p.UID] = st
	np.rec.pods++
	np.preparing++
	np.lastBound = time.Now()
	go np.prepare(ctx, p.DeepCopy(), st)
}

// deleted unprepares a pod once its prepare is over, if the prepare got as far
// as the plugin (the kubelet keeps the claims in its cache from just before the
// call, and unprepares what its cache holds).
func (np *nodePathRun) deleted(ctx context.Context, p *corev1.Pod) {
	np.mu.Lock()
	defer np.mu.Unlock()
	st := np.pods[p.UID]
	if st == nil || st.deleted {
		return
	}
	st.deleted = true
	np.unpreparing++
	go np.unprepare(ctx, st)
}

// prepare is the kubelet's DRA manager preparing a pod (k8s.io/kubernetes
// v1.37.2, pkg/kubelet/cm/dra/manager.go, prepareResources): for each of the
// pod's claims, its name from the pod (resourceclaim.Name), one GET of the
// claim from the API server
//
//	// Query claim object from the API server
//	resourceClaim, err := m.kubeClient.ResourceV1().ResourceClaims(pod.Namespace).Get(
//
// the owner and reservation checks (resourceclaim.IsForPod, IsReservedForPod,
// called here from the same package); then one NodePrepareResources call per
// driver with all of the pod's claims for it, under the plugin client's 45 s
// limit. The manager sends no other request for a pod: its claim cache and
// checkpoint are local. The claims of another driver would go to that driver's
// plugin, which no node here runs: they are counted and left out.
func (np *nodePathRun) prepare(ctx context.Context, p *corev1.Pod, st *npPod) {
	defer func() {
		close(st.done)
		np.mu.Lock()
		np.preparing--
		np.mu.Unlock()
	}()
	start := time.Now()
	fail := func(format string, args ...any) {
		np.mu.Lock()
		defer np.mu.Unlock()
		msg := fmt.Sprintf("prepare %s/%s on %s: %s", p.Namespace, p.Name, st.node.name, fmt.Sprintf(format, args...))
		if st.deleted {
			// Deleted while it was being prepared: the kubelet would abandon
			// it too. Not the node path's failure, but counted apart.
			np.rec.cutShort++
			return
		}
		np.rec.prepareErrors++
		np.rec.keepError(msg)
	}
	var claims []*drapb.Claim
	want := map[string]int{} // claim UID -> devices allocated by our driver
	other := 0
	for i := range p.Spec.ResourceClaims {
		name, mustCheckOwner, err := resourceclaim.Name(p, &p.Spec.ResourceClaims[i])
		if err != nil {
			fail("%v", err)
			return
		}
		if name == nil {
			continue
		}
		claim, err := np.kubelet.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			fail("fetch ResourceClaim %s: %v", *name, err)
			return
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(p, claim, false); err != nil {
				fail("%v", err)
				return
			}
		}
		if !resourceclaim.IsReservedForPod(p, claim, false) {
			fail("pod is not allowed to use ResourceClaim %s (not in its reservedFor)", claim.Name)
			return
		}
		if claim.Status.Allocation == nil {
			fail("ResourceClaim %s is not allocated", claim.Name)
			return
		}
		n := ourDevices(claim)
		if n == 0 {
			other++
			continue
		}
		want[string(claim.UID)] = n
		claims = append(claims, &drapb.Claim{Namespace: claim.Namespace, Uid: string(claim.UID), Name: claim.Name})
	}
	np.mu.Lock()
	np.rec.otherDriverClaims += other
	if len(claims) == 0 || st.deleted {
		// Nothing of ours to prepare, or deleted meanwhile: the kubelet does
		// not call a plugin for a pod it is tearing down.
		if st.deleted {
			np.rec.cutShort++
		}
		st.gone = true
		np.mu.Unlock()
		return
	}
	st.called, st.claims = true, claims
	np.mu.Unlock()

	callStart := time.Now()
	cctx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
	resp, err := st.node.dra.NodePrepareResources(cctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	cancel()
	end := time.Now()
	if err != nil {
		fail("NodePrepareResources: %v", err)
		return
	}
	devices, cdi, err := checkPrepared(resp, claims, want)
	if err != nil {
		fail("%v", err)
		return
	}
	np.mu.Lock()
	defer np.mu.Unlock()
	np.rec.prepared++
	np.rec.claims += len(claims)
	np.rec.devices += devices
	np.rec.cdiDevices += cdi
	for _, n := range want {
		np.rec.allocated += n
	}
	np.rec.prepareMs = append(np.rec.prepareMs, ms(end.Sub(start)))
	np.rec.nodePrepareMs = append(np.rec.nodePrepareMs, ms(end.Sub(callStart)))
}

// ourDevices counts the devices of topodra's driver in a claim's allocation.
func ourDevices(claim *resourcev1.ResourceClaim) int {
	n := 0
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == driverName {
				n++
			}
		}
	}
	return n
}

// checkPrepared checks a NodePrepareResources answer as the kubelet does (a
// result for every claim and no other, no error in any) and, beyond it, that
// each claim got as many devices as were allocated to it; it returns the
// devices and CDI device IDs the plugin sent.
func checkPrepared(resp *drapb.NodePrepareResourcesResponse, claims []*drapb.Claim, want map[string]int) (devices, cdi int, err error) {
	for uid, r := range resp.Claims {
		if _, ok := want[uid]; !ok {
			return 0, 0, fmt.Errorf("NodePrepareResources returned result for unknown claim UID %s", uid)
		}
		if r.GetError() != "" {
			return 0, 0, fmt.Errorf("NodePrepareResources failed for claim %s: %s", uid, r.Error)
		}
		if len(r.Devices) != want[uid] {
			return 0, 0, fmt.Errorf("NodePrepareResources: claim %s got %d devices, %d allocated", uid, len(r.Devices), want[uid])
		}
		devices += len(r.Devices)
		for _, d := range r.Devices {
			cdi += len(d.CdiDeviceIds)
		}
	}
	if len(resp.Claims) != len(claims) {
		return 0, 0, fmt.Errorf("NodePrepareResources skipped %d ResourceClaims", len(claims)-len(resp.Claims))
	}
	return devices, cdi, nil
}

// unprepare is the kubelet's UnprepareResources for a pod being deleted
// (k8s.io/kubernetes v1.37.2, pkg/kubelet/cm/dra/manager.go,
// unprepareResourcesForPod and unprepareResources): the claim names come from
// the DRA manager's claim cache (else from the pod's spec and status), so it
// reads nothing from the API server, and one NodeUnprepareResources call per
// driver for the claims no other pod still references.
func (np *nodePathRun) unprepare(ctx context.Context, st *npPod) {
	defer func() {
		np.mu.Lock()
		np.unpreparing--
		np.mu.Unlock()
	}()
	<-st.done
	np.mu.Lock()
	called, claims := st.called, st.claims
	np.mu.Unlock()
	if !called {
		np.mu.Lock()
		st.gone = true
		np.mu.Unlock()
		return
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, kubeletCallTimeout)
	resp, err := st.node.dra.NodeUnprepareResources(cctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
	cancel()
	d := time.Since(start)
	if err == nil {
		err = checkUnprepared(resp, claims)
	}
	np.mu.Lock()
	defer np.mu.Unlock()
	st.gone = true
	if err != nil {
		np.rec.unprepareErrors++
		np.rec.keepError(fmt.Sprintf("unprepare %s/%s on %s: %v", st.ns, st.name, st.node.name, err))
		return
	}
	np.rec.unprepared++
	np.rec.unprepareMs = append(np.rec.unprepareMs, ms(d))
}

func checkUnprepared(resp *drapb.NodeUnprepareResourcesResponse, claims []*drapb.Claim) error {
	for _, c := range claims {
		r, ok := resp.Claims[c.Uid]
		if !ok {
			return fmt.Errorf("NodeUnprepareResources: no result for claim %s", c.Name)
		}
		if r.GetError() != "" {
			return fmt.Errorf("NodeUnprepareResources failed for claim %s: %s", c.Name, r.Error)
		}
	}
	return nil
}

func (r *nodePathRecord) keepError(msg string) {
	if len(r.errors) < maxErrorsKept {
		r.errors = append(r.errors, msg)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// settleQuiet is how long after the last newly bound pod settle waits for
// another: the stand-in's informer may deliver a bind a moment after the
// wave's own watch did.
const settleQuiet = 100 * time.Millisecond

// settle waits (at most limit) until no prepare is under way and no pod was
// newly bound for settleQuiet; with unprepared, also until no unprepare is
// under way and every pod seen has been unprepared (or had nothing to
// unprepare). The meter calls it at the end of a wave, so that the node path's
// work for the wave's pods falls in the wave's window, and after its teardown,
// which deleted them. Pods still waiting then are counted as unsettled.
func (np *nodePathRun) settle(ctx context.Context, unprepared bool, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for {
		np.mu.Lock()
		waiting := np.preparing
		if unprepared {
			waiting += np.unpreparing
			for _, st := range np.pods {
				if !st.gone {
					waiting++
				}
			}
		}
		if waiting == 0 && time.Since(np.lastBound) >= settleQuiet {
			np.mu.Unlock()
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			np.rec.unsettled = max(np.rec.unsettled, waiting)
			np.rec.keepError(fmt.Sprintf("%d prepares or unprepares still waiting after %s", waiting, limit))
			np.mu.Unlock()
			return
		}
		np.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the stand-in and the plugins, once.
func (np *nodePathRun) stop() {
	np.stopped.Do(func() {
		close(np.stopCh)
		np.mu.Lock()
		for _, n := range np.nodes {
			n.conn.Close()
		}
		np.mu.Unlock()
		if np.fleet != nil {
			np.fleet.stop()
		}
	})
}

// figures is the record so far as the results hold it.
func (np *nodePathRun) figures() *nodePathFigures {
	np.mu.Lock()
	defer np.mu.Unlock()
	r := np.rec
	f := &nodePathFigures{
		Nodes: len(np.nodes), StartSeconds: np.startSeconds, Startup: np.startup, Pods: r.pods, Prepared: r.prepared, Unprepared: r.unprepared,
		Claims: r.claims, Devices: r.devices, Allocated: r.allocated, CDIDevices: r.cdiDevices,
		OtherDriverClaims: r.otherDriverClaims, PrepareErrors: r.prepareErrors, UnprepareErrors: r.unprepareErrors,
		CutShort: r.cutShort, Unsettled: r.unsettled, Errors: append([]string(nil), r.errors...),
		Prepare: summarizeMs(r.prepareMs), NodePrepare: summarizeMs(r.nodePrepareMs), Unprepare: summarizeMs(r.unprepareMs),
	}
	return f
}

// deleteNodeSlices deletes topodra's slices of the nodes and waits until none
// is listed: what the kubelet does for a plugin gone for good.
func deleteNodeSlices(ctx context.Context, cs kubernetes.Interface, nodes []string) error {
	for _, n := range nodes {
		sel := metav1.ListOptions{FieldSelector: fields.Set{"spec.nodeName": n, "spec.driver": driverName}.String()}
		if err := cs.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			return err
		}
		for {
			sel.Limit = 1
			l, err := cs.ResourceV1().ResourceSlices().List(ctx, sel)
			if err != nil {
				return err
			}
			if len(l.Items) == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// latency is a series of durations: how many, their median, 99th percentile
// and largest, in milliseconds.
type latency struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

func summarizeMs(v []float64) latency {
	if len(v) == 0 {
		return latency{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return latency{N: len(s), P50Ms: percentile(s, 0.50), P99Ms: percentile(s, 0.99), MaxMs: s[len(s)-1]}
}
