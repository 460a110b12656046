// Command nodebench measures the node path of DRA kubelet plugins the way a kubelet
// drives them: each plugin runs as its own process, registers through the kubelet's
// own plugin-manager code (tests/e2e/harness) over its registration socket, publishes
// its ResourceSlices to a real API server (tests/cluster), and is then called over its
// DRA socket (gRPC DRA v1, dialled as the kubelet dials it) to prepare and unprepare
// ResourceClaims that exist in the API server, allocated to its own devices.
//
// Every driver runs in the same process run, against the same API server, with the
// same claims (1, 4 and 8 devices), so the ratios between them are what to read.
// See docs/benchmarks.md "Node path against other drivers".
//
// With -mig-slices it measures instead what topodra and NVIDIA's plugin publish with
// and without dynamic MIG, and prepares nothing (migslices.go).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

const namespace = "nodebench"

// driver is one kubelet plugin under test.
type driver struct {
	Key        string `json:"key"`
	DriverName string `json:"driverName"`
	Binary     string `json:"-"`
	// BinaryName is the base name only: the report gets committed, and the
	// machine's paths mean nothing elsewhere.
	BinaryName string `json:"binary"`
	Version    string `json:"version"`
	// args builds the command line for a node directory; kubeconfig is the
	// identity the plugin uses (the same admin identity for every driver, so no
	// driver pays for an authorizer the other skips).
	args func(dir, node, kubeconfig string) ([]string, []string, error)
}

type sizeResult struct {
	Devices   int     `json:"devices"`
	Prepare   Summary `json:"prepare"`
	Unprepare Summary `json:"unprepare"`
}

type concurrentResult struct {
	Claims    int     `json:"claims"`
	Rounds    int     `json:"rounds"`
	Prepare   Summary `json:"prepare"`
	Unprepare Summary `json:"unprepare"`
	// RoundPrepare is the wall time from the first call of a round to the last
	// answer: how long pods arriving at once wait for the slowest prepare.
	RoundPrepare Summary `json:"roundPrepare"`
}

type driverResult struct {
	Driver driver `json:"driver"`
	// EmptyPrepare is a NodePrepareResources call with no claims: the floor of a
	// round trip to this plugin (socket, gRPC, its server's dispatch).
	EmptyPrepare Summary `json:"emptyPrepare"`
	// StartToRegisteredMs: process start to the kubelet's DRA handler accepting
	// the registration; StartToSlicesMs: to the node's slices all listed by the API.
	StartToRegisteredMs float64 `json:"startToRegisteredMs"`
	StartToSlicesMs     float64 `json:"startToSlicesMs"`
	SliceDevices        int     `json:"sliceDevices"`
	// SliceBytesPerDevice is the JSON size of the published slices' specs per
	// device, as the scale benchmark counts it (tests/scale sliceBytesPerGPU).
	SliceBytesPerDevice float64            `json:"sliceBytesPerDevice"`
	Sizes               []sizeResult       `json:"sizes"`
	Concurrent          concurrentResult   `json:"concurrent"`
	RSSIdleKiB          int64              `json:"rssIdleKiB"`
	RSSPeakLoadKiB      int64              `json:"rssPeakUnderLoadKiB"`
	HWMKiB              int64              `json:"vmHWMKiB"`
	Notes               []string           `json:"notes,omitempty"`
	Extra               map[string]float64 `json:"extra,omitempty"`
	// slices are what the driver published, written to <out>.slices.json.
	slices []resourceapi.ResourceSlice
}

type report struct {
	Date string `json:"date"`
	// Fsync4KiB is a 4 KiB write + fsync in the node directories' filesystem,
	// measured before the drivers run: the unit cost of the checkpoint and CDI
	// writes that make most of a prepare.
	Fsync4KiB   Summary           `json:"fsync4KiB"`
	Machine     map[string]string `json:"machine"`
	Iterations  int               `json:"iterations"`
	Warmup      int               `json:"warmup"`
	Drivers     []driverResult    `json:"drivers"`
	Ratios      map[string]any    `json:"ratios,omitempty"`
	ClusterVers map[string]string `json:"controlPlane"`
	WallSeconds float64           `json:"wallSeconds"`
}

func main() {
	var (
		out        = flag.String("out", "target/bench/nodebench.json", "JSON report (a Markdown table goes next to it, .md)")
		iters      = flag.Int("iters", 200, "measured sequential prepare+unprepare pairs per claim size")
		warmup     = flag.Int("warmup", 20, "unrecorded pairs before each size")
		conc       = flag.Int("concurrent", 8, "one-GPU claims prepared at once in the concurrent run (at most the node's GPUs)")
		rounds     = flag.Int("rounds", 10, "rounds of the concurrent run")
		topodraBin = flag.String("topodra-plugin", "target/release/topodra-kubelet-plugin", "topodra kubelet plugin binary")
		simBin     = flag.String("sim-node", "target/debug/topodra-sim-node", "topodra-sim-node binary")
		profile    = flag.String("profile", "dgx-h100", "simulated node profile for topodra")
		exampleBin = flag.String("example-plugin", "", "dra-example-kubeletplugin binary (tests/nodebench/build-example-driver.sh)")
		exampleVer = flag.String("example-version", "", "its version, for the report")
		nvidiaBin  = flag.String("nvidia-plugin", "", "NVIDIA's gpu-kubelet-plugin binary (tests/nodebench/build-nvidia-driver.sh)")
		cdiHook    = flag.String("nvidia-cdi-hook", "", "nvidia-cdi-hook for NVIDIA's plugin to write into its CDI specs (tests/tools/build.sh nvidia-ctk)")
		only       = flag.String("drivers", "topodra,example,example-unthrottled,nvidia,nvidia-unthrottled", "drivers to run, in order")
		workDir    = flag.String("work-dir", "", "where the cluster and node directories go (default: a new temp dir, removed on success)")
		migSlices  = flag.Bool("mig-slices", false, "instead: the slices topodra and NVIDIA's plugin publish, each with and without its dynamic MIG, on -mig-slices-profiles; no prepares")
		migOut     = flag.String("mig-slices-out", "../../docs/benchmarks/mig-slices.json", "-mig-slices: JSON report (the default is the repository's docs/benchmarks/mig-slices.json from tests/nodebench)")
		migSpecs   = flag.String("mig-slices-specs", "", "-mig-slices: also write the published slice specs, by run, to this file")
		migProfs   = flag.String("mig-slices-profiles", "dgx-h100-mig,dgx-h100", "-mig-slices: simulated node profiles, in order")
		migGPUs    = flag.Int("mig-slices-gpus", 8, "-mig-slices: GPUs of those profiles, the divisor of bytes per GPU")
		migSettle  = flag.Duration("mig-slices-settle", 3*time.Second, "-mig-slices: how long a complete pool must stay unchanged to be the plugin's")
	)
	klog.InitFlags(nil)
	_ = flag.Set("v", "0")
	// The kubelet code logs a cancelled WatchResources stream as an error when a
	// plugin stops: expected here, and kept in harness.log with the rest.
	_ = flag.Set("stderrthreshold", "FATAL")
	flag.Parse()
	bins := binaries{topodra: *topodraBin, sim: *simBin, profile: *profile, example: *exampleBin, exampleVer: *exampleVer, nvidia: *nvidiaBin, cdiHook: *cdiHook}
	if *migSlices {
		o := migSlicesOptions{out: *migOut, specsOut: *migSpecs, profiles: strings.Fields(strings.ReplaceAll(*migProfs, ",", " ")),
			gpus: *migGPUs, settle: *migSettle, workDir: *workDir}
		if err := runMigSlices(bins, o); err != nil {
			fmt.Fprintln(os.Stderr, "nodebench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*out, *iters, *warmup, *conc, *rounds, bins, *only, *workDir); err != nil {
		fmt.Fprintln(os.Stderr, "nodebench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[nodebench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// binaries are the plugins under test and what they need to run.
type binaries struct {
	topodra, sim, profile string
	example, exampleVer   string
	nvidia, cdiHook       string
}

// startControlPlane starts etcd and kube-apiserver under workDir (nothing here
// needs a scheduler or the controller manager) and an admin client; the caller
// stops it.
func startControlPlane(ctx context.Context, workDir string) (*cluster.Cluster, kubernetes.Interface, error) {
	logf("control plane in %s (etcd + kube-apiserver only: nothing here needs a scheduler)", workDir)
	c, err := cluster.Start(ctx, cluster.Options{
		Dir: filepath.Join(workDir, "cluster"), NoControllerManager: true, NoScheduler: true,
		Logf: func(f string, a ...any) { logf(f, a...) },
	})
	if err != nil {
		return nil, nil, err
	}
	admin, err := c.Client()
	if err != nil {
		_ = c.Stop()
		return nil, nil, err
	}
	return c, admin, nil
}

func run(out string, iters, warmup, conc, rounds int, bins binaries, only, workDir string) error {
	began := time.Now()
	ctx, stop := signalContext()
	defer stop()
	workDir, keep, err := makeWorkDir(workDir, "nodebench-")
	if err != nil {
		return err
	}
	klogFile, err := logKlogTo(workDir)
	if err != nil {
		return err
	}
	defer klogFile.Close()

	var drivers []driver
	for _, k := range strings.Split(only, ",") {
		switch strings.TrimSpace(k) {
		case "topodra":
			drivers = append(drivers, topodraDriver(bins.topodra, bins.sim, bins.profile))
		case "example", "example-unthrottled":
			if bins.example == "" {
				return errors.New("--example-plugin is required for the example driver")
			}
			drivers = append(drivers, exampleDriver(bins.example, bins.exampleVer, strings.TrimSpace(k)))
		case "nvidia", "nvidia-unthrottled":
			if bins.nvidia == "" || bins.cdiHook == "" {
				return errors.New("--nvidia-plugin and --nvidia-cdi-hook are required for NVIDIA's driver")
			}
			drivers = append(drivers, nvidiaDriver(bins.nvidia, bins.sim, bins.profile, bins.cdiHook, strings.TrimSpace(k)))
		case "":
		default:
			return fmt.Errorf("unknown driver %q", k)
		}
	}

	c, admin, err := startControlPlane(ctx, workDir)
	if err != nil {
		return err
	}
	defer func() { _ = c.Stop() }()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}

	rep := report{
		Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Iterations: iters, Warmup: warmup,
		ClusterVers: c.Versions,
	}
	if rep.Fsync4KiB, err = fsyncProbe(workDir, 200); err != nil {
		return err
	}
	logf("4 KiB write+fsync in %s: p50 %.0f µs, p99 %.0f µs", workDir, rep.Fsync4KiB.P50, rep.Fsync4KiB.P99)
	for _, d := range drivers {
		logf("== %s (%s)", d.Key, d.DriverName)
		d.BinaryName = filepath.Base(d.Binary)
		res, err := benchDriver(ctx, c, admin, d, filepath.Join(workDir, d.Key), iters, warmup, conc, rounds)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Key, err)
		}
		rep.Drivers = append(rep.Drivers, *res)
	}
	rep.Ratios = ratios(rep.Drivers)
	rep.WallSeconds = time.Since(began).Seconds()

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	// The published slices' specs, by driver: what the size figures count, and
	// real slices of the other drivers for anyone to compare attribute sets.
	specs := map[string][]resourceapi.ResourceSliceSpec{}
	for _, d := range rep.Drivers {
		for _, sl := range d.slices {
			specs[d.Driver.Key] = append(specs[d.Driver.Key], sl.Spec)
		}
	}
	if b, err = json.MarshalIndent(specs, "", "  "); err != nil {
		return fmt.Errorf("encoding the slices: %w", err)
	}
	if err := os.WriteFile(strings.TrimSuffix(out, ".json")+".slices.json", append(b, '\n'), 0o644); err != nil {
		return err
	}
	md := markdown(&rep)
	if err := os.WriteFile(strings.TrimSuffix(out, ".json")+".md", []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	logf("wrote %s (%.0f s)", out, rep.WallSeconds)
	if !keep {
		_ = c.Stop()
		_ = os.RemoveAll(workDir)
	}
	return nil
}

// signalContext is cancelled on SIGINT/SIGTERM: the calls fail, the run returns
// and its defers stop the plugins and the control plane.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// makeWorkDir is dir, made, or a new temporary directory when dir is empty; keep
// says whether to leave it after a successful run (it was asked for).
func makeWorkDir(dir, pattern string) (string, bool, error) {
	keep := dir != ""
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", pattern); err != nil {
			return "", false, err
		}
	}
	return dir, keep, os.MkdirAll(dir, 0o755)
}

// logKlogTo sends klog to dir/harness.log: the harness's kubelet code logs each
// registration and prepare at info, which stays out of the measurement's terminal.
func logKlogTo(dir string) (*os.File, error) {
	f, err := os.Create(filepath.Join(dir, "harness.log"))
	if err != nil {
		return nil, err
	}
	klog.SetOutput(f)
	klog.LogToStderr(false)
	return f, nil
}

func topodraDriver(bin, simBin, profile string) driver {
	return driver{
		Key: "topodra", DriverName: "gpu.topodra.dev", Binary: bin, Version: version(bin, "--version"),
		args: func(dir, node, kubeconfig string) ([]string, []string, error) {
			// The simulated node: fake NVML with the profile's GPUs, its hwloc
			// topology, device nodes and driver root, as `make demo` sets it up.
			simFlags, err := simNode(simBin, profile, dir)
			if err != nil {
				return nil, nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte("6d7a3c8e-0b1f-4c59-9e0a-2f4b1d3c5a77\n"), 0o644); err != nil {
				return nil, nil, err
			}
			addr, err := freeAddr()
			if err != nil {
				return nil, nil, err
			}
			args := []string{"serve",
				"--node-name=" + node,
				"--kubelet-registry-dir=" + filepath.Join(dir, "plugins_registry"),
				"--kubelet-plugins-dir=" + filepath.Join(dir, "plugins"),
				"--cdi-dir=" + filepath.Join(dir, "cdi"),
				"--http-addr=" + addr,
				"--boot-id-file=" + filepath.Join(dir, "boot_id"),
			}
			args = append(args, simFlags...)
			return args, []string{"KUBECONFIG=" + kubeconfig, "TOPODRA_LOG=info"}, nil
		},
	}
}

// exampleDriver is the reference driver. "example" runs it as released (its kube
// client's defaults, 5 QPS with a burst of 10, which its Helm chart keeps: each
// prepare GETs the claim, so sustained prepares queue behind that limiter);
// "example-unthrottled" lifts the limit, so what is measured is the plugin's own
// work, as for topodra, whose claim reads have no client-side limiter.
func exampleDriver(bin, ver, key string) driver {
	return driver{
		Key: key, DriverName: "gpu.example.com", Binary: bin, Version: ver,
		args: func(dir, node, kubeconfig string) ([]string, []string, error) {
			// Its gpu profile simulates the GPUs itself; 8 of them, like the DGX H100
			// topodra runs on. Health and metrics endpoints stay off (their defaults).
			args := append(goPluginFlags(key, dir, node, kubeconfig), "--num-devices=8", "--device-profile=gpu")
			return args, nil, nil
		},
	}
}

// nvidiaDriver is NVIDIA's own GPU kubelet plugin on the same simulated node as
// topodra: the sim node's driver root holds the fake NVML (with the profile beside
// it) as libnvidia-ml.so.1 and an nvidia-smi, which is what the plugin looks up in
// its driver root, and here also the device nodes (the plugin's CDI specs name
// <driver-root>/dev/nvidia* when the root has a dev/). "nvidia" keeps its kube
// client's defaults (5 QPS, burst 10; its Helm chart sets neither flag);
// "nvidia-unthrottled" lifts them, as for the example driver. Feature gates stay
// at their defaults (-mig-slices adds DynamicMIG in runs of its own).
func nvidiaDriver(bin, simBin, profile, cdiHook, key string) driver {
	return driver{
		Key: key, DriverName: "gpu.nvidia.com", Binary: bin, Version: version(bin, "--version"),
		args: func(dir, node, kubeconfig string) ([]string, []string, error) {
			simFlags, err := simNode(simBin, profile, dir, "--driver-root-device-nodes")
			if err != nil {
				return nil, nil, err
			}
			driverRoot := ""
			for _, f := range simFlags {
				if v, ok := strings.CutPrefix(f, "--driver-root="); ok {
					driverRoot = v
				}
			}
			if driverRoot == "" {
				return nil, nil, fmt.Errorf("%s printed no --driver-root: %q", simBin, simFlags)
			}
			args := append(goPluginFlags(key, dir, node, kubeconfig),
				"--namespace="+namespace,
				"--nvidia-driver-root="+driverRoot,
				// The plugin runs on the host here, not in a container that
				// mounts the driver root elsewhere: both roots are the same path.
				"--container-driver-root="+driverRoot,
				"--nvidia-cdi-hook-path="+cdiHook,
				// Required; only used to render MPS daemon templates, which
				// stay off.
				"--image-name=nodebench.invalid/unused",
			)
			return args, nil, nil
		},
	}
}

// goPluginFlags are the flags both Go drivers take, named as the kubelet plugin
// helper of k8s.io/dynamic-resource-allocation has them: node, kubeconfig, CDI root
// and the kubelet's directories; the "-unthrottled" keys add a client limit that
// never binds.
func goPluginFlags(key, dir, node, kubeconfig string) []string {
	args := []string{
		"--node-name=" + node,
		"--kubeconfig=" + kubeconfig,
		"--cdi-root=" + filepath.Join(dir, "cdi"),
		"--kubelet-registrar-directory-path=" + filepath.Join(dir, "plugins_registry"),
		"--kubelet-plugins-directory-path=" + filepath.Join(dir, "plugins"),
	}
	if strings.HasSuffix(key, "-unthrottled") {
		args = append(args, "--kube-api-qps=10000", "--kube-api-burst=10000")
	}
	return args
}

// simNode lays out the simulated node under dir/sim with topodra-sim-node and
// returns the flags it prints (topodra's plugin flags for that node).
func simNode(simBin, profile, dir string, extra ...string) ([]string, error) {
	args := append(append([]string{}, extra...), profile, filepath.Join(dir, "sim"))
	out, err := exec.Command(simBin, args...).Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", simBin, strings.Join(args, " "), err)
	}
	return strings.Fields(string(out)), nil
}

func version(bin string, arg string) string {
	b, err := exec.Command(bin, arg).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// plugin is a driver's kubelet plugin running on a simulated node of its own, with
// the kubelet's plugin-manager code (tests/e2e/harness) as its peer.
type plugin struct {
	h   *harness.Harness
	cmd *exec.Cmd
	// exited gets the process's exit once, for the one waiting on it; done is
	// closed then, for stop, which must not hang when exited was already read.
	exited  chan error
	done    chan struct{}
	logFile *os.File
	logPath string
	started time.Time
}

// startPlugin starts the kubelet side for node, then d's plugin with its log in
// dir/plugin.log. stop ends both.
func startPlugin(ctx context.Context, c *cluster.Cluster, d driver, dir, node string) (*plugin, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	nodeKC, err := c.NodeKubeconfig(node)
	if err != nil {
		return nil, err
	}
	// The kubelet side first: the plugins look their Node up (slice owner).
	h, err := harness.New(harness.Config{
		Kubeconfig: nodeKC, NodeName: node,
		RegistryDir: filepath.Join(dir, "plugins_registry"), CDIDir: filepath.Join(dir, "cdi"),
		StateDir: filepath.Join(dir, "kubelet"), FeatureGates: c.Gates,
	})
	if err != nil {
		return nil, err
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	p := &plugin{h: h, logPath: filepath.Join(dir, "plugin.log")}
	if err := p.start(c, d, dir, node); err != nil {
		h.Stop()
		if p.logFile != nil {
			p.logFile.Close()
		}
		return nil, err
	}
	return p, nil
}

func (p *plugin) start(c *cluster.Cluster, d driver, dir, node string) error {
	if err := os.MkdirAll(filepath.Join(dir, "plugins"), 0o755); err != nil {
		return err
	}
	args, env, err := d.args(dir, node, c.Kubeconfig)
	if err != nil {
		return err
	}
	if p.logFile, err = os.Create(p.logPath); err != nil {
		return err
	}
	p.cmd = exec.Command(d.Binary, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logFile, p.logFile
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return err
	}
	p.exited, p.done = make(chan error, 1), make(chan struct{})
	go func() {
		err := p.cmd.Wait()
		close(p.done)
		p.exited <- err
	}()
	return nil
}

// stop ends the plugin (SIGTERM, then SIGKILL after 20 s) and the kubelet side.
func (p *plugin) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.logFile.Close()
	p.h.Stop()
}

// fail adds the end of the plugin's log to err: what the plugin said is most of
// what there is to know about a failure.
func (p *plugin) fail(err error) error {
	return fmt.Errorf("%w (plugin log %s:\n%s)", err, p.logPath, tail(p.logPath, 20))
}

func benchDriver(ctx context.Context, c *cluster.Cluster, admin kubernetes.Interface, d driver, dir string, iters, warmup, conc, rounds int) (*driverResult, error) {
	node := "nodebench-" + d.Key
	p, err := startPlugin(ctx, c, d, dir, node)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	h, t0, exited, pid := p.h, p.started, p.exited, p.cmd.Process.Pid
	fail := func(err error) (*driverResult, error) { return nil, p.fail(err) }

	res := &driverResult{Driver: d}
	regCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	var endpoint string
	regDone := make(chan error, 1)
	go func() {
		var err error
		endpoint, err = h.WaitRegistered(regCtx, d.DriverName)
		res.StartToRegisteredMs = ms(time.Since(t0))
		regDone <- err
	}()
	pool, slices, sliceAt, err := waitSlices(regCtx, admin, node, d.DriverName, exited)
	res.StartToSlicesMs = ms(sliceAt.Sub(t0))
	if err != nil {
		cancel()
		return fail(err)
	}
	if err := <-regDone; err != nil {
		cancel()
		return fail(err)
	}
	cancel()
	devices := deviceNames(slices)
	res.SliceDevices = len(devices)
	res.SliceBytesPerDevice = specBytesPerDevice(slices)
	res.slices = slices
	logf("%s: registered after %.0f ms, %d devices in slices after %.0f ms; endpoint %s",
		d.Key, res.StartToRegisteredMs, len(devices), res.StartToSlicesMs, endpoint)
	if len(devices) < 8 {
		return fail(fmt.Errorf("want 8 devices in the slices of pool %s, got %v", pool, devices))
	}

	// Idle: registered, slices published, nothing prepared; a moment for the
	// start-up garbage (Go GC, allocator) to settle.
	time.Sleep(3 * time.Second)
	if res.RSSIdleKiB, err = procStatusKiB(pid, "VmRSS"); err != nil {
		return fail(err)
	}

	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	client := drapb.NewDRAPluginClient(conn)

	peak := newRSSSampler(pid)
	defer peak.stop()

	var empty []time.Duration
	for i := 0; i < warmup+iters; i++ {
		t := time.Now()
		if _, err := client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
			return fail(fmt.Errorf("empty prepare: %w", err))
		}
		if i >= warmup {
			empty = append(empty, time.Since(t))
		}
	}
	res.EmptyPrepare = summarize(empty)

	seq := 0
	for _, n := range []int{1, 4, 8} {
		claims, err := makeClaims(ctx, admin, d, node, pool, devices[:n], warmup+iters, &seq)
		if err != nil {
			return fail(err)
		}
		var prep, unprep []time.Duration
		for i, cl := range claims {
			p, u, err := prepareUnprepare(ctx, client, cl, n)
			if err != nil {
				return fail(fmt.Errorf("%d-device claim %s: %w", n, cl.Name, err))
			}
			if i >= warmup {
				prep, unprep = append(prep, p), append(unprep, u)
			}
		}
		sr := sizeResult{Devices: n, Prepare: summarize(prep), Unprepare: summarize(unprep)}
		res.Sizes = append(res.Sizes, sr)
		logf("%s: %d devices: prepare p50 %.0f µs p99 %.0f µs; unprepare p50 %.0f µs p99 %.0f µs",
			d.Key, n, sr.Prepare.P50, sr.Prepare.P99, sr.Unprepare.P50, sr.Unprepare.P99)
		deleteClaims(ctx, admin, claims)
	}

	// Concurrent: conc one-device claims at once, as when that many pods land on
	// the node together. Each claim gets a GPU of its own: topodra refuses a
	// device another prepared claim holds (device_in_use), as it must for
	// exclusive GPUs, so on an 8-GPU node at most 8 such claims can be prepared
	// at once.
	if conc > len(devices) {
		return fail(fmt.Errorf("%d concurrent one-GPU claims need %d devices; the node has %d", conc, conc, len(devices)))
	}
	cr := concurrentResult{Claims: conc, Rounds: rounds}
	var cp, cu, cw []time.Duration
	for r := 0; r < rounds+1; r++ {
		claims := make([]*resourceapi.ResourceClaim, conc)
		for i := range claims {
			cs, err := makeClaims(ctx, admin, d, node, pool, []string{devices[i]}, 1, &seq)
			if err != nil {
				return fail(err)
			}
			claims[i] = cs[0]
		}
		p, u, wall, err := concurrentRound(ctx, client, claims)
		if err != nil {
			return fail(fmt.Errorf("concurrent round %d: %w", r, err))
		}
		if r > 0 { // round 0 warms up the connection's streams and the plugin's pools
			cp, cu, cw = append(cp, p...), append(cu, u...), append(cw, wall)
		}
		deleteClaims(ctx, admin, claims)
	}
	cr.Prepare, cr.Unprepare, cr.RoundPrepare = summarize(cp), summarize(cu), summarize(cw)
	res.Concurrent = cr
	logf("%s: %d concurrent: prepare p50 %.0f µs p99 %.0f µs; round p50 %.0f µs",
		d.Key, conc, cr.Prepare.P50, cr.Prepare.P99, cr.RoundPrepare.P50)

	res.RSSPeakLoadKiB = peak.stop()
	res.HWMKiB, _ = procStatusKiB(pid, "VmHWM")
	select {
	case err := <-exited:
		return fail(fmt.Errorf("plugin exited during the run: %v", err))
	default:
	}
	return res, nil
}

// fsyncProbe times n writes of 4 KiB, each followed by fsync, to one file in dir.
func fsyncProbe(dir string, n int) (Summary, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return Summary{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := bytes.Repeat([]byte{'x'}, 4096)
	var d []time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		if _, err := f.WriteAt(buf, 0); err != nil {
			return Summary{}, err
		}
		if err := f.Sync(); err != nil {
			return Summary{}, err
		}
		d = append(d, time.Since(t))
	}
	return summarize(d), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// waitSlices polls the API for the node's slices of driver until the pool is
// complete (all resourceSliceCount slices of its newest generation listed) and
// has devices. Polling every 10 ms bounds the error of the timestamp.
func waitSlices(ctx context.Context, admin kubernetes.Interface, node, driverName string, exited <-chan error) (string, []resourceapi.ResourceSlice, time.Time, error) {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermEqualSelector("spec.driver", driverName)).String()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		list, err := admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		now := time.Now()
		if err == nil {
			if pool, current, ok := completePool(list.Items); ok && len(deviceNames(current)) > 0 {
				return pool, current, now, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", nil, time.Now(), fmt.Errorf("slices of %s on %s: %w", driverName, node, ctx.Err())
		case err := <-exited:
			return "", nil, time.Now(), fmt.Errorf("plugin exited before publishing: %v", err)
		case <-tick.C:
		}
	}
}

// completePool is the newest generation of the pool the slices (of one node and
// driver) make, when all its resourceSliceCount slices are among them.
func completePool(items []resourceapi.ResourceSlice) (string, []resourceapi.ResourceSlice, bool) {
	if len(items) == 0 {
		return "", nil, false
	}
	var gen int64
	for _, s := range items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var current []resourceapi.ResourceSlice
	want, pool := int64(0), ""
	for _, s := range items {
		if s.Spec.Pool.Generation != gen {
			continue
		}
		current = append(current, s)
		want, pool = s.Spec.Pool.ResourceSliceCount, s.Spec.Pool.Name
	}
	return pool, current, int64(len(current)) == want
}

// deviceNames are the slices' devices in natural order.
func deviceNames(slices []resourceapi.ResourceSlice) []string {
	var devs []string
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			devs = append(devs, d.Name)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return natLess(devs[i], devs[j]) })
	return devs
}

// specBytesPerDevice is the JSON size of the slices' specs per device.
func specBytesPerDevice(slices []resourceapi.ResourceSlice) float64 {
	var devices int
	for _, s := range slices {
		devices += len(s.Spec.Devices)
	}
	if devices == 0 {
		return 0
	}
	return float64(specBytes(slices)) / float64(devices)
}

// specBytes is the JSON size of the slices' specs: what a driver publishes, less
// the object metadata the API server adds.
func specBytes(slices []resourceapi.ResourceSlice) int {
	var n int
	for _, s := range slices {
		b, _ := json.Marshal(s.Spec)
		n += len(b)
	}
	return n
}

// natLess orders gpu-2 before gpu-10, so "the first n devices" is the same set
// for every driver's naming.
func natLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// makeClaims creates n ResourceClaims for the devices and writes their allocation
// with the admin client, as the scheduler would.
func makeClaims(ctx context.Context, admin kubernetes.Interface, d driver, node, pool string, devices []string, n int, seq *int) ([]*resourceapi.ResourceClaim, error) {
	rc := admin.ResourceV1().ResourceClaims(namespace)
	out := make([]*resourceapi.ResourceClaim, 0, n)
	for i := 0; i < n; i++ {
		*seq++
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", d.Key, *seq)},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpus",
				Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: d.DriverName,
					AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(devices))},
			}}}},
		}
		created, err := rc.Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		var results []resourceapi.DeviceRequestAllocationResult
		for _, dev := range devices {
			results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: d.DriverName, Pool: pool, Device: dev})
		}
		created.Status.Allocation = &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
			NodeSelector: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}},
		}
		created.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{
			Resource: "pods", Name: created.Name, UID: created.UID}}
		updated, err := rc.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, updated)
	}
	return out, nil
}

func deleteClaims(ctx context.Context, admin kubernetes.Interface, claims []*resourceapi.ResourceClaim) {
	for _, cl := range claims {
		_ = admin.ResourceV1().ResourceClaims(namespace).Delete(ctx, cl.Name, metav1.DeleteOptions{})
	}
}

func claimRef(cl *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: cl.Namespace, Name: cl.Name, Uid: string(cl.UID)}
}

func prepare(ctx context.Context, client drapb.DRAPluginClient, cl *resourceapi.ResourceClaim, want int) (time.Duration, error) {
	// The kubelet's own limit on a prepare call.
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	t := time.Now()
	resp, err := client.NodePrepareResources(cctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(cl)}})
	d := time.Since(t)
	if err != nil {
		return d, err
	}
	r := resp.Claims[string(cl.UID)]
	switch {
	case r == nil:
		return d, errors.New("prepare: no result for the claim")
	case r.Error != "":
		return d, fmt.Errorf("prepare: %s", r.Error)
	case len(r.Devices) != want:
		return d, fmt.Errorf("prepare: %d devices, want %d", len(r.Devices), want)
	}
	return d, nil
}

func unprepare(ctx context.Context, client drapb.DRAPluginClient, cl *resourceapi.ResourceClaim) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	t := time.Now()
	resp, err := client.NodeUnprepareResources(cctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claimRef(cl)}})
	d := time.Since(t)
	if err != nil {
		return d, err
	}
	if r := resp.Claims[string(cl.UID)]; r == nil || r.Error != "" {
		return d, fmt.Errorf("unprepare: %v", r)
	}
	return d, nil
}

func prepareUnprepare(ctx context.Context, client drapb.DRAPluginClient, cl *resourceapi.ResourceClaim, want int) (time.Duration, time.Duration, error) {
	p, err := prepare(ctx, client, cl, want)
	if err != nil {
		return 0, 0, err
	}
	u, err := unprepare(ctx, client, cl)
	return p, u, err
}

func concurrentRound(ctx context.Context, client drapb.DRAPluginClient, claims []*resourceapi.ResourceClaim) ([]time.Duration, []time.Duration, time.Duration, error) {
	n := len(claims)
	prep, unprep, errs := make([]time.Duration, n), make([]time.Duration, n), make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			prep[i], errs[i] = prepare(ctx, client, claims[i], 1)
		}()
	}
	t := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t)
	if err := errors.Join(errs...); err != nil {
		return nil, nil, 0, err
	}
	start = make(chan struct{})
	for i := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			unprep[i], errs[i] = unprepare(ctx, client, claims[i])
		}()
	}
	close(start)
	wg.Wait()
	return prep, unprep, wall, errors.Join(errs...)
}

// rssSampler records the largest VmRSS seen while the load runs. VmHWM alone would
// also count the start-up peak (a Go client's first LIST decode, say), which is
// not "under load".
type rssSampler struct {
	mu   sync.Mutex
	peak int64
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func newRSSSampler(pid int) *rssSampler {
	s := &rssSampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, err := procStatusKiB(pid, "VmRSS"); err == nil {
				s.mu.Lock()
				s.peak = max(s.peak, v)
				s.mu.Unlock()
			}
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) stop() int64 {
	s.once.Do(func() { close(s.done) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func machine() map[string]string {
	m := map[string]string{
		"goos": runtime.GOOS, "goarch": runtime.GOARCH, "go": runtime.Version(),
		"cpus": fmt.Sprint(runtime.NumCPU()),
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(os.TempDir(), &st); err == nil {
		m["tmpFsType"] = fmt.Sprintf("0x%x", st.Type)
	}
	return m
}

// ratios are topodra over each other driver, the way the issue states its targets
// (prepare p50 at most 0.5, RSS at most 0.25).
func ratios(rs []driverResult) map[string]any {
	var t *driverResult
	for i := range rs {
		if rs[i].Driver.Key == "topodra" {
			t = &rs[i]
		}
	}
	if t == nil {
		return nil
	}
	all := map[string]any{}
	for i := range rs {
		e := &rs[i]
		if e == t {
			continue
		}
		out := map[string]float64{}
		for j := range t.Sizes {
			if j >= len(e.Sizes) {
				break
			}
			n := t.Sizes[j].Devices
			out[fmt.Sprintf("prepare_p50_%dgpu", n)] = ratio(t.Sizes[j].Prepare.P50, e.Sizes[j].Prepare.P50)
			out[fmt.Sprintf("prepare_p99_%dgpu", n)] = ratio(t.Sizes[j].Prepare.P99, e.Sizes[j].Prepare.P99)
			out[fmt.Sprintf("unprepare_p50_%dgpu", n)] = ratio(t.Sizes[j].Unprepare.P50, e.Sizes[j].Unprepare.P50)
			out[fmt.Sprintf("unprepare_p99_%dgpu", n)] = ratio(t.Sizes[j].Unprepare.P99, e.Sizes[j].Unprepare.P99)
		}
		out["concurrent_prepare_p50"] = ratio(t.Concurrent.Prepare.P50, e.Concurrent.Prepare.P50)
		out["concurrent_prepare_p99"] = ratio(t.Concurrent.Prepare.P99, e.Concurrent.Prepare.P99)
		out["concurrent_round_p50"] = ratio(t.Concurrent.RoundPrepare.P50, e.Concurrent.RoundPrepare.P50)
		out["empty_prepare_p50"] = ratio(t.EmptyPrepare.P50, e.EmptyPrepare.P50)
		out["rss_idle"] = ratio(float64(t.RSSIdleKiB), float64(e.RSSIdleKiB))
		out["rss_peak_under_load"] = ratio(float64(t.RSSPeakLoadKiB), float64(e.RSSPeakLoadKiB))
		out["start_to_slices"] = ratio(t.StartToSlicesMs, e.StartToSlicesMs)
		out["slice_bytes_per_device"] = ratio(t.SliceBytesPerDevice, e.SliceBytesPerDevice)
		// A ratio over nothing (no concurrent rounds asked for) has no JSON form.
		for k, v := range out {
			if math.IsNaN(v) {
				delete(out, k)
			}
		}
		all[e.Driver.Key] = out
	}
	return all
}

func markdown(r *report) string {
	var b bytes.Buffer
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	w("| driver | series | n | p50 µs | p90 µs | p99 µs | max µs |\n|---|---|--:|--:|--:|--:|--:|\n")
	row(&b, "(machine)", "4 KiB write + fsync", r.Fsync4KiB)
	for _, d := range r.Drivers {
		row(&b, d.Driver.Key, "empty NodePrepare (ref)", d.EmptyPrepare)
		for _, s := range d.Sizes {
			row(&b, d.Driver.Key, fmt.Sprintf("prepare %d GPU", s.Devices), s.Prepare)
			row(&b, d.Driver.Key, fmt.Sprintf("unprepare %d GPU", s.Devices), s.Unprepare)
		}
		c := d.Concurrent
		row(&b, d.Driver.Key, fmt.Sprintf("prepare, %d concurrent", c.Claims), c.Prepare)
		row(&b, d.Driver.Key, fmt.Sprintf("unprepare, %d concurrent", c.Claims), c.Unprepare)
		row(&b, d.Driver.Key, fmt.Sprintf("all %d prepared (wall)", c.Claims), c.RoundPrepare)
	}
	w("\n| driver | start → registered ms | start → slices ms | devices | slice bytes / device | RSS idle MiB | RSS peak under load MiB | VmHWM MiB |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, d := range r.Drivers {
		w("| %s | %.0f | %.0f | %d | %.0f | %.1f | %.1f | %.1f |\n", d.Driver.Key, d.StartToRegisteredMs, d.StartToSlicesMs, d.SliceDevices,
			d.SliceBytesPerDevice, mib(d.RSSIdleKiB), mib(d.RSSPeakLoadKiB), mib(d.HWMKiB))
	}
	if len(r.Ratios) > 0 {
		var refs []string
		for _, d := range r.Drivers {
			if _, ok := r.Ratios[d.Driver.Key]; ok {
				refs = append(refs, d.Driver.Key)
			}
		}
		seen := map[string]bool{}
		var keys []string
		for _, ref := range refs {
			for k := range r.Ratios[ref].(map[string]float64) {
				if !seen[k] {
					seen[k] = true
					keys = append(keys, k)
				}
			}
		}
		sort.Strings(keys)
		w("\n| topodra / | %s |\n|---|%s\n", strings.Join(refs, " | "), strings.Repeat("--:|", len(refs)))
		for _, k := range keys {
			w("| %s |", k)
			for _, ref := range refs {
				if v, ok := r.Ratios[ref].(map[string]float64)[k]; ok {
					w(" %.2f |", v)
				} else {
					w(" – |")
				}
			}
			w("\n")
		}
	}
	return b.String()
}

func row(w io.Writer, drv, series string, s Summary) {
	fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.0f | %.0f | %.0f |\n", drv, series, s.N, s.P50, s.P90, s.P99, s.Max)
}

func mib(kib int64) float64 { return float64(kib) / 1024 }
