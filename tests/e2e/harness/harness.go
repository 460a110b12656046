// Package harness is the kubelet side of the end-to-end tests: it runs the kubelet's
// own plugin-manager and DRA-manager code (k8s.io/kubernetes/pkg/kubelet/pluginmanager
// and k8s.io/kubernetes/pkg/kubelet/cm/dra, from the same release as the control
// plane) against a DRA plugin on a simulated node, and stands in for the rest of a
// kubelet and its container runtime:
//
//   - it registers the Node (self-registration, as the node's own identity, so the
//     Node authorizer and NodeRestriction apply to everything it does), keeps it Ready
//     and renews its Lease;
//   - the plugin watcher watches the registry directory and the DRA manager's
//     registration handler registers the plugin through the real registration path
//     (GetInfo + NotifyRegistrationStatus over the plugin's registration socket, then
//     the DRA gRPC client dialled the way the kubelet dials it);
//   - it watches the pods bound to the node (field selector spec.nodeName) and, for
//     each new pod, calls the DRA manager's PrepareResources, takes the CDI device ids
//     of each container from GetResources, and hands them to the CDI library the
//     container runtimes use (tags.cncf.io/container-device-interface: load the CDI
//     spec directory, inject into an OCI spec; any error fails the pod's start);
//   - it records what was injected (device nodes, mounts, env) in a JSON file per pod
//     and marks the pod Running; a failed prepare becomes a Warning event
//     FailedPrepareDynamicResources naming the plugin's error, as the kubelet emits it;
//   - with Config.NRISocket it is also the runtime end of NRI (nri.go): plugins such
//     as dra-driver-cpu adjust each container as it is created, and the record
//     carries the cpuset they set;
//   - on deletion it calls UnprepareResources and then finalises the pod (status
//     terminated, delete with grace period 0 and a UID precondition), as the kubelet's
//     status manager does.
//
// The DRA manager also wipes the driver's ResourceSlices 30 s after the plugin has
// gone, exactly as a kubelet does (that delay is the kubelet's constant).
package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	kubeletevents "k8s.io/kubernetes/pkg/kubelet/events"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	plugincache "k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Event reasons the harness emits on top of the kubelet's own.
const (
	// ReasonCDIInjected (Normal) lists the device nodes the CDI library injected.
	ReasonCDIInjected = "CDIInjected"
	// ReasonFailedCDIInjection (Warning): the CDI library refused the spec or ids.
	ReasonFailedCDIInjection = "FailedCDIInjection"
	// ReasonFailedUnprepare (Warning): UnprepareResources failed; retried.
	ReasonFailedUnprepare = "FailedUnprepareDynamicResources"
)

// Config configures a Harness.
type Config struct {
	// Kubeconfig of the node's identity (system:node:<NodeName> in system:nodes),
	// e.g. from cluster.NodeKubeconfig.
	Kubeconfig string
	NodeName   string
	// RegistryDir is the plugin registry directory the plugin watcher watches
	// (the kubelet's plugins_registry).
	RegistryDir string
	// CDIDir is the CDI spec directory the "runtime" loads.
	CDIDir string
	// StateDir holds the DRA manager's checkpoint (dra/) and one JSON record per
	// running pod (pods/<namespace>_<name>_<uid>.json).
	StateDir string
	// FeatureGates for the kubelet code (the same as the control plane's).
	FeatureGates map[string]bool
	// NodeLabels are added to the Node at registration.
	NodeLabels map[string]string
	// Logger for the harness and the kubelet code (klog.Background() when zero).
	Logger logr.Logger
	// NRISocket, when set, makes the harness also the runtime end of NRI on this
	// socket (see nri.go): plugins that connect (kubernetes-sigs' dra-driver-cpu)
	// see every container created and adjust it, and each container's record
	// carries the cpuset they gave it. Off when empty.
	NRISocket string
	// PluginPaths is the mount namespace of plugins that run in their own (as a
	// DaemonSet's containers do), as the harness sees it: a path prefix inside
	// it (say /var/lib/kubelet) to the directory on this machine that is mounted
	// there. A plugin registers its DRA endpoint by the path it sees; a kubelet
	// dials it unchanged because the DaemonSet mounts the host's kubelet
	// directory at the same path, the harness through this map. Longest prefix
	// wins; paths under no prefix are dialled as they are.
	PluginPaths map[string]string
}

// Injection is what the CDI library injected into one container's OCI spec.
type Injection struct {
	Container  string   `json:"container"`
	CDIDevices []string `json:"cdiDevices"`
	// DeviceNodes are the paths of linux.devices.
	DeviceNodes []string              `json:"deviceNodes"`
	Devices     []ocispec.LinuxDevice `json:"devices,omitempty"`
	Mounts      []ocispec.Mount       `json:"mounts,omitempty"`
	Env         []string              `json:"env,omitempty"`
	Hooks       *ocispec.Hooks        `json:"hooks,omitempty"`
	// CPUSetCPUs and CPUSetMems are the container's cpuset as NRI plugins left it
	// (linux.resources.cpu.cpus and .mems; empty when none set them, or with NRI
	// off).
	CPUSetCPUs string `json:"cpusetCpus,omitempty"`
	CPUSetMems string `json:"cpusetMems,omitempty"`
}

// PodRecord is written to StateDir/pods/ when a pod starts, and removed when it
// has been unprepared.
type PodRecord struct {
	Namespace  string      `json:"namespace"`
	Name       string      `json:"name"`
	UID        types.UID   `json:"uid"`
	Containers []Injection `json:"containers"`
}

// Harness is a running kubelet stand-in.
type Harness struct {
	cfg     Config
	client  kubernetes.Interface
	logger  logr.Logger
	manager *dra.Manager
	pm      pluginmanager.PluginManager
	rec     record.EventRecorder
	bcast   record.EventBroadcaster

	podInformer cache.SharedIndexInformer
	queue       workqueue.TypedRateLimitingInterface[types.UID]

	mu        sync.Mutex
	pods      map[types.UID]*v1.Pod // last seen object of each pod
	started   sets.Set[types.UID]   // prepared, injected and reported Running
	finalized sets.Set[types.UID]   // unprepared and deleted
	regs      map[string]string     // driver -> endpoint of registered plugins
	regCond   *sync.Cond

	nri   *nriRuntime // nil with NRI off
	recMu sync.Mutex  // serialises writes of the pod records

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// featureGatesOnce: the kubelet code reads the process-global feature gate.
var featureGatesMu sync.Mutex

// New validates the configuration and builds the clients; Start runs it.
func New(cfg Config) (*Harness, error) {
	if cfg.NodeName == "" || cfg.Kubeconfig == "" || cfg.RegistryDir == "" || cfg.CDIDir == "" || cfg.StateDir == "" {
		return nil, errors.New("harness: NodeName, Kubeconfig, RegistryDir, CDIDir and StateDir are required")
	}
	if cfg.Logger.GetSink() == nil {
		cfg.Logger = klog.Background()
	}
	if len(cfg.FeatureGates) > 0 {
		featureGatesMu.Lock()
		err := utilfeature.DefaultMutableFeatureGate.SetFromMap(cfg.FeatureGates)
		featureGatesMu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("harness: feature gates: %w", err)
		}
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("harness: kubeconfig: %w", err)
	}
	restCfg.UserAgent = "topodra-kubelet-harness/" + cfg.NodeName
	restCfg.QPS, restCfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{cfg.RegistryDir, cfg.CDIDir, filepath.Join(cfg.StateDir, "dra"), filepath.Join(cfg.StateDir, "pods")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	h := &Harness{
		cfg:       cfg,
		client:    client,
		logger:    cfg.Logger.WithName("harness"),
		pods:      map[types.UID]*v1.Pod{},
		started:   sets.New[types.UID](),
		finalized: sets.New[types.UID](),
		regs:      map[string]string{},
	}
	h.regCond = sync.NewCond(&h.mu)
	return h, nil
}

// Client is the node-identity clientset the harness uses.
func (h *Harness) Client() kubernetes.Interface { return h.client }

// Start registers the Node, starts the DRA manager, the plugin manager and the pod
// loop. It returns once the Node exists and the pod informer has synced; Stop ends
// everything.
func (h *Harness) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, h.cfg.Logger))
	h.cancel = cancel

	if err := h.registerNode(ctx); err != nil {
		cancel()
		return err
	}

	h.bcast = record.NewBroadcaster(record.WithContext(ctx))
	h.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: h.client.CoreV1().Events("")})
	h.rec = h.bcast.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: h.cfg.NodeName})

	// Pods bound to this node, as the kubelet's API source sees them.
	factory := informers.NewSharedInformerFactoryWithOptions(h.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", h.cfg.NodeName).String()
		}))
	h.podInformer = factory.Core().V1().Pods().Informer()
	h.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](250*time.Millisecond, 10*time.Second),
		workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "pods"})
	_, err := h.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { h.observe(obj) },
		UpdateFunc: func(_, obj any) { h.observe(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*v1.Pod); ok {
				h.mu.Lock()
				h.pods[p.UID] = p.DeepCopy()
				h.mu.Unlock()
				h.queue.Add(p.UID)
			}
		},
	})
	if err != nil {
		cancel()
		return err
	}

	// The kubelet's DRA manager, with its checkpoint, and its registration handler.
	h.manager, err = dra.NewManager(h.cfg.Logger, h.client, filepath.Join(h.cfg.StateDir, "dra"))
	if err != nil {
		cancel()
		return fmt.Errorf("harness: DRA manager: %w", err)
	}
	sourcesReady := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return h.podInformer.HasSynced() })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return h.client.CoreV1().Nodes().Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
	}
	if err := h.manager.Start(ctx, h.activePods, getNode, sourcesReady); err != nil {
		cancel()
		return fmt.Errorf("harness: DRA manager start: %w", err)
	}

	if h.cfg.NRISocket != "" {
		if h.nri, err = startNRI(h.cfg.NRISocket, h.cfg.StateDir, h.cfg.Logger.WithName("nri"), h.refreshRecord); err != nil {
			cancel()
			return err
		}
	}

	// The kubelet's plugin manager: plugin watcher on the registry directory, the
	// reconciler, and the DRA handler (wrapped only to observe registrations).
	h.pm = pluginmanager.NewPluginManager(h.cfg.RegistryDir, h.rec)
	h.pm.AddHandler(registerapi.DRAPlugin, &observedHandler{PluginHandler: h.manager.GetWatcherHandler(), h: h})
	stopCh := make(chan struct{})
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		go func() { <-ctx.Done(); close(stopCh) }()
		h.pm.Run(ctx, sourcesReady, stopCh)
	}()

	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), h.podInformer.HasSynced) {
		cancel()
		return errors.New("harness: pod informer did not sync")
	}

	h.done.Add(2)
	go func() { defer h.done.Done(); h.heartbeat(ctx) }()
	go func() {
		defer h.done.Done()
		for h.processNext(ctx) {
		}
	}()
	go func() { <-ctx.Done(); h.queue.ShutDown() }()
	h.logger.Info("harness started", "node", h.cfg.NodeName, "registryDir", h.cfg.RegistryDir, "cdiDir", h.cfg.CDIDir)
	return nil
}

// Stop ends the harness (the Node object and its pods stay).
func (h *Harness) Stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.done.Wait()
	if h.nri != nil {
		h.nri.stop()
	}
	if h.manager != nil {
		h.manager.Stop()
	}
	if h.bcast != nil {
		h.bcast.Shutdown()
	}
	h.regCond.Broadcast()
}

// WaitRegistered blocks until a plugin for driver is registered through the plugin
// manager (or ctx ends), and returns its DRA endpoint.
func (h *Harness) WaitRegistered(ctx context.Context, driver string) (string, error) {
	stop := context.AfterFunc(ctx, func() {
		h.mu.Lock()
		h.regCond.Broadcast()
		h.mu.Unlock()
	})
	defer stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		if ep, ok := h.regs[driver]; ok {
			return ep, nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("plugin %s not registered: %w", driver, ctx.Err())
		}
		h.regCond.Wait()
	}
}

// Registered reports whether a plugin for driver is registered now.
func (h *Harness) Registered(driver string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.regs[driver]
	return ok
}

// Endpoint is the DRA endpoint the plugin for driver registered last, or "".
func (h *Harness) Endpoint(driver string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.regs[driver]
}

// RecordPath is where the injection record of a pod is written.
func (h *Harness) RecordPath(namespace, name string, uid types.UID) string {
	return filepath.Join(h.cfg.StateDir, "pods", fmt.Sprintf("%s_%s_%s.json", namespace, name, uid))
}

// ReadRecord loads a pod's injection record.
func ReadRecord(path string) (*PodRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r PodRecord
	return &r, json.Unmarshal(b, &r)
}

type observedHandler struct {
	plugincache.PluginHandler
	h *Harness
}

func (o *observedHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return o.PluginHandler.ValidatePlugin(ctx, name, mapPath(o.h.cfg.PluginPaths, endpoint), versions)
}

func (o *observedHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	if mapped := mapPath(o.h.cfg.PluginPaths, endpoint); mapped != endpoint {
		o.h.logger.Info("plugin endpoint in its mount namespace", "driver", name, "endpoint", endpoint, "here", mapped)
		endpoint = mapped
	}
	err := o.PluginHandler.RegisterPlugin(ctx, name, endpoint, versions, timeout)
	o.h.logger.Info("plugin registration", "driver", name, "endpoint", endpoint, "versions", versions, "err", err)
	if err == nil {
		o.h.mu.Lock()
		o.h.regs[name] = endpoint
		o.h.regCond.Broadcast()
		o.h.mu.Unlock()
	}
	return err
}

func (o *observedHandler) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	endpoint = mapPath(o.h.cfg.PluginPaths, endpoint)
	o.PluginHandler.DeRegisterPlugin(ctx, name, endpoint)
	o.h.logger.Info("plugin deregistered", "driver", name, "endpoint", endpoint)
	o.h.mu.Lock()
	if o.h.regs[name] == endpoint {
		delete(o.h.regs, name)
	}
	o.h.regCond.Broadcast()
	o.h.mu.Unlock()
}

// registerNode creates (or adopts) the Node as the node itself, then reports it
// Ready with some allocatable CPU, memory and pods.
func (h *Harness) registerNode(ctx context.Context) error {
	labels := map[string]string{
		"kubernetes.io/hostname": h.cfg.NodeName,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	for k, v := range h.cfg.NodeLabels {
		labels[k] = v
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.cfg.NodeName, Labels: labels}}
	_, err := h.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("harness: register node %s: %w", h.cfg.NodeName, err)
	}
	return h.updateNodeStatus(ctx)
}

func (h *Harness) updateNodeStatus(ctx context.Context) error {
	// A conflict, or NodeRestriction's "not allowed to modify taints": the node
	// lifecycle controller tainted the new Node (not-ready) between the Get and the
	// update, and the admission plugin compares the taints of the object sent, stale
	// now, before the API server would answer with a conflict. Both mean: read again.
	staleRead := func(err error) bool {
		return apierrors.IsConflict(err) ||
			(apierrors.IsForbidden(err) && strings.Contains(err.Error(), "not allowed to modify taints"))
	}
	return retry.OnError(retry.DefaultRetry, staleRead, func() error {
		n, err := h.client.CoreV1().Nodes().Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		res := v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse("224"),
			v1.ResourceMemory: resource.MustParse("2Ti"),
			v1.ResourcePods:   resource.MustParse("110"),
		}
		n.Status.Capacity, n.Status.Allocatable = res, res
		ready := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			Message: "topodra kubelet harness is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
		found := false
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == v1.NodeReady {
				if n.Status.Conditions[i].Status == v1.ConditionTrue {
					ready.LastTransitionTime = n.Status.Conditions[i].LastTransitionTime
				}
				n.Status.Conditions[i] = ready
				found = true
			}
		}
		if !found {
			n.Status.Conditions = append(n.Status.Conditions, ready)
		}
		n.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: h.cfg.NodeName}}
		n.Status.NodeInfo.KubeletVersion = "v1.37.2"
		n.Status.NodeInfo.OperatingSystem = "linux"
		n.Status.NodeInfo.Architecture = "amd64"
		n.Status.NodeInfo.ContainerRuntimeVersion = "cdi://tags.cncf.io/container-device-interface"
		_, err = h.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// heartbeat renews the node Lease every 10 s and the Ready condition every 40 s,
// so the node lifecycle controller never taints the node.
func (h *Harness) heartbeat(ctx context.Context) {
	leases := h.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	var lastStatus time.Time
	for {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			n, nerr := h.client.CoreV1().Nodes().Get(ctx, h.cfg.NodeName, metav1.GetOptions{})
			if nerr == nil {
				_, err = leases.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: h.cfg.NodeName, OwnerReferences: []metav1.OwnerReference{{
						APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(h.cfg.NodeName), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
				}, metav1.CreateOptions{})
			}
		case err == nil:
			l.Spec.RenewTime = &now
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			h.logger.Error(err, "node lease")
		}
		if time.Since(lastStatus) > 40*time.Second {
			if err := h.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
				h.logger.Error(err, "node status")
			} else {
				lastStatus = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (h *Harness) observe(obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	h.mu.Lock()
	h.pods[p.UID] = p.DeepCopy()
	h.mu.Unlock()
	h.queue.Add(p.UID)
}

// activePods is the DRA manager's view of the pods that may still use claims:
// bound here, not terminal and not finalised.
func (h *Harness) activePods() []*v1.Pod {
	var out []*v1.Pod
	for _, obj := range h.podInformer.GetStore().List() {
		p := obj.(*v1.Pod)
		if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		out = append(out, p)
	}
	return out
}

func (h *Harness) processNext(ctx context.Context) bool {
	uid, quit := h.queue.Get()
	if quit {
		return false
	}
	defer h.queue.Done(uid)
	if err := h.sync(ctx, uid); err != nil {
		if ctx.Err() != nil {
			return false
		}
		h.logger.Info("pod sync failed, will retry", "podUID", uid, "err", err)
		h.queue.AddRateLimited(uid)
		return true
	}
	h.queue.Forget(uid)
	return true
}

func (h *Harness) sync(ctx context.Context, uid types.UID) error {
	h.mu.Lock()
	last := h.pods[uid]
	started := h.started.Has(uid)
	finalized := h.finalized.Has(uid)
	h.mu.Unlock()
	if last == nil || finalized {
		return nil
	}
	cur, exists, err := h.podInformer.GetStore().GetByKey(last.Namespace + "/" + last.Name)
	if err != nil {
		return err
	}
	var pod *v1.Pod
	if exists && cur.(*v1.Pod).UID == uid {
		pod = cur.(*v1.Pod)
	}
	switch {
	case pod == nil:
		// Gone from the API (force-deleted): release what it held.
		return h.teardown(ctx, last, false)
	case pod.DeletionTimestamp != nil:
		return h.teardown(ctx, pod, true)
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return h.teardown(ctx, pod, false)
	case started:
		return nil
	default:
		return h.startPod(ctx, pod)
	}
}

// startPod does what the kubelet's SyncPod and the runtime do for the claims:
// PrepareResources, then CDI injection per container, then status Running.
func (h *Harness) startPod(ctx context.Context, pod *v1.Pod) error {
	logger := h.logger.WithValues("pod", klog.KObj(pod), "podUID", pod.UID)
	if err := h.manager.PrepareResources(ctx, pod); err != nil {
		logger.Info("PrepareResources failed", "err", err)
		h.rec.Eventf(pod, v1.EventTypeWarning, kubeletevents.FailedPrepareDynamicResources, "Failed to prepare dynamic resources: %v", err)
		return err
	}
	rec := PodRecord{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	var allNodes []string
	for _, c := range pod.Spec.Containers {
		info, err := h.manager.GetResources(pod, &c)
		if err != nil {
			h.rec.Eventf(pod, v1.EventTypeWarning, kubeletevents.FailedToCreateContainer, "Error: %v", err)
			return err
		}
		ids := make([]string, 0, len(info.CDIDevices))
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		inj, err := InjectCDI(h.cfg.CDIDir, ids)
		if err != nil {
			logger.Info("CDI injection failed", "container", c.Name, "err", err)
			h.rec.Eventf(pod, v1.EventTypeWarning, ReasonFailedCDIInjection, "container %s: %v", c.Name, err)
			return err
		}
		inj.Container = c.Name
		rec.Containers = append(rec.Containers, *inj)
		allNodes = append(allNodes, inj.DeviceNodes...)
		logger.Info("CDI injected", "container", c.Name, "cdiDevices", ids, "deviceNodes", inj.DeviceNodes,
			"mounts", len(inj.Mounts), "env", inj.Env)
	}
	if h.nri != nil {
		// As the runtime does, after the CDI edits (the env they inject is what
		// the CPU driver reads its claim's CPUs from).
		if err := h.nri.startPod(ctx, pod, &rec); err != nil {
			logger.Info("NRI failed", "err", err)
			h.rec.Eventf(pod, v1.EventTypeWarning, kubeletevents.FailedToCreateContainer, "Error: %v", err)
			return err
		}
	}
	if err := h.writeRecord(&rec); err != nil {
		return err
	}
	if len(allNodes) > 0 {
		h.rec.Eventf(pod, v1.EventTypeNormal, ReasonCDIInjected, "CDI injected device nodes %s", strings.Join(allNodes, ","))
	}
	if err := h.setRunning(ctx, pod); err != nil {
		return err
	}
	h.rec.Eventf(pod, v1.EventTypeNormal, kubeletevents.StartedContainer, "Started containers (simulated by the topodra kubelet harness)")
	h.mu.Lock()
	h.started.Insert(pod.UID)
	h.mu.Unlock()
	return nil
}

func (h *Harness) setRunning(ctx context.Context, pod *v1.Pod) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.UID != pod.UID {
			return apierrors.NewNotFound(v1.Resource("pods"), pod.Name)
		}
		now := metav1.Now()
		p.Status.Phase = v1.PodRunning
		p.Status.HostIP = "127.0.0.1"
		p.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
		if p.Status.StartTime == nil {
			p.Status.StartTime = &now
		}
		for _, ct := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
			setCondition(&p.Status, v1.PodCondition{Type: ct, Status: v1.ConditionTrue, LastTransitionTime: now})
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true),
				ContainerID: "cdi://" + string(p.UID) + "/" + c.Name,
				State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
			})
		}
		_, err = h.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// teardown unprepares the pod's claims and, when the pod still exists, finalises it
// like the kubelet: containers terminated, then delete with grace 0 (deleting) or
// leave it terminal (it completed).
func (h *Harness) teardown(ctx context.Context, pod *v1.Pod, deleting bool) error {
	logger := h.logger.WithValues("pod", klog.KObj(pod), "podUID", pod.UID)
	if h.nri != nil {
		// Containers stop before their claims are unprepared, as in a kubelet.
		if err := h.nri.stopPod(ctx, pod.UID); err != nil {
			logger.Info("NRI stop failed", "err", err)
			return err
		}
	}
	if err := h.manager.UnprepareResources(ctx, pod); err != nil {
		logger.Info("UnprepareResources failed", "err", err)
		h.rec.Eventf(pod, v1.EventTypeWarning, ReasonFailedUnprepare, "Failed to unprepare dynamic resources: %v", err)
		return err
	}
	h.recMu.Lock()
	_ = os.Remove(h.RecordPath(pod.Namespace, pod.Name, pod.UID))
	h.recMu.Unlock()
	logger.Info("pod resources unprepared", "deleting", deleting)
	if deleting {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil || p.UID != pod.UID {
				return err
			}
			now := metav1.Now()
			for i := range p.Status.ContainerStatuses {
				cs := &p.Status.ContainerStatuses[i]
				cs.Ready = false
				cs.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 137, Reason: "Killed", FinishedAt: now}}
			}
			for _, ct := range []v1.PodConditionType{v1.ContainersReady, v1.PodReady} {
				setCondition(&p.Status, v1.PodCondition{Type: ct, Status: v1.ConditionFalse, LastTransitionTime: now})
			}
			if p.Status.Phase == v1.PodRunning || p.Status.Phase == v1.PodPending {
				p.Status.Phase = v1.PodFailed
			}
			_, err = h.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		err = h.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	h.mu.Lock()
	h.finalized.Insert(pod.UID)
	h.started.Delete(pod.UID)
	if deleting || !h.podExists(pod) {
		delete(h.pods, pod.UID)
	}
	h.mu.Unlock()
	return nil
}

// writeRecord writes a pod's record, with the containers' cpusets as NRI has them
// now.
func (h *Harness) writeRecord(rec *PodRecord) error {
	h.recMu.Lock()
	defer h.recMu.Unlock()
	return h.writeRecordLocked(rec)
}

func (h *Harness) writeRecordLocked(rec *PodRecord) error {
	if h.nri != nil {
		sets := h.nri.cpusets(rec.UID)
		for i := range rec.Containers {
			c := &rec.Containers[i]
			c.CPUSetCPUs, c.CPUSetMems = sets[c.Container][0], sets[c.Container][1]
		}
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(h.RecordPath(rec.Namespace, rec.Name, rec.UID), b)
}

// refreshRecord rewrites the record of a running pod whose containers an NRI
// plugin updated; a pod without a record yet gets the update when it is written.
func (h *Harness) refreshRecord(uid types.UID) {
	h.mu.Lock()
	pod := h.pods[uid]
	h.mu.Unlock()
	if pod == nil {
		return
	}
	// Under recMu, so that a record teardown removes is not written back.
	h.recMu.Lock()
	defer h.recMu.Unlock()
	rec, err := ReadRecord(h.RecordPath(pod.Namespace, pod.Name, pod.UID))
	if err != nil {
		return
	}
	if err := h.writeRecordLocked(rec); err != nil {
		h.logger.Info("rewriting a pod record after an NRI update failed", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}

func (h *Harness) podExists(pod *v1.Pod) bool {
	cur, ok, _ := h.podInformer.GetStore().GetByKey(pod.Namespace + "/" + pod.Name)
	return ok && cur.(*v1.Pod).UID == pod.UID
}

func setCondition(st *v1.PodStatus, c v1.PodCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			if st.Conditions[i].Status == c.Status {
				c.LastTransitionTime = st.Conditions[i].LastTransitionTime
			}
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

// InjectCDI does what a container runtime does with the CDI ids the kubelet passes:
// load every spec in dir with the CDI library, fail on any spec error, inject ids
// into an empty OCI spec, and report the result.
func InjectCDI(dir string, ids []string) (*Injection, error) {
	inj := &Injection{CDIDevices: ids}
	if len(ids) == 0 {
		return inj, nil
	}
	c, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache: %w", err)
	}
	if err := c.Refresh(); err != nil {
		return nil, fmt.Errorf("CDI refresh %s: %w", dir, err)
	}
	var errs []string
	for path, es := range c.GetErrors() {
		for _, e := range es {
			errs = append(errs, fmt.Sprintf("%s: %v", path, e))
		}
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, fmt.Errorf("CDI spec errors: %s", strings.Join(errs, "; "))
	}
	spec := &ocispec.Spec{Process: &ocispec.Process{}, Linux: &ocispec.Linux{}}
	unresolved, err := c.InjectDevices(spec, ids...)
	if err != nil {
		return nil, fmt.Errorf("CDI inject %v (unresolved %v): %w", ids, unresolved, err)
	}
	if spec.Linux != nil {
		inj.Devices = spec.Linux.Devices
		for _, d := range spec.Linux.Devices {
			inj.DeviceNodes = append(inj.DeviceNodes, d.Path)
		}
	}
	inj.Mounts = spec.Mounts
	if spec.Process != nil {
		inj.Env = spec.Process.Env
	}
	inj.Hooks = spec.Hooks
	return inj, nil
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
