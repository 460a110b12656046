package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"topodra.dev/tests/cluster"
)

// kindResult is one claim size and kind over its waves.
type kindResult struct {
	Size        int          `json:"size"`
	Kind        string       `json:"kind"`
	Attribute   string       `json:"attribute,omitempty"`
	Waves       []waveResult `json:"waves"`
	PodsPerSec  float64      `json:"podsPerSec"` // medians over the waves
	P50Ms       float64      `json:"p50Ms"`
	P99Ms       float64      `json:"p99Ms"`
	Unscheduled float64      `json:"unscheduled"`
	Misaligned  float64      `json:"misaligned,omitempty"`
	// Rate is the steady arrival rate of the waves, pods a second (0: as fast
	// as the client allows, a saturating wave).
	Rate float64 `json:"ratePerSec,omitempty"`
	// CPUMsPerPod is each process's CPU time per bound pod, create to bound,
	// and TeardownCPUMsPerPod that of deleting them (medians over the waves);
	// LimiterWaitSeconds the most any wave's requests waited on each process's
	// client rate limiter; BoundBy what held each wave back.
	CPUMsPerPod         map[string]float64 `json:"cpuMsPerPod,omitempty"`
	TeardownCPUMsPerPod map[string]float64 `json:"teardownCPUMsPerPod,omitempty"`
	LimiterWaitSeconds  map[string]float64 `json:"limiterWaitSeconds,omitempty"`
	BoundBy             []string           `json:"boundBy,omitempty"`
	// WindowSeconds is how long the kind's waves ran, their teardown included,
	// and NRTWrites the NodeResourceTopology writes topodra's controller made in
	// that window by the audit log (the DRA stack's common kinds, where the
	// controller ran): the writes a pod of each arrival rate, at every fleet size.
	WindowSeconds float64 `json:"windowSeconds,omitempty"`
	NRTWrites     *int    `json:"nrtWrites,omitempty"`
	// from and to bound that window.
	from, to time.Time
}

// perPod is the median over waves of a cost's CPU per bound pod, by process.
func perPod(ws []waveResult, of func(waveResult) *cost) map[string]float64 {
	byProc := map[string][]float64{}
	for _, w := range ws {
		c := of(w)
		if c == nil || w.Bound == 0 {
			continue
		}
		for name, s := range c.CPUSeconds {
			// What the pods cost: the process's background over the same
			// time taken off, never below zero.
			s = max(0, s-c.BackgroundCPUSeconds[name])
			byProc[name] = append(byProc[name], s*1000/float64(w.Bound))
		}
	}
	if len(byProc) == 0 {
		return nil
	}
	out := map[string]float64{}
	for name, v := range byProc {
		out[name] = medianOf(v)
	}
	return out
}

func summarize(k kindResult) kindResult {
	k.CPUMsPerPod = perPod(k.Waves, func(w waveResult) *cost { return w.Cost })
	k.TeardownCPUMsPerPod = perPod(k.Waves, func(w waveResult) *cost { return w.Teardown })
	k.BoundBy = nil
	for _, w := range k.Waves {
		if w.BoundBy != "" {
			k.BoundBy = append(k.BoundBy, w.BoundBy)
		}
		if w.Cost == nil {
			continue
		}
		for name, v := range w.Cost.LimiterWaitSeconds {
			if k.LimiterWaitSeconds == nil {
				k.LimiterWaitSeconds = map[string]float64{}
			}
			k.LimiterWaitSeconds[name] = max(k.LimiterWaitSeconds[name], v)
		}
	}
	k.PodsPerSec = median(k.Waves, func(r waveResult) float64 { return r.PodsPerSec })
	k.P50Ms = median(k.Waves, func(r waveResult) float64 { return r.P50Ms })
	k.P99Ms = median(k.Waves, func(r waveResult) float64 { return r.P99Ms })
	k.Unscheduled = median(k.Waves, func(r waveResult) float64 { return float64(r.TimedOutPod) })
	k.Misaligned = median(k.Waves, func(r waveResult) float64 { return float64(r.Misaligned) })
	return k
}

// stackResult is everything measured on one stack's control plane.
type stackResult struct {
	Kinds           []kindResult       `json:"kinds"`
	MemoryPeak      map[string]int64   `json:"memoryPeakBytes"`      // RSS during the waves
	MemoryIdleStart map[string]int64   `json:"memoryIdleStartBytes"` // RSS when the idle period starts
	MemoryIdle      map[string]int64   `json:"memoryIdleBytes"`      // RSS at its end
	GoHeap          map[string]float64 `json:"goHeapBytes"`          // go_memstats_heap_inuse_bytes at the end of the waves
	GoHeapIdle      map[string]float64 `json:"goHeapIdleBytes,omitempty"`
	// GoHeapPeak is the highest go_memstats_heap_inuse_bytes of each Go
	// component over the readings of the common waves, HeapSeries every reading.
	GoHeapPeak map[string]float64 `json:"goHeapPeakBytes,omitempty"`
	HeapSeries *heapSeries        `json:"heapSeries,omitempty"`
	// MemoryPeakDRAOnly is the RSS peak of the waves only the DRA stack runs,
	// after the common readings.
	MemoryPeakDRAOnly map[string]int64 `json:"memoryPeakDRAOnlyBytes,omitempty"`
	// IdleCost is what every process spent in the idle period.
	IdleCost     *cost  `json:"idleCost,omitempty"`
	FeatureGates string `json:"featureGates"`
	// RequestsPerPod is each client's requests over the common waves per bound pod.
	RequestsPerPod map[string]float64 `json:"requestsPerPod,omitempty"`
	// BackgroundCores is each process's CPU, in cores, over a quiet window
	// before the waves; the per-pod CPU figures have it taken off.
	BackgroundCores map[string]float64 `json:"backgroundCores,omitempty"`
	// PodsBound counts the pods bound in the common waves, which Requests and
	// RequestsByClient cover: the divisor of the per-pod figures.
	PodsBound int `json:"podsBound"`
	// The API server's process_cpu_seconds_total spent during the waves and
	// during the idle period.
	APIServerCPU      map[string]float64        `json:"apiserverCPUSeconds,omitempty"`
	MemorySeries      *memSeries                `json:"memorySeries,omitempty"`
	Requests          map[string]float64        `json:"requests"` // apiserver_request_total during the waves, by verb and resource
	RequestsByClient  map[string]map[string]int `json:"requestsByClient"`
	IdleByClient      map[string]map[string]int `json:"idleRequestsByClient"`
	IdleSeconds       float64                   `json:"idleSeconds"`
	SliceBytesPerGPU  float64                   `json:"sliceBytesPerGPU,omitempty"`
	NvidiaBytesPerGPU float64                   `json:"nvidiaSliceBytesPerGPU,omitempty"`
	// NvidiaPluginBytesPerGPU: the slices NVIDIA's plugin itself published
	// (-nvidia-slices), as replicated over the fleet for the peer waves.
	NvidiaPluginBytesPerGPU float64            `json:"nvidiaPluginSliceBytesPerGPU,omitempty"`
	ControllerMetrics       map[string]float64 `json:"controllerMetrics,omitempty"`
	// ControllerWaves is what the controller's counters moved by over the
	// common waves (and the write delay after them).
	ControllerWaves map[string]float64 `json:"controllerWaves,omitempty"`
	// ControllerUntilSettled is the controller's requests by the audit log from the
	// common waves' start until it had nothing left to write, which was
	// ControllerSettleSeconds after the waves ended.
	ControllerUntilSettled  map[string]int `json:"controllerUntilSettled,omitempty"`
	ControllerSettleSeconds float64        `json:"controllerSettleSeconds,omitempty"`
	// ControllerStillWaiting is the nodes that still waited for a write when
	// the harness stopped waiting (settleLimit): then the count is cut short.
	ControllerStillWaiting int `json:"controllerStillWaiting,omitempty"`
	// ControllerPacing is the write pacing the controller ran with, from its own
	// metrics; absent in runs made before it was recorded.
	ControllerPacing *controllerPacing `json:"controllerPacing,omitempty"`
	Plugins          *pluginFigures    `json:"plugins,omitempty"`
	// AttributeSets are the attribute-set waves' phases (-attribute-sets).
	AttributeSets []attributeSetFigures `json:"attributeSets,omitempty"`
	// NodePath is the node path over the common waves (-node-path).
	NodePath *nodePathFigures `json:"nodePath,omitempty"`
	Notes    []string         `json:"notes,omitempty"`
	// Scheduler is what the stack's scheduler says with --version: the
	// Kubernetes release each stack's scheduling code is from.
	Scheduler string `json:"scheduler,omitempty"`
	// wavesWindow is the window of the common waves that RequestsByClient
	// covers.
	wavesWindow time.Duration
}

// schedulerVersion is `bin --version`, or why it could not be read.
func schedulerVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return fmt.Sprintf("unknown (%s --version: %v)", filepath.Base(bin), err)
	}
	return strings.TrimSpace(string(out))
}

// clientQPS is the API client rate (and half the burst) of every scheduler, the
// controller-manager and the harness in both stacks, lifted so far that no
// client limiter shapes a wave: kube-scheduler sends 4 requests per DRA pod on
// its client against 1 per legacy pod, so at 200 QPS the DRA waves measured
// the limiter. Each wave records rest_client_rate_limiter_duration_seconds of
// every component to show the limiters did not wait (boundBy names one that did).
const clientQPS = 5000

// clusterDirs are the control planes' directories (etcd's data, the audit log,
// the logs: hundreds of MB a stack) of the run in progress; main removes them
// once the run's results are written, and keeps them when it fails, for its logs.
var clusterDirs []string

func startCluster(ctx context.Context, c config, name string) (*cluster.Cluster, string, error) {
	dir, err := os.MkdirTemp("", "topodra-scale-"+name+"-")
	if err != nil {
		return nil, "", err
	}
	clusterDirs = append(clusterDirs, dir)
	apiArgs, auditLog, err := cluster.AuditLogArgs(dir)
	if err != nil {
		return nil, "", err
	}
	progress("%s: starting the control plane and kwok in %s", name, dir)
	apiArgs = append(apiArgs, "--audit-log-maxsize=0")
	if c.goaway > 0 {
		apiArgs = append(apiArgs, fmt.Sprintf("--goaway-chance=%g", c.goaway))
	}
	env := map[string][]string{}
	if c.gogc > 0 {
		env[cluster.APIServer] = []string{fmt.Sprintf("GOGC=%d", c.gogc)}
	}
	extra := map[string][]string{cluster.APIServer: apiArgs}
	if s := kwokLeaseSeconds(c.kwokLease); s > 0 {
		// Later flags win: these override the cluster package's 40 s Lease.
		// The grace period is how long the node lifecycle controller waits
		// for a renewal before it marks a node NotReady and taints it.
		extra[cluster.Kwok] = []string{fmt.Sprintf("--node-lease-duration-seconds=%d", s)}
		extra[cluster.ControllerManager] = []string{fmt.Sprintf("--node-monitor-grace-period=%ds", s)}
	}
	cl, err := cluster.Start(ctx, cluster.Options{
		Dir:       filepath.Join(dir, "cluster"),
		Kwok:      true,
		ExtraArgs: extra,
		Env:       env,
		Verbosity: 1,
		ClientQPS: clientQPS,
		// Kubernetes' own defaults: the alpha DRAListTypeAttributes gate
		// switches kube-scheduler to its experimental allocator, so the list
		// form of numaNode runs apart (-list-form), with the gate on for both
		// stacks.
		FeatureGates: map[string]bool{"DRAListTypeAttributes": c.listForm},
	})
	return cl, auditLog, err
}

func clusterPids(cl *cluster.Cluster) map[string]int {
	out := map[string]int{}
	for name, pids := range cl.Pids() {
		if len(pids) > 0 {
			out[name] = pids[len(pids)-1]
		}
	}
	return out
}

func runDRA(ctx context.Context, c config) (stackResult, error) {
	var res stackResult
	if bin, err := cluster.FindTool(os.Getenv(cluster.ToolsEnv), "kube-scheduler"); err == nil {
		res.Scheduler = "kube-scheduler: " + schedulerVersion(ctx, bin)
	}
	if c.bins.plugin == "" || c.bins.simNode == "" {
		return res, fmt.Errorf("topodra-kubelet-plugin and topodra-sim-node must be built (cargo build --release -p topodra-kubelet-plugin -p topodra-fake-nvml)")
	}
	cl, auditLog, err := startCluster(ctx, c, "dra")
	if err != nil {
		return res, err
	}
	defer func() { _ = cl.Stop() }()
	res.FeatureGates = cl.FeatureGatesFlag()
	cs, err := fastClient(cl)
	if err != nil {
		return res, err
	}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: driverName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + driverName + `"`},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		return res, err
	}

	simDir, err := os.MkdirTemp("", "topodra-scale-sim-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(simDir)
	flags, serveFlags, err := simFlags(c.bins.simNode, "dgx-h100", simDir)
	if err != nil {
		return res, err
	}
	progress("dra: building %d nodes' ResourceSlices with topodra's slice builder", c.nodes)
	ordered, err := simulatedSlices(c.bins.plugin, flags, c.nodes, "int")
	if err != nil {
		return res, err
	}
	res.SliceBytesPerGPU = sliceBytesPerGPU(ordered[0])
	// NVIDIA's attribute set includes brand, architecture and cudaDriverVersion,
	// which topodra's default (lean) slices leave out: its equivalent is cut from
	// one node's slices with every attribute. The attribute-set waves publish
	// every node's full slices: built here once for both.
	fullNodes := 1
	if c.attributeSets && c.draOnly {
		fullNodes = c.nodes
	}
	full, err := simulatedSlices(c.bins.plugin, append(append([]string(nil), flags...), "--attributes=full"), fullNodes, "int")
	if err != nil {
		return res, err
	}
	var nv []resourcev1.ResourceSlice
	for _, s := range full[0] {
		nv = append(nv, nvidiaEquivalent(s))
	}
	res.NvidiaBytesPerGPU = sliceBytesPerGPU(nv)

	if err := createNodes(ctx, cs, c.nodes, false); err != nil {
		return res, err
	}
	// The node path's nodes publish their own slices, from plugins started
	// after their Node objects exist; the harness publishes the others'.
	npNodes := min(c.nodePath, c.nodes)
	var np *nodePathRun
	if npNodes > 0 {
		progress("dra: the node path: %d real topodra-kubelet-plugin processes and a kubelet stand-in", npNodes)
		npStart := time.Now()
		if np, err = startNodePath(ctx, cl, c, serveFlags, npNodes); err != nil {
			return res, fmt.Errorf("node path: %w", err)
		}
		defer np.stop()
		if err := publishSlices(ctx, cs, ordered[npNodes:]); err != nil {
			return res, err
		}
		if err := waitSlices(ctx, cs, c.nodes, len(ordered[0]), 5*time.Minute); err != nil {
			return res, fmt.Errorf("node path: %w (logs: %s/node-path-plugin-*.log)", err, cl.LogsDir)
		}
		startTo := time.Now()
		startup, err := auditCounts(auditLog, npStart, startTo)
		if err != nil {
			return res, err
		}
		np.startSeconds, np.startup = startTo.Sub(npStart).Seconds(), startup[pluginClient]
		if err := np.watch(ctx, cs); err != nil {
			return res, err
		}
	} else if err := publishSlices(ctx, cs, ordered); err != nil {
		return res, err
	}
	progress("dra: %d nodes and their slices are in", c.nodes)

	sampler := newMemSampler(clusterPids(cl))
	defer sampler.close()
	m := newMeter(cl)
	if np != nil {
		m.settle = func(unprepared bool) { np.settle(ctx, unprepared, 2*time.Minute) }
		m.addGroup(pluginClient, np.fleet.pids())
	}
	var ctrl *controllerProc
	if c.bins.controller != "" {
		if ctrl, err = startController(ctx, cl, c); err != nil {
			res.Notes = append(res.Notes, "controller not run: "+err.Error())
		} else {
			defer ctrl.stop()
			res.ControllerPacing = pacingOf(ctrl.metrics())
			sampler.add("topodra-controller", ctrl.cmd.Process.Pid)
			m.add("topodra-controller", ctrl.cmd.Process.Pid, "")
		}
	} else {
		res.Notes = append(res.Notes, "controller not built: no controller figures")
	}

	const ns = "scale"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return res, err
	}
	if err := waitServiceAccount(ctx, cs, ns); err != nil {
		return res, err
	}
	progress("dra: %s of background CPU, nothing asked of the stack", backgroundWindow)
	res.BackgroundCores = m.measureBackground(ctx, backgroundWindow)
	sampler.reset()
	m.takeHeapPeaks()
	var ctrlBefore map[string]float64
	if ctrl != nil {
		ctrlBefore = ctrl.metrics()
	}
	before, err := apiserverMetrics(ctx, cs, "apiserver_request_total", cpuMetric)
	if err != nil {
		return res, err
	}
	from := time.Now()
	sampler.mark("waves")
	// The workload both stacks run before their memory is read: NUMA-aligned
	// pods of the sizes one NUMA zone holds, in saturating waves, then at a
	// steady rate.
	for _, rate := range waveRates(c) {
		if err := res.each(commonSizes(c.sizes), func(k int) (kindResult, error) {
			return draKind(ctx, cs, c, m, ns, k, "aligned", "", rate)
		}); err != nil {
			return res, err
		}
	}
	if c.churn > 0 {
		churnFrom := time.Now()
		kr, err := draChurn(ctx, cs, c, m, ns)
		if err != nil {
			return res, err
		}
		kr.window(churnFrom)
		res.Kinds = append(res.Kinds, kr)
	}
	if err := res.wavesDone(ctx, cs, sampler, m, auditLog, before, from); err != nil {
		return res, err
	}
	if ctrl != nil {
		// Its writes are paced (a write delay, a per-node interval and a fleet-wide
		// budget): the common waves' share is in once no node waits for a write
		// and the count stops moving. What it wrote until then, by the audit log.
		wavesEnd := time.Now()
		limit := settleLimit(c.nodes, res.ControllerPacing)
		settled, waiting := ctrl.settle(ctx, 15*time.Second, limit)
		res.ControllerWaves = diff(ctrl.metrics(), ctrlBefore)
		res.ControllerSettleSeconds = settled.Sub(wavesEnd).Seconds()
		res.ControllerStillWaiting = int(waiting)
		if waiting > 0 {
			progress("dra: %d nodes still waited for a NodeResourceTopology write after %s: the count until settled is cut short", int(waiting), limit)
		}
		evs, err := cluster.ReadAuditLog(auditLog, from, settled)
		if err != nil {
			return res, err
		}
		res.ControllerUntilSettled = countRequests(evs)["topodra-controller"]
		nrtWritesByKind(res.Kinds, evs)
	}
	if np != nil {
		res.NodePath = np.figures()
		res.NodePath.WavesSeconds = res.wavesWindow.Seconds()
		res.deriveNodePath(c.nodes)
		progress("dra: node path: %d pods there, %d prepared, %d unprepared; prepare p50 %.1f ms, p99 %.1f ms; %d prepare errors, %d unprepare errors, %d cut short",
			res.NodePath.Pods, res.NodePath.Prepared, res.NodePath.Unprepared, res.NodePath.Prepare.P50Ms, res.NodePath.Prepare.P99Ms,
			res.NodePath.PrepareErrors, res.NodePath.UnprepareErrors, res.NodePath.CutShort)
		if c.draOnly {
			// What only the DRA stack runs republishes the fleet's slices
			// between its waves: the node path ends here, and the harness
			// publishes its nodes' slices as it does the others'.
			np.stop()
			m.settle = nil
			var names []string
			for i := 0; i < npNodes; i++ {
				names = append(names, nodeName(i))
			}
			if err := deleteNodeSlices(ctx, cs, names); err != nil {
				return res, err
			}
			if err := publishSlices(ctx, cs, ordered[:npNodes]); err != nil {
				return res, err
			}
		}
	}
	if !c.draOnly {
		res.HeapSeries = m.series()
		res.MemorySeries = sampler.series()
		return res, nil
	}

	// What only the DRA stack runs, after the readings above.
	sampler.mark("dra-only")
	sampler.reset()
	var beyondZone []int
	for _, k := range c.sizes {
		if k > gpusPerZone {
			beyondZone = append(beyondZone, k)
		}
	}
	if err := res.each(beyondZone, func(k int) (kindResult, error) {
		return draKind(ctx, cs, c, m, ns, k, "aligned", "", 0)
	}); err != nil {
		return res, err
	}
	if err := res.each(c.sizes, func(k int) (kindResult, error) {
		return draKind(ctx, cs, c, m, ns, k, "any", "", 0)
	}); err != nil {
		return res, err
	}
	// The same aligned claims created beforehand: the waves then time the
	// scheduler alone, without the controller-manager making each pod's claim.
	if err := res.each(c.sizes, func(k int) (kindResult, error) {
		return draPrecreated(ctx, cs, c, m, ns, k)
	}); err != nil {
		return res, err
	}

	if c.variants {
		progress("dra: the same slices with their devices shuffled")
		if err := republish(ctx, cs, shuffled(ordered, 42)); err != nil {
			return res, err
		}
		if err := res.each(commonSizes(c.sizes), func(k int) (kindResult, error) {
			return draKind(ctx, cs, c, m, ns, k, "aligned", "shuffled", 0)
		}); err != nil {
			return res, err
		}
		if c.listForm {
			progress("dra: numaNode in its list form")
			list, err := simulatedSlices(c.bins.plugin, flags, c.nodes, "list")
			if err != nil {
				return res, err
			}
			if err := republish(ctx, cs, list); err != nil {
				return res, err
			}
			if err := res.each(commonSizes(c.sizes), func(k int) (kindResult, error) {
				return draKind(ctx, cs, c, m, ns, k, "aligned", "list", 0)
			}); err != nil {
				return res, err
			}
		}
		if err := republish(ctx, cs, ordered); err != nil {
			return res, err
		}
	}

	if c.attributeSets {
		sampler.mark("attribute-sets")
		kinds, sets, err := attributeSetWaves(ctx, cs, c, m, ns, ordered, full)
		res.Kinds = append(res.Kinds, kinds...)
		res.AttributeSets = sets
		if err != nil {
			return res, err
		}
	}

	if c.nvidiaSlices != "" {
		sampler.mark("nvidia-peer")
		kinds, bytesPerGPU, err := nvidiaPeerWaves(ctx, cs, c, m, ns, ordered)
		if err != nil {
			return res, err
		}
		res.Kinds = append(res.Kinds, kinds...)
		res.NvidiaPluginBytesPerGPU = bytesPerGPU
	}
	res.MemoryPeakDRAOnly, _ = sampler.snapshot()

	var plugins *pluginFleet
	if k := min(c.plugins, c.nodes); k > 0 {
		sampler.mark("plugins")
		progress("dra: replacing the slices by %d real topodra-kubelet-plugin processes", k)
		if err := republish(ctx, cs, nil); err != nil {
			return res, err
		}
		startFrom := time.Now()
		fleet, err := startPlugins(ctx, cl, c, serveFlags, k)
		if fleet != nil {
			defer fleet.stop()
		}
		if err != nil {
			return res, err
		}
		// A plugin that did not come up costs the plugin figures, not the
		// waves measured so far.
		if err := waitSlices(ctx, cs, k, len(ordered[0]), 5*time.Minute); err != nil {
			res.Notes = append(res.Notes, "plugins: "+err.Error()+" (logs: "+cl.LogsDir+"/plugin-*.log); no plugin figures")
		} else {
			startTo := time.Now()
			startup, err := auditCounts(auditLog, startFrom, startTo)
			if err != nil {
				return res, err
			}
			res.Plugins = &pluginFigures{Count: k, StartSeconds: startTo.Sub(startFrom).Seconds(), Startup: startup["topodra-kubelet-plugin"]}
			plugins = fleet
		}
	}
	if ctrl != nil {
		// The controller delays its NodeResourceTopology writes (10 s by default)
		// to batch them: the idle period starts once the plugins' start-up has
		// been written, or it would count that start-up's tail.
		ctrl.settle(ctx, 15*time.Second, 2*time.Minute)
	}
	progress("dra: idle for %s, counting every client's requests", c.idle)
	if err := res.idle(ctx, cs, c.idle, sampler, m, auditLog); err != nil {
		return res, err
	}
	if ctrl != nil {
		res.ControllerMetrics = ctrl.metrics()
	}
	if plugins != nil {
		res.Plugins.RSSTotal, res.Plugins.RSSLargest = plugins.rss()
	}
	return res, nil
}

// backgroundWindow is the quiet window before the waves in which each
// process's background CPU is measured.
const backgroundWindow = 15 * time.Second

// commonSizes are the claim sizes both stacks run: what one NUMA zone of the
// layout holds (the legacy single-numa-node policy refuses larger pods).
func commonSizes(sizes []int) []int {
	var out []int
	for _, k := range sizes {
		if k <= gpusPerZone {
			out = append(out, k)
		}
	}
	return out
}

// waveRates are the saturating waves (0) and, when -steady-rate is set, the
// steady ones.
func waveRates(c config) []float64 {
	if c.steadyRate > 0 {
		return []float64{0, c.steadyRate}
	}
	return []float64{0}
}

// defaultKwokLease is the kubelet's node Lease duration, the cluster package's
// for kwok.
const defaultKwokLease = 40 * time.Second

// kwokLeaseSeconds is -kwok-lease where it lengthened the Lease, else 0.
func kwokLeaseSeconds(d time.Duration) int {
	if d <= defaultKwokLease {
		return 0
	}
	return int(d / time.Second)
}

// wavePods is how many pods of k GPUs ask for the -fill share of the fleet.
func wavePods(c config, k int) int { return int(float64(c.nodes*gpusPerNode) * c.fill / float64(k)) }

// fastClient is the admin client with the same lifted rate limit as the
// components: the harness creates the waves' pods, and a limiter there would
// cap every stack alike.
func fastClient(cl *cluster.Cluster) (kubernetes.Interface, error) {
	cfg, err := cl.RESTConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = clientQPS, 2*clientQPS
	return kubernetes.NewForConfig(cfg)
}

// each runs one kind per claim size, in order, and keeps its results.
func (res *stackResult) each(sizes []int, one func(k int) (kindResult, error)) error {
	for _, k := range sizes {
		from := time.Now()
		kr, err := one(k)
		if err != nil {
			return err
		}
		kr.window(from)
		res.Kinds = append(res.Kinds, kr)
	}
	return nil
}

// wavesDone records what the waves since `from` cost: peak memory, the API
// server's requests (against `before`) and Go heap, requests by client.
func (res *stackResult) wavesDone(ctx context.Context, cs kubernetes.Interface, sampler *memSampler, m *meter, auditLog string, before map[string]float64, from time.Time) error {
	to := time.Now()
	res.wavesWindow = to.Sub(from)
	res.MemoryPeak, _ = sampler.snapshot()
	res.GoHeapPeak = m.takeHeapPeaks()
	res.PodsBound = 0
	for _, k := range res.Kinds {
		res.PodsBound += k.bound()
	}
	after, err := apiserverMetrics(ctx, cs, "apiserver_request_total", "go_memstats_heap_inuse_bytes", cpuMetric)
	if err != nil {
		return err
	}
	res.Requests = requestsByVerbResource(diff(after, before))
	res.GoHeap = map[string]float64{"kube-apiserver": after["go_memstats_heap_inuse_bytes"]}
	res.APIServerCPU = map[string]float64{"waves": after[cpuMetric] - before[cpuMetric]}
	if res.RequestsByClient, err = auditCounts(auditLog, from, to); err != nil {
		return err
	}
	if res.PodsBound > 0 {
		res.RequestsPerPod = map[string]float64{}
		for client, counts := range res.RequestsByClient {
			for _, n := range counts {
				res.RequestsPerPod[client] += float64(n) / float64(res.PodsBound)
			}
		}
	}
	return nil
}

// idle waits `d` doing nothing and records memory at both ends and every
// client's requests in between.
func (res *stackResult) idle(ctx context.Context, cs kubernetes.Interface, d time.Duration, sampler *memSampler, m *meter, auditLog string) error {
	sampler.reset()
	sampler.mark("idle")
	_, res.MemoryIdleStart = sampler.snapshot()
	a := m.read(ctx)
	before, err := apiserverMetrics(ctx, cs, cpuMetric)
	if err != nil {
		return err
	}
	from := time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return ctx.Err()
	}
	to := time.Now()
	res.IdleSeconds = to.Sub(from).Seconds()
	_, res.MemoryIdle = sampler.snapshot()
	idle := between(a, m.read(ctx), peaks{})
	res.IdleCost = &idle
	res.HeapSeries = m.series()
	// Scraped after the window closes: the scrape itself is not counted.
	after, err := apiserverMetrics(ctx, cs, cpuMetric, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return err
	}
	if res.APIServerCPU == nil {
		res.APIServerCPU = map[string]float64{}
	}
	res.APIServerCPU["idle"] = after[cpuMetric] - before[cpuMetric]
	res.GoHeapIdle = map[string]float64{"kube-apiserver": after["go_memstats_heap_inuse_bytes"]}
	res.MemorySeries = sampler.series()
	res.IdleByClient, err = auditCounts(auditLog, from, to)
	return err
}

// pluginFigures are the real plugins' start and idle.
type pluginFigures struct {
	Count        int            `json:"count"`
	StartSeconds float64        `json:"startSeconds"` // all started to all slices published
	Startup      map[string]int `json:"startupRequests"`
	RSSTotal     int64          `json:"rssTotalBytes"`
	RSSLargest   int64          `json:"rssLargestBytes"`
}

// draKind runs the waves of one claim size and kind; variant names the slices'
// form ("", "shuffled", "list", or the peer waves' "topodra-a", "nvidia",
// "topodra-b"); rate > 0 makes them steady waves.
func draKind(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns string, k int, kind, variant string, rate float64) (kindResult, error) {
	return classKind(ctx, cs, c, m, ns, driverName, k, kind, variant, rate)
}

// alignOn is the attribute an aligned claim of k GPUs matches: four GPUs share
// a NUMA node on this layout, eight only the NVLink domain.
func alignOn(k int) string {
	if k > gpusPerZone {
		return driverName + "/nvlinkDomain"
	}
	return "resource.kubernetes.io/numaNode"
}

// classKind is draKind for the devices of DeviceClass `class`.
func classKind(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns, class string, k int, kind, variant string, rate float64) (kindResult, error) {
	attribute := ""
	if kind == "aligned" {
		attribute = alignOn(k)
	}
	name := fmt.Sprintf("gpu-%d-%s", k, kind)
	if class != driverName {
		name += "-" + strings.ReplaceAll(class, ".", "-")
	}
	if err := ensureTemplate(ctx, cs, classTemplate(ns, name, class, k, attribute)); err != nil {
		return kindResult{}, err
	}
	label := kindLabel(kind, variant, rate)
	kr := kindResult{Size: k, Kind: label, Attribute: attribute, Rate: rate}
	pods := wavePods(c, k)
	for w := 0; w < c.waves; w++ {
		wave := fmt.Sprintf("w%d-%s-%d", w, label, k)
		r, err := m.wave(ctx, func() (waveResult, error) {
			r, _, err := runWave(ctx, cs, ns, wave, pods, draPod(ns, wave, name), c.stall, rate)
			return r, err
		}, func() error { return clearWave(ctx, cs, ns, wave) })
		if err != nil {
			return kr, fmt.Errorf("wave %s: %w", wave, err)
		}
		waveProgress("dra", label, k, w, r)
		kr.Waves = append(kr.Waves, r)
		waveGap(ctx, c)
	}
	return summarize(kr), nil
}

// waveGap pauses after a common wave's teardown for -wave-gap, or until ctx ends.
func waveGap(ctx context.Context, c config) {
	if c.waveGap <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(c.waveGap):
	}
}

// kindLabel is the row name: the kind, its slices' variant, "steady" for waves
// at a steady rate.
func kindLabel(kind, variant string, rate float64) string {
	label := kind
	if variant != "" {
		label += "-" + variant
	}
	if rate > 0 {
		label += "-steady"
	}
	return label
}

func waveProgress(stack, label string, k, w int, r waveResult) {
	extra := ""
	if r.Misaligned > 0 {
		extra = fmt.Sprintf(", %d refused (TopologyAffinityError)", r.Misaligned)
	}
	progress("%s %-22s %s GPUs, wave %d: %d/%d bound in %.1fs, %.1f pods/s, p50 %.0f ms, p99 %.0f ms%s; bound by %s",
		stack, label, sizeText(k), w+1, r.Bound, r.Pods, r.Seconds, r.PodsPerSec, r.P50Ms, r.P99Ms, extra, r.BoundBy)
}

// draPrecreated runs aligned waves whose claims exist before the pods (and
// before the wave's first reading).
func draPrecreated(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns string, k int) (kindResult, error) {
	attribute := alignOn(k)
	spec := claimTemplate(ns, "unused", k, attribute).Spec.Spec
	kr := kindResult{Size: k, Kind: "aligned-precreated", Attribute: attribute}
	pods := wavePods(c, k)
	for w := 0; w < c.waves; w++ {
		wave := fmt.Sprintf("w%d-pre-%d", w, k)
		if err := parallel(pods, 16, func(i int) error {
			_, err := cs.ResourceV1().ResourceClaims(ns).Create(ctx, &resourcev1.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%04d", wave, i), Labels: map[string]string{waveLabel: wave}},
				Spec:       spec,
			}, metav1.CreateOptions{})
			return err
		}); err != nil {
			return kr, err
		}
		newPod := func(i int) *corev1.Pod {
			p := draPod(ns, wave, "")(i)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(fmt.Sprintf("%s-%04d", wave, i))}}
			return p
		}
		r, err := m.wave(ctx, func() (waveResult, error) {
			r, _, err := runWave(ctx, cs, ns, wave, pods, newPod, c.stall, 0)
			return r, err
		}, func() error {
			sel := metav1.ListOptions{LabelSelector: waveLabel + "=" + wave}
			if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, sel); err != nil {
				return err
			}
			if err := cs.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
				return err
			}
			return clearWave(ctx, cs, ns, wave)
		})
		if err != nil {
			return kr, fmt.Errorf("wave %s: %w", wave, err)
		}
		waveProgress("dra", kr.Kind, k, w, r)
		kr.Waves = append(kr.Waves, r)
	}
	return summarize(kr), nil
}

// republish replaces every slice of our driver.
func republish(ctx context.Context, cs kubernetes.Interface, slices [][]resourcev1.ResourceSlice) error {
	return republishDriver(ctx, cs, driverName, slices)
}

// republishDriver deletes every slice of `driver`, waits until none is listed,
// then publishes `slices`.
func republishDriver(ctx context.Context, cs kubernetes.Interface, driver string, slices [][]resourcev1.ResourceSlice) error {
	sel := metav1.ListOptions{FieldSelector: "spec.driver=" + driver}
	if err := cs.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return err
	}
	for {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.FieldSelector, Limit: 1})
		if err != nil {
			return err
		}
		if len(l.Items) == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return publishSlices(ctx, cs, slices)
}

func waitServiceAccount(ctx context.Context, cs kubernetes.Interface, ns string) error {
	for i := 0; i < 120; i++ {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("no default ServiceAccount in %s", ns)
}

// controllerProc is topodra-controller, run with the admin kubeconfig against the
// DRA fleet.
type controllerProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func startController(ctx context.Context, cl *cluster.Cluster, c config) (*controllerProc, error) {
	if err := installNRTCRD(ctx, cl, c.repo); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	host, port, _ := net.SplitHostPort(addr)
	logf, err := os.Create(filepath.Join(cl.LogsDir, "topodra-controller.log"))
	if err != nil {
		return nil, err
	}
	args := append([]string{"--leader-elect=false", "--http-bind-address=" + host, "--http-port=" + port, "--log-format=json"}, c.controllerArgs...)
	cmd := exec.Command(c.bins.controller, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &controllerProc{cmd: cmd, addr: addr, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	for i := 0; i < 240; i++ {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				progress("dra: topodra-controller ready")
				return p, nil
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("topodra-controller not ready within a minute (log: %s)", logf.Name())
}

func (p *controllerProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// settleLimit is how long the harness waits for the controller's paced writes
// after the common waves: every node may wait for one turn of the budget, so half
// as long again as a turn for every node, and never less than 20 minutes.
func settleLimit(nodes int, pacing *controllerPacing) time.Duration {
	perSecond := pacing.writesPerSecond()
	return max(20*time.Minute, time.Duration(1.5*float64(nodes)/perSecond*float64(time.Second)))
}

// settle waits until no node waits for a write and the controller's write count
// has not moved for quiet, at most limit. It returns when the count last moved
// and the nodes still waiting (0 unless the limit cut it short).
func (p *controllerProc) settle(ctx context.Context, quiet, limit time.Duration) (time.Time, float64) {
	state := func() (writes, waiting float64) {
		for k, v := range p.metrics() {
			if strings.HasPrefix(k, "topodra_controller_writes_total") {
				writes += v
			}
			if k == "topodra_controller_nrt_nodes_waiting" {
				waiting = v
			}
		}
		return writes, waiting
	}
	last, waiting := state()
	since, end := time.Now(), time.Now().Add(limit)
	for (waiting > 0 || time.Since(since) < quiet) && time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(time.Second)
		var w float64
		if w, waiting = state(); w != last {
			last, since = w, time.Now()
		}
	}
	return since, waiting
}

// metrics are the controller's own samples (topodra_controller_*).
func (p *controllerProc) metrics() map[string]float64 {
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body, "topodra_controller_")
}

// installNRTCRD applies the NodeResourceTopology CRD as the chart renders it.
func installNRTCRD(ctx context.Context, cl *cluster.Cluster, repo string) error {
	helm, err := cluster.FindTool(os.Getenv(cluster.ToolsEnv), "helm")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, helm, "template", "topodra", filepath.Join(repo, "deploy", "helm", "topodra"),
		"--kube-version", "1.37.0", "--set", "nodeResourceTopology.installCRD=true", "--show-only", "templates/nrt-crd.yaml").Output()
	if err != nil {
		return fmt.Errorf("helm template: %w", err)
	}
	f := filepath.Join(cl.Dir, "nrt-crd.yaml")
	if err := os.WriteFile(f, out, 0o644); err != nil {
		return err
	}
	if out, err := cl.Kubectl(ctx, "apply", "-f", f); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	_, err = cl.Kubectl(ctx, "wait", "--for=condition=Established", "crd/noderesourcetopologies.topology.node.k8s.io", "--timeout=60s")
	return err
}
