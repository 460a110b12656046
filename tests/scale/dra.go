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
}

func summarize(k kindResult) kindResult {
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
	Plugins                 *pluginFigures     `json:"plugins,omitempty"`
	Notes                   []string           `json:"notes,omitempty"`
}

// clientQPS is the API client rate of every scheduler and the controller-manager
// in both stacks: their defaults (50, 20) would make the waves measure those limits
// (the DRA path has the controller-manager create each pod's claim). Large
// clusters raise them the same way.
const clientQPS = 200

func startCluster(ctx context.Context, c config, name string) (*cluster.Cluster, string, error) {
	dir, err := os.MkdirTemp("", "topodra-scale-"+name+"-")
	if err != nil {
		return nil, "", err
	}
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
	cl, err := cluster.Start(ctx, cluster.Options{
		Dir:       filepath.Join(dir, "cluster"),
		Kwok:      true,
		ExtraArgs: map[string][]string{cluster.APIServer: apiArgs},
		Env:       env,
		Verbosity: 1,
		ClientQPS: clientQPS,
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
	if c.bins.plugin == "" || c.bins.simNode == "" {
		return res, fmt.Errorf("topodra-kubelet-plugin and topodra-sim-node must be built (cargo build --release -p topodra-kubelet-plugin -p topodra-fake-nvml)")
	}
	cl, auditLog, err := startCluster(ctx, c, "dra")
	if err != nil {
		return res, err
	}
	defer func() { _ = cl.Stop() }()
	cs, err := cl.Client()
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
	var nv []resourcev1.ResourceSlice
	for _, s := range ordered[0] {
		nv = append(nv, nvidiaEquivalent(s))
	}
	res.NvidiaBytesPerGPU = sliceBytesPerGPU(nv)

	if err := createNodes(ctx, cs, c.nodes, false); err != nil {
		return res, err
	}
	if err := publishSlices(ctx, cs, ordered); err != nil {
		return res, err
	}
	progress("dra: %d nodes and their slices are in", c.nodes)

	sampler := newMemSampler(clusterPids(cl))
	defer sampler.close()
	var ctrl *controllerProc
	if c.bins.controller != "" {
		if ctrl, err = startController(ctx, cl, c); err != nil {
			res.Notes = append(res.Notes, "controller not run: "+err.Error())
		} else {
			defer ctrl.stop()
			sampler.add("topodra-controller", ctrl.cmd.Process.Pid)
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
	sampler.reset()
	before, err := apiserverMetrics(ctx, cs, "apiserver_request_total", cpuMetric)
	if err != nil {
		return res, err
	}
	from := time.Now()
	sampler.mark("waves")
	for _, k := range c.sizes {
		for _, kind := range []string{"aligned", "any"} {
			kr, err := draKind(ctx, cs, c, ns, k, kind, "")
			if err != nil {
				return res, err
			}
			res.Kinds = append(res.Kinds, kr)
		}
	}
	// The same aligned claims created beforehand: the waves then time the
	// scheduler alone, without the controller-manager making each pod's claim.
	for _, k := range c.sizes {
		kr, err := draPrecreated(ctx, cs, c, ns, k)
		if err != nil {
			return res, err
		}
		res.Kinds = append(res.Kinds, kr)
	}
	if err := res.wavesDone(ctx, cs, sampler, auditLog, before, from); err != nil {
		return res, err
	}

	if c.variants {
		variantSizes := []int{}
		for _, k := range c.sizes {
			if k <= 4 {
				variantSizes = append(variantSizes, k)
			}
		}
		sampler.mark("variants")
		progress("dra: the same slices with their devices shuffled")
		if err := republish(ctx, cs, shuffled(ordered, 42)); err != nil {
			return res, err
		}
		for _, k := range variantSizes {
			kr, err := draKind(ctx, cs, c, ns, k, "aligned", "shuffled")
			if err != nil {
				return res, err
			}
			res.Kinds = append(res.Kinds, kr)
		}
		progress("dra: numaNode in its list form")
		list, err := simulatedSlices(c.bins.plugin, flags, c.nodes, "list")
		if err != nil {
			return res, err
		}
		if err := republish(ctx, cs, list); err != nil {
			return res, err
		}
		for _, k := range variantSizes {
			kr, err := draKind(ctx, cs, c, ns, k, "aligned", "list")
			if err != nil {
				return res, err
			}
			res.Kinds = append(res.Kinds, kr)
		}
	}

	if c.nvidiaSlices != "" {
		sampler.mark("nvidia-peer")
		kinds, bytesPerGPU, err := nvidiaPeerWaves(ctx, cs, c, ns, ordered)
		if err != nil {
			return res, err
		}
		res.Kinds = append(res.Kinds, kinds...)
		res.NvidiaPluginBytesPerGPU = bytesPerGPU
	}

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
		if err := waitSlices(ctx, cs, k, len(ordered[0]), 5*time.Minute); err != nil {
			return res, err
		}
		startTo := time.Now()
		startup, err := auditCounts(auditLog, startFrom, startTo)
		if err != nil {
			return res, err
		}
		res.Plugins = &pluginFigures{Count: k, StartSeconds: startTo.Sub(startFrom).Seconds(), Startup: startup["topodra-kubelet-plugin"]}
		plugins = fleet
	}
	if ctrl != nil {
		// The controller delays its NodeResourceTopology writes (10 s by default)
		// to batch them: the idle period starts once the plugins' start-up has
		// been written, or it would count that start-up's tail.
		ctrl.settle(ctx, 15*time.Second, 2*time.Minute)
	}
	progress("dra: idle for %s, counting every client's requests", c.idle)
	if err := res.idle(ctx, cs, c.idle, sampler, auditLog); err != nil {
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

// wavesDone records what the waves since `from` cost: peak memory, the API
// server's requests (against `before`) and Go heap, requests by client.
func (res *stackResult) wavesDone(ctx context.Context, cs kubernetes.Interface, sampler *memSampler, auditLog string, before map[string]float64, from time.Time) error {
	to := time.Now()
	res.MemoryPeak, _ = sampler.snapshot()
	after, err := apiserverMetrics(ctx, cs, "apiserver_request_total", "go_memstats_heap_inuse_bytes", cpuMetric)
	if err != nil {
		return err
	}
	res.Requests = requestsByVerbResource(diff(after, before))
	res.GoHeap = map[string]float64{"kube-apiserver": after["go_memstats_heap_inuse_bytes"]}
	res.APIServerCPU = map[string]float64{"waves": after[cpuMetric] - before[cpuMetric]}
	res.RequestsByClient, err = auditCounts(auditLog, from, to)
	return err
}

// idle waits `d` doing nothing and records memory at both ends and every
// client's requests in between.
func (res *stackResult) idle(ctx context.Context, cs kubernetes.Interface, d time.Duration, sampler *memSampler, auditLog string) error {
	sampler.reset()
	sampler.mark("idle")
	_, res.MemoryIdleStart = sampler.snapshot()
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
// "topodra-b").
func draKind(ctx context.Context, cs kubernetes.Interface, c config, ns string, k int, kind, variant string) (kindResult, error) {
	return classKind(ctx, cs, c, ns, driverName, k, kind, variant)
}

// classKind is draKind for the devices of DeviceClass `class`.
func classKind(ctx context.Context, cs kubernetes.Interface, c config, ns, class string, k int, kind, variant string) (kindResult, error) {
	attribute := ""
	if kind == "aligned" {
		// Four GPUs share a NUMA node on this layout; eight share only the NVLink domain.
		attribute = "resource.kubernetes.io/numaNode"
		if k > 4 {
			attribute = driverName + "/nvlinkDomain"
		}
	}
	name := fmt.Sprintf("gpu-%d-%s", k, kind)
	if class != driverName {
		name += "-" + strings.ReplaceAll(class, ".", "-")
	}
	if err := ensureTemplate(ctx, cs, classTemplate(ns, name, class, k, attribute)); err != nil {
		return kindResult{}, err
	}
	label := kind
	if variant != "" {
		label = kind + "-" + variant
	}
	kr := kindResult{Size: k, Kind: label, Attribute: attribute}
	pods := int(float64(c.nodes*gpusPerNode) * c.fill / float64(k))
	for w := 0; w < c.waves; w++ {
		wave := fmt.Sprintf("w%d-%s-%d", w, label, k)
		r, _, err := runWave(ctx, cs, ns, wave, pods, draPod(ns, wave, name), c.stall)
		if err != nil {
			return kr, fmt.Errorf("wave %s: %w", wave, err)
		}
		progress("dra %-16s %d GPUs, wave %d: %d/%d bound in %.1fs, %.1f pods/s, p50 %.0f ms, p99 %.0f ms",
			label, k, w+1, r.Bound, r.Pods, r.Seconds, r.PodsPerSec, r.P50Ms, r.P99Ms)
		kr.Waves = append(kr.Waves, r)
		if err := clearWave(ctx, cs, ns, wave); err != nil {
			return kr, err
		}
	}
	return summarize(kr), nil
}

// draPrecreated runs aligned waves whose claims exist before the pods.
func draPrecreated(ctx context.Context, cs kubernetes.Interface, c config, ns string, k int) (kindResult, error) {
	attribute := "resource.kubernetes.io/numaNode"
	if k > 4 {
		attribute = driverName + "/nvlinkDomain"
	}
	spec := claimTemplate(ns, "unused", k, attribute).Spec.Spec
	kr := kindResult{Size: k, Kind: "aligned-precreated", Attribute: attribute}
	pods := int(float64(c.nodes*gpusPerNode) * c.fill / float64(k))
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
		r, _, err := runWave(ctx, cs, ns, wave, pods, newPod, c.stall)
		if err != nil {
			return kr, fmt.Errorf("wave %s: %w", wave, err)
		}
		progress("dra %-18s %d GPUs, wave %d: %d/%d bound in %.1fs, %.1f pods/s, p50 %.0f ms, p99 %.0f ms",
			"aligned-precreated", k, w+1, r.Bound, r.Pods, r.Seconds, r.PodsPerSec, r.P50Ms, r.P99Ms)
		kr.Waves = append(kr.Waves, r)
		sel := metav1.ListOptions{LabelSelector: waveLabel + "=" + wave}
		if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, sel); err != nil {
			return kr, err
		}
		if err := cs.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
			return kr, err
		}
		if err := clearWave(ctx, cs, ns, wave); err != nil {
			return kr, err
		}
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
	cmd := exec.Command(c.bins.controller, "--leader-elect=false", "--http-bind-address="+host, "--http-port="+port, "--log-format=json")
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

// settle waits until the controller's write count has not moved for quiet, at most
// limit.
func (p *controllerProc) settle(ctx context.Context, quiet, limit time.Duration) {
	writes := func() float64 {
		sum := 0.0
		for k, v := range p.metrics() {
			if strings.HasPrefix(k, "topodra_controller_writes_total") {
				sum += v
			}
		}
		return sum
	}
	last, since, end := writes(), time.Now(), time.Now().Add(limit)
	for time.Since(since) < quiet && time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(time.Second)
		if w := writes(); w != last {
			last, since = w, time.Now()
		}
	}
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
