package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/k8stopologyawareschedwg/podfingerprint"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"topodra.dev/tests/cluster"
)

const topoScheduler = "topology-aware-scheduler"

var nrtGVR = schema.GroupVersionResource{Group: "topology.node.k8s.io", Version: "v1alpha2", Resource: "noderesourcetopologies"}

// numaZones is the DGX H100 layout the updater reports: two NUMA nodes, each with
// 4 GPUs, 112 CPUs and 1 TiB.
const numaZones, gpusPerZone = 2, 4

// topologyAffinityError is the status reason a kubelet gives a pod its Topology
// Manager cannot place (pod phase Failed, message "Resources cannot be
// allocated with Topology locality").
const topologyAffinityError = "TopologyAffinityError"

// updater plays the NFD topology updater and the kubelet's Topology Manager on
// every legacy node: it learns where each pod's GPUs went as the Topology
// Manager (single-numa-node, pod scope) would place them, first fitting NUMA
// zone, and publishes each node's NodeResourceTopology at its interval. A pod
// bound where no zone has room is refused as the kubelet refuses it at
// admission: its status becomes Failed with reason TopologyAffinityError, it
// holds no GPU, and it is counted.
type updater struct {
	dyn      dynamic.Interface
	kubelet  kubernetes.Interface // writes the refusals, as the node's kubelet
	mu       sync.Mutex
	free     map[string]*[numaZones]int
	pods     map[string]map[string]bool // node -> namespace/name of its pods
	placed   map[types.UID]placement
	dirty    map[string]bool
	misalign int
	writes   int
	refused  map[types.UID]bool // status already set to Failed
	// triggered are the nodes where a pod was admitted since their last
	// write: NFD's updater watches the kubelet's state directory
	// (-kubelet-state-dir, on by default) and writes when the device
	// manager's checkpoint changes, which it does when it allocates. A pod's
	// removal frees its devices in that checkpoint only at the node's next
	// allocation, so removals wait for a trigger or the interval.
	triggered map[string]bool
	// onDelete triggers a node's write when a pod leaves it as well (-updater-on-delete).
	onDelete bool
}

type placement struct {
	node string
	zone int
	k    int
}

func newUpdater(dyn dynamic.Interface, kubelet kubernetes.Interface, nodes int, onDelete bool) *updater {
	u := &updater{dyn: dyn, kubelet: kubelet, free: map[string]*[numaZones]int{}, pods: map[string]map[string]bool{},
		placed: map[types.UID]placement{}, dirty: map[string]bool{}, refused: map[types.UID]bool{}, triggered: map[string]bool{}, onDelete: onDelete}
	for i := 0; i < nodes; i++ {
		u.free[nodeName(i)] = &[numaZones]int{gpusPerZone, gpusPerZone}
		u.pods[nodeName(i)] = map[string]bool{}
		u.dirty[nodeName(i)] = true
	}
	return u
}

func gpusOf(p *corev1.Pod) int {
	n := 0
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
			n += int(q.Value())
		}
	}
	return n
}

func (u *updater) bound(p *corev1.Pod) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, done := u.placed[p.UID]; done {
		return
	}
	k := gpusOf(p)
	zones := u.free[p.Spec.NodeName]
	if zones == nil || k == 0 {
		return
	}
	u.pods[p.Spec.NodeName][p.Namespace+"/"+p.Name] = true
	u.dirty[p.Spec.NodeName] = true
	u.triggered[p.Spec.NodeName] = true
	for z := range zones {
		if zones[z] >= k {
			zones[z] -= k
			u.placed[p.UID] = placement{p.Spec.NodeName, z, k}
			u.dirty[p.Spec.NodeName] = true
			return
		}
	}
	u.placed[p.UID] = placement{p.Spec.NodeName, -1, k}
	u.misalign++
}

func (u *updater) gone(p *corev1.Pod) {
	u.mu.Lock()
	defer u.mu.Unlock()
	pl, ok := u.placed[p.UID]
	if !ok {
		return
	}
	delete(u.placed, p.UID)
	delete(u.refused, p.UID)
	delete(u.pods[pl.node], p.Namespace+"/"+p.Name)
	u.dirty[pl.node] = true
	if u.onDelete {
		u.triggered[pl.node] = true
	}
	if pl.zone >= 0 {
		u.free[pl.node][pl.zone] += pl.k
		u.dirty[pl.node] = true
	}
}

// mustRefuse says whether p is a pod placed where no zone had room whose
// status is still kwok's Running. The refusal waits for kwok's first status
// (its pod IP): kwok makes a pod ready only while it has no IP, so it leaves
// the Failed status alone afterwards, where writing first would race it.
func (u *updater) mustRefuse(p *corev1.Pod) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	pl, ok := u.placed[p.UID]
	if !ok || pl.zone >= 0 || u.refused[p.UID] || p.Status.PodIP == "" || p.Status.Phase == corev1.PodFailed {
		return false
	}
	u.refused[p.UID] = true
	return true
}

// refuse fails the pod as the kubelet's admission does.
func (u *updater) refuse(ctx context.Context, p *corev1.Pod) {
	p = p.DeepCopy()
	p.Status.Phase = corev1.PodFailed
	p.Status.Reason = topologyAffinityError
	p.Status.Message = "Resources cannot be allocated with Topology locality"
	p.Status.Conditions = nil
	if _, err := u.kubelet.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		progress("legacy: refusing %s: %v", p.Name, err)
	}
}

// takeMisaligned returns the misaligned count since the last call.
func (u *updater) takeMisaligned() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := u.misalign
	u.misalign = 0
	return n
}

// watchPods follows the legacy pods until ctx ends.
func (u *updater) watchPods(ctx context.Context, cs kubernetes.Interface, ns string) {
	for ctx.Err() == nil {
		w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Deleted:
				u.gone(p)
			case p.Spec.NodeName != "":
				u.bound(p)
				if u.mustRefuse(p) {
					go u.refuse(ctx, p)
				}
			}
		}
	}
}

// publish writes the objects of the nodes that changed since the last publish;
// onlyTriggered limits it to the nodes where a pod was admitted since.
func (u *updater) publish(ctx context.Context, onlyTriggered bool) error {
	u.mu.Lock()
	type obj struct {
		node        string
		free        [numaZones]int
		fingerprint string
	}
	var todo []obj
	for n := range u.dirty {
		if onlyTriggered && !u.triggered[n] {
			continue
		}
		delete(u.dirty, n)
		delete(u.triggered, n)
		fp := podfingerprint.NewFingerprint(len(u.pods[n]))
		for key := range u.pods[n] {
			ns, name, _ := strings.Cut(key, "/")
			_ = fp.Add(ns, name)
		}
		todo = append(todo, obj{n, *u.free[n], fp.Sign()})
	}
	u.mu.Unlock()
	return parallel(len(todo), 8, func(i int) error {
		return u.write(ctx, todo[i].node, todo[i].free, todo[i].fingerprint)
	})
}

// write publishes one node's object with the fingerprint of the pods it accounts
// for, as the NFD updater does: the topology-aware scheduler's cache trusts an
// object only when that fingerprint matches the pods it sees on the node.
func (u *updater) write(ctx context.Context, node string, free [numaZones]int, fingerprint string) error {
	var zones []any
	for z := 0; z < numaZones; z++ {
		zones = append(zones, map[string]any{
			"name": fmt.Sprintf("node-%d", z), "type": "Node",
			"resources": []any{
				map[string]any{"name": "nvidia.com/gpu", "capacity": fmt.Sprint(gpusPerZone), "allocatable": fmt.Sprint(gpusPerZone), "available": fmt.Sprint(free[z])},
				map[string]any{"name": "cpu", "capacity": "112", "allocatable": "112", "available": "112"},
				map[string]any{"name": "memory", "capacity": "1Ti", "allocatable": "1Ti", "available": "1Ti"},
			},
		})
	}
	o := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
		"metadata": map[string]any{"name": node},
		"attributes": []any{
			map[string]any{"name": "topologyManagerPolicy", "value": "single-numa-node"},
			map[string]any{"name": "topologyManagerScope", "value": "pod"},
			map[string]any{"name": podfingerprint.Attribute, "value": fingerprint},
		},
		"zones": zones,
	}}
	api := u.dyn.Resource(nrtGVR)
	cur, err := api.Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, o, metav1.CreateOptions{})
	case err == nil:
		o.SetResourceVersion(cur.GetResourceVersion())
		_, err = api.Update(ctx, o, metav1.UpdateOptions{})
	}
	if err == nil {
		u.mu.Lock()
		u.writes++
		u.mu.Unlock()
	}
	return err
}

// runLegacy measures the legacy stack on its own control plane. It returns why it
// was skipped when the topology-aware scheduler is not built.
func runLegacy(ctx context.Context, c config) (*stackResult, string) {
	bin := c.bins.topoSched
	if bin == "" {
		var err error
		if bin, err = cluster.FindTool(os.Getenv(cluster.ToolsEnv), topoScheduler); err != nil {
			return nil, "the topology-aware scheduler is not built (bash tests/tools/build.sh topo-sched): " + err.Error()
		}
	}
	res, err := legacy(ctx, c, bin)
	if err != nil {
		return nil, "the legacy run failed: " + err.Error()
	}
	return res, ""
}

func legacy(ctx context.Context, c config, bin string) (*stackResult, error) {
	res := &stackResult{Scheduler: topoScheduler + ": " + schedulerVersion(ctx, bin)}
	cl, auditLog, err := startCluster(ctx, c, "legacy")
	if err != nil {
		return nil, err
	}
	defer func() { _ = cl.Stop() }()
	res.FeatureGates = cl.FeatureGatesFlag()
	cs, err := fastClient(cl)
	if err != nil {
		return nil, err
	}
	// The simulated updater and kubelet admission send their requests under
	// their own names, so the audit log charges them to what they stand for,
	// not to the harness.
	rest, err := cl.RESTConfig()
	if err != nil {
		return nil, err
	}
	rest.QPS, rest.Burst, rest.UserAgent = clientQPS, 2*clientQPS, "nfd-topology-updater"
	dyn, err := dynamic.NewForConfig(rest)
	if err != nil {
		return nil, err
	}
	updaterCS, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, err
	}
	kubeletRest := *rest
	kubeletRest.UserAgent = "kubelet"
	kubeletCS, err := kubernetes.NewForConfig(&kubeletRest)
	if err != nil {
		return nil, err
	}
	if err := installNRTCRD(ctx, cl, c.repo); err != nil {
		return nil, err
	}
	if err := createNodes(ctx, cs, c.nodes, true); err != nil {
		return nil, err
	}
	up := newUpdater(dyn, kubeletCS, c.nodes, c.updaterOnDelete)
	// Every node of that stack runs the updater itself as a DaemonSet pod; its pods
	// are part of the node's pod set, which the scheduler's cache checks the
	// objects' fingerprints against.
	if err := startDaemonPods(ctx, cs, up, c.nodes); err != nil {
		return nil, err
	}
	if err := up.publish(ctx, false); err != nil {
		return nil, fmt.Errorf("first NodeResourceTopology objects: %w", err)
	}
	progress("legacy: %d nodes with nvidia.com/gpu capacity and NodeResourceTopology objects", c.nodes)

	sched, err := startTopoScheduler(ctx, cl, c.repo, bin)
	if err != nil {
		return nil, err
	}
	defer func() { sched.stop() }()

	const ns = "scale"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := waitServiceAccount(ctx, cs, ns); err != nil {
		return nil, err
	}
	uctx, stopUpdater := context.WithCancel(ctx)
	defer stopUpdater()
	go up.watchPods(uctx, updaterCS, ns)
	go func() {
		t := time.NewTicker(c.updaterInt)
		defer t.Stop()
		// The state-directory trigger, checked once a second: NFD debounces its
		// file events too.
		notify := time.NewTicker(time.Second)
		defer notify.Stop()
		if !c.updaterNotify {
			notify.Stop()
		}
		for {
			var err error
			select {
			case <-uctx.Done():
				return
			case <-t.C:
				err = up.publish(uctx, false)
			case <-notify.C:
				err = up.publish(uctx, true)
			}
			if err != nil && uctx.Err() == nil {
				progress("legacy: updater: %v", err)
			}
		}
	}()

	pids := clusterPids(cl)
	pids[topoScheduler] = sched.cmd.Process.Pid
	sampler := newMemSampler(pids)
	defer sampler.close()
	m := newMeter(cl)
	m.add(topoScheduler, sched.cmd.Process.Pid, sched.metricsURL)
	progress("legacy: %s of background CPU, nothing asked of the stack", backgroundWindow)
	res.BackgroundCores = m.measureBackground(ctx, backgroundWindow)
	before, err := apiserverMetrics(ctx, cs, "apiserver_request_total", cpuMetric)
	if err != nil {
		return nil, err
	}
	from := time.Now()
	sampler.mark("waves")
	// One scheduler for the whole run, and objects written only at the
	// updater's interval: a wave that starts while the objects still count the
	// last wave's pods waits, as a real cluster does, until the next write and
	// the cache's resync. A wave gives up only after a silence longer than the
	// interval.
	stall := max(c.stall, c.updaterInt+2*topoResync)
	for _, k := range c.sizes {
		if k > gpusPerZone {
			res.Notes = append(res.Notes, fmt.Sprintf("legacy: %d-GPU pods skipped: under the single-numa-node policy no NUMA zone of this layout has %d GPUs", k, k))
		}
	}
	for _, rate := range waveRates(c) {
		for _, k := range commonSizes(c.sizes) {
			label := kindLabel("single-numa-node", "", rate)
			kr := kindResult{Size: k, Kind: label, Rate: rate}
			for w := 0; w < c.waves; w++ {
				wave := fmt.Sprintf("w%d-%s-%d", w, label, k)
				up.takeMisaligned()
				r, err := m.wave(ctx, func() (waveResult, error) {
					r, _, err := runWave(ctx, cs, ns, wave, wavePods(c, k), legacyPod(ns, wave, topoScheduler, k), stall, rate)
					time.Sleep(time.Second) // the updater's watch sees the last binds
					r.Misaligned = up.takeMisaligned()
					return r, err
				}, func() error { return clearWave(ctx, cs, ns, wave) })
				if err != nil {
					return nil, fmt.Errorf("wave %s: %w", wave, err)
				}
				waveProgress("legacy", label, k, w, r)
				kr.Waves = append(kr.Waves, r)
				waveGap(ctx, c)
			}
			res.Kinds = append(res.Kinds, summarize(kr))
		}
	}
	if c.churn > 0 {
		kr, err := churnKind(ctx, cs, c, m, ns, "legacy", stall, func(name string, k int) *corev1.Pod {
			p := legacyPod(ns, "", topoScheduler, k)(0)
			p.Name = name
			return p
		})
		if err != nil {
			return nil, err
		}
		res.Kinds = append(res.Kinds, kr)
	}
	if err := res.wavesDone(ctx, cs, sampler, m, auditLog, before, from); err != nil {
		return nil, err
	}
	res.Notes = append(res.Notes, fmt.Sprintf("legacy: the simulated topology updater wrote %d NodeResourceTopology objects (interval %s, only changed nodes; on admissions too: %v; on deletions too: %v; gap after each wave: %s)", up.writes, c.updaterInt, c.updaterNotify, c.updaterOnDelete, c.waveGap))
	if !c.draOnly {
		res.HeapSeries = m.series()
		res.MemorySeries = sampler.series()
		return res, nil
	}
	progress("legacy: idle for %s", c.idle)
	if err := res.idle(ctx, cs, c.idle, sampler, m, auditLog); err != nil {
		return nil, err
	}
	return res, nil
}

const daemonNamespace = "kube-system"

// startDaemonPods runs one topology-updater pod on each node (kwok runs it) and
// waits for them to be Running.
func startDaemonPods(ctx context.Context, cs kubernetes.Interface, up *updater, n int) error {
	err := parallel(n, 8, func(i int) error {
		name := "topology-updater-" + nodeName(i)
		_, err := cs.CoreV1().Pods(daemonNamespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: daemonNamespace},
			Spec: corev1.PodSpec{
				NodeName:    nodeName(i),
				Containers:  []corev1.Container{{Name: "updater", Image: "nfd"}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			},
		}, metav1.CreateOptions{})
		up.mu.Lock()
		up.pods[nodeName(i)][daemonNamespace+"/"+name] = true
		up.mu.Unlock()
		return err
	})
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(3 * time.Minute); ; {
		l, err := cs.CoreV1().Pods(daemonNamespace).List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running"})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range l.Items {
			if strings.HasPrefix(p.Name, "topology-updater-") {
				running++
			}
		}
		if running >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d topology-updater pods running after 3 minutes", running, n)
		}
		time.Sleep(time.Second)
	}
}

// topoResync is the topology-aware scheduler's cache resync period
// (cacheResyncPeriodSeconds).
const topoResync = 5 * time.Second

type schedProc struct {
	cmd        *exec.Cmd
	done       chan struct{}
	metricsURL string
}

// startTopoScheduler runs scheduler-plugins' kube-scheduler as a second scheduler
// with the configuration of tests/tools/topo-sched (over-reserve cache).
func startTopoScheduler(ctx context.Context, cl *cluster.Cluster, repo, bin string) (*schedProc, error) {
	tmpl, err := os.ReadFile(filepath.Join(repo, "tests", "tools", "topo-sched", "scheduler-config.yaml.in"))
	if err != nil {
		return nil, err
	}
	cfg := strings.NewReplacer("@KUBECONFIG@", cl.Kubeconfig, "@CACHE_RESYNC_PERIOD_SECONDS@", fmt.Sprint(int(topoResync.Seconds())), "@DISCARD_RESERVED_NODES@", "false").Replace(string(tmpl))
	// The same client rate as the DRA stack's scheduler.
	cfg = strings.Replace(cfg, "clientConnection:\n", fmt.Sprintf("clientConnection:\n  qps: %d\n  burst: %d\n", clientQPS, 2*clientQPS), 1)
	cfgPath := filepath.Join(cl.Dir, "topology-aware-scheduler.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(cl.LogsDir, topoScheduler+".log"))
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config="+cfgPath, "--authentication-kubeconfig="+cl.Kubeconfig,
		"--authorization-kubeconfig="+cl.Kubeconfig, "--bind-address=127.0.0.1", "--secure-port="+port,
		"--cert-dir="+filepath.Join(cl.Dir, "topology-aware-scheduler-certs"), "--profiling=false", "--v=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &schedProc{cmd: cmd, done: make(chan struct{}), metricsURL: "https://127.0.0.1:" + port + "/metrics"}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	select {
	case <-p.done:
		return nil, fmt.Errorf("%s exited at once (log %s)", topoScheduler, logf.Name())
	case <-time.After(3 * time.Second):
	}
	progress("legacy: %s running", topoScheduler)
	return p, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	return port, err
}

func (p *schedProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}
