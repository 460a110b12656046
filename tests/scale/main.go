// topodra-scale runs the talk's experiment on this machine: N kwok nodes of the
// DGX H100 layout, waves of pods asking for 1, 2, 4 and 8 GPUs, scheduled once by
// the DRA stack (topodra's ResourceSlices, the stock kube-scheduler, topodra's
// controller) and once by the legacy stack (nvidia.com/gpu capacity,
// NodeResourceTopology objects kept by a simulated topology updater, the
// topology-aware scheduler of scheduler-plugins), each on its own control plane
// started for it, one after the other. It prints progress, writes results.json and
// report.md, and stops every process it started.
//
//	go run . -nodes 100 -out ../../target/bench-scale
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	nodes      int
	waves      int
	fill       float64
	sizes      []int
	out        string
	idle       time.Duration
	stall      time.Duration
	variants   bool
	legacy     bool
	updaterInt time.Duration
	// updaterNotify also writes a node's object when a pod is admitted there,
	// as NFD's updater does watching the kubelet's state directory.
	updaterNotify bool
	// updaterOnDelete also writes a node's object when a pod leaves it, which
	// NFD's updater does not (it waits for the interval or the next admission).
	updaterOnDelete bool
	// waveGap is a pause after each common wave's teardown, on both stacks: with
	// one longer than the updater's interval no wave starts on stale objects.
	waveGap       time.Duration
	plugins       int
	nodePath      int  // nodes with a real plugin and the kubelet stand-in (nodepath.go)
	attributeSets bool // the attribute-set waves (attrsets.go)
	// attributeQuiet is how long each attribute set's slices sit with nothing
	// asked of the stack before its waves, for the heap floor (0: none).
	attributeQuiet time.Duration
	gogc           int
	goaway         float64
	// kwokLease is the fake nodes' Lease duration; kwok renews a Lease every
	// quarter of it, as the kubelet does.
	kwokLease time.Duration
	bins      bins
	repo      string
	// steadyRate is the arrival rate of the steady waves, pods a second (0:
	// none); churn the length of the mixed-size workload with churn (0: none),
	// churnRate its arrival rate.
	steadyRate float64
	churn      time.Duration
	churnRate  float64
	// listForm turns the alpha DRAListTypeAttributes gate on in both stacks
	// and adds the list-form numaNode waves: a run of its own.
	listForm bool
	// runs is how many times each stack runs, alternated DRA, legacy, DRA, ...;
	// draOnly is set for the first DRA run only (its DRA-only waves, plugins and
	// idle period), and for none when draOnlyWaves is off.
	runs         int
	draOnly      bool
	draOnlyWaves bool
	// keep leaves the control planes' directories in place after a run.
	keep bool
	// rerender is a directory whose results.json is written out as report.md
	// again, with nothing run.
	rerender string
	// controllerArgs are more flags for topodra-controller, e.g.
	// --node-resource-topology=false.
	controllerArgs []string
	// nvidiaSlices is a make bench-node slices file whose "nvidia-unthrottled"
	// entry (NVIDIA's plugin's own published slice) is replicated over the fleet
	// for the peer waves; "" skips them.
	nvidiaSlices string
}

type bins struct {
	plugin, simNode, controller, topoSched string
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[scale %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func main() {
	var c config
	var sizes, controllerArgs string
	flag.IntVar(&c.nodes, "nodes", 100, "kwok nodes of the DGX H100 layout (8 GPUs, 2 NUMA nodes)")
	flag.IntVar(&c.waves, "waves", 3, "waves per claim size and kind; figures are medians over them")
	flag.Float64Var(&c.fill, "fill", 0.5, "share of the fleet's GPUs one wave asks for")
	flag.StringVar(&sizes, "sizes", "1,2,4,8", "GPUs per pod")
	flag.StringVar(&c.out, "out", "target/bench-scale", "directory for results.json and report.md")
	flag.DurationVar(&c.idle, "idle", 2*time.Minute, "idle period in which topodra's requests are counted")
	flag.DurationVar(&c.stall, "stall", 30*time.Second, "a wave gives up when no pod was bound for this long")
	flag.BoolVar(&c.variants, "variants", true, "also run shuffled device order (and with -list-form the list-form numaNode) in aligned waves, on the DRA stack")
	flag.BoolVar(&c.listForm, "list-form", false, "turn the alpha DRAListTypeAttributes gate on in both stacks and add list-form numaNode waves (a run of its own: the gate switches kube-scheduler's allocator)")
	flag.Float64Var(&c.steadyRate, "steady-rate", 20, "pods a second of the steady waves, below both stacks' capacity, for latency (0: none)")
	flag.DurationVar(&c.churn, "churn", 60*time.Second, "length of the mixed-size workload with churn on both stacks (0: none)")
	flag.Float64Var(&c.churnRate, "churn-rate", 10, "arrival rate of the churn workload, pods a second")
	flag.IntVar(&c.runs, "runs", 1, "runs of each stack, alternated DRA, legacy, DRA, legacy, ...; runs after the first repeat the common workload only")
	flag.StringVar(&c.rerender, "rerender", "", "write DIR/report.md again from DIR/results.json, running nothing (after a change of the report's code)")
	flag.BoolVar(&c.keep, "keep", false, "keep every control plane's directory (etcd data, audit log, logs; hundreds of MB a stack); a failed run's are always kept")
	flag.BoolVar(&c.draOnlyWaves, "dra-only", true, "after the common workload of the first DRA run, what only DRA runs: 8-GPU and unconstrained waves, claims made beforehand, the variants, the peer waves, the plugins and the idle period (false: the common workload only)")
	flag.BoolVar(&c.attributeSets, "attribute-sets", false, "in what only DRA runs, the attribute-set waves: the fleet published with topodra's lean set, its full set, NVIDIA's set and the lean set again, "+
		"unconstrained and aligned waves of the common sizes on each under the one kube-scheduler (a run of its own: -sizes 1,4 -waves 1 keeps it short)")
	flag.DurationVar(&c.attributeQuiet, "attribute-set-quiet", 150*time.Second, "with -attribute-sets, how long each set's slices sit with nothing asked of the stack before its waves; "+
		"the lowest Go heap in use over that window is the set's heap floor (over two minutes: Go collects at least every two minutes; 0: none)")
	flag.BoolVar(&c.legacy, "legacy", true, "run the legacy stack too (skipped, with the reason, when its scheduler is not built)")
	flag.IntVar(&c.plugins, "plugins", 100, "real plugin processes (on the first nodes) publishing their slices for the idle period")
	flag.IntVar(&c.nodePath, "node-path", 100, "the node path on the first min(N, -nodes) nodes (default 100, every node of a 100-node fleet): "+
		"each runs a real topodra-kubelet-plugin from the start of the DRA stack, publishing its own slices, and the harness plays its kubelet, "+
		"a GET of each claim as the kubelet and NodePrepareResources for a pod bound there, NodeUnprepareResources once it is deleted; "+
		"through the common waves of every DRA run (0: none, the harness publishes every node's slices)")
	flag.IntVar(&c.gogc, "apiserver-gogc", 0, "GOGC in the kube-apiserver's environment (0: unset, Go's default of 100)")
	flag.Float64Var(&c.goaway, "goaway-chance", 0, "kube-apiserver --goaway-chance (0: off)")
	flag.DurationVar(&c.kwokLease, "kwok-lease", defaultKwokLease, "the kwok nodes' Lease duration, renewed every quarter of it as a kubelet does (the kubelet's default, 40s); "+
		"longer, the controller-manager's --node-monitor-grace-period is raised to it: on two cores the renewals of thousands of nodes take CPU the waves need")
	flag.DurationVar(&c.updaterInt, "updater-interval", 60*time.Second, "the simulated topology updater's interval (the NFD updater's default)")
	flag.BoolVar(&c.updaterNotify, "updater-notify", true, "the simulated updater also writes a node's object when a pod is admitted there (NFD's -kubelet-state-dir trigger, on by default)")
	flag.BoolVar(&c.updaterOnDelete, "updater-on-delete", false, "the simulated updater also writes a node's object when a pod leaves it (NFD's does not: a removal shows at the next interval or admission)")
	flag.DurationVar(&c.waveGap, "wave-gap", 0, "a pause after each wave's teardown, on both stacks (0: the next wave starts at once)")
	flag.StringVar(&c.bins.plugin, "plugin", "", "topodra-kubelet-plugin binary (default: target/release, else target/debug)")
	flag.StringVar(&c.bins.simNode, "sim-node", "", "topodra-sim-node binary")
	flag.StringVar(&c.bins.controller, "controller", "", "topodra-controller binary")
	flag.StringVar(&c.bins.topoSched, "topology-aware-scheduler", "", "the scheduler-plugins kube-scheduler (default: from TOPODRA_TOOLS_BIN)")
	flag.StringVar(&c.repo, "repo", "../..", "the repository root")
	flag.StringVar(&c.nvidiaSlices, "nvidia-slices", "docs/benchmarks/node-path.slices.json",
		"slices NVIDIA's GPU kubelet plugin published in make bench-node (relative to -repo): the same fleet with them against topodra's, unconstrained waves (\"\": skipped)")
	flag.StringVar(&controllerArgs, "controller-args", "", "more flags for topodra-controller, space-separated (e.g. --node-resource-topology=false)")
	flag.Parse()
	c.controllerArgs = strings.Fields(controllerArgs)
	for _, s := range strings.Split(sizes, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 1 || k > gpusPerNode {
			fmt.Fprintf(os.Stderr, "bad -sizes entry %q\n", s)
			os.Exit(2)
		}
		c.sizes = append(c.sizes, k)
	}
	if c.nodePath < 0 {
		fmt.Fprintf(os.Stderr, "-node-path must not be negative\n")
		os.Exit(2)
	}
	if c.kwokLease < defaultKwokLease || c.kwokLease%time.Second != 0 {
		fmt.Fprintf(os.Stderr, "-kwok-lease must be whole seconds, at least %s\n", defaultKwokLease)
		os.Exit(2)
	}
	if c.runs < 1 {
		fmt.Fprintf(os.Stderr, "-runs must be at least 1\n")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if c.rerender != "" {
		if err := rerender(c.rerender); err != nil {
			fmt.Fprintf(os.Stderr, "topodra-scale: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, c); err != nil {
		fmt.Fprintf(os.Stderr, "topodra-scale: %v\n", err)
		if len(clusterDirs) > 0 {
			fmt.Fprintf(os.Stderr, "topodra-scale: the failed run's control planes are kept for their logs: %s\n", strings.Join(clusterDirs, " "))
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	var err error
	if c.repo, err = filepath.Abs(c.repo); err != nil {
		return err
	}
	if !filepath.IsAbs(c.out) {
		c.out = filepath.Join(c.repo, c.out)
	}
	if c.nvidiaSlices != "" && !filepath.IsAbs(c.nvidiaSlices) {
		c.nvidiaSlices = filepath.Join(c.repo, c.nvidiaSlices)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	c.bins.plugin = findBin(c.repo, c.bins.plugin, "topodra-kubelet-plugin")
	c.bins.simNode = findBin(c.repo, c.bins.simNode, "topodra-sim-node")
	c.bins.controller = findBin(c.repo, c.bins.controller, "topodra-controller")
	res := results{Nodes: c.nodes, GPUs: c.nodes * gpusPerNode, Waves: c.waves, Fill: c.fill, Started: time.Now().UTC(),
		APIServerGOGC: c.gogc, GoawayChance: c.goaway, KwokLeaseSeconds: kwokLeaseSeconds(c.kwokLease), SteadyRate: c.steadyRate, ChurnSeconds: c.churn.Seconds(), ChurnRate: c.churnRate, WaveGapSeconds: c.waveGap.Seconds()}
	res.Machine = machine()

	started := time.Now()
	// The stacks alternate, so that a slow drift of the machine (page cache,
	// thermal, a neighbour) lands on both.
	for run := 1; run <= c.runs; run++ {
		rc := c
		rc.draOnly = run == 1 && c.draOnlyWaves
		progress("run %d of %d: DRA stack", run, c.runs)
		dra, err := runDRA(ctx, rc)
		if err != nil {
			return fmt.Errorf("DRA stack, run %d: %w", run, err)
		}
		var legacy *stackResult
		if c.legacy {
			progress("run %d of %d: legacy stack", run, c.runs)
			var why string
			if legacy, why = runLegacy(ctx, rc); why != "" {
				res.LegacySkipped = why
			}
		} else {
			res.LegacySkipped = "-legacy=false"
		}
		if run == 1 {
			res.DRA, res.Legacy = dra, legacy
		} else {
			res.Repeats = append(res.Repeats, repeat{DRA: dra, Legacy: legacy})
		}
		// Written after every run: a later run's failure keeps the earlier ones.
		res.Seconds = time.Since(started).Seconds()
		if _, err := res.write(c.out); err != nil {
			return err
		}
		switch {
		case c.keep:
		case c.legacy && legacy == nil:
			progress("the legacy stack did not complete: its control plane is kept for its logs: %s", strings.Join(clusterDirs, " "))
		default:
			for _, d := range clusterDirs {
				if err := os.RemoveAll(d); err != nil {
					progress("could not remove %s: %v", d, err)
				}
			}
		}
		clusterDirs = nil
	}
	report, err := res.write(c.out)
	if err != nil {
		return err
	}
	fmt.Println(report)
	progress("done in %s; results in %s", time.Since(started).Round(time.Second), c.out)
	return nil
}

// rerender writes dir/report.md from dir/results.json.
func rerender(dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "results.json"), err)
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.markdown()), 0o644)
}

// write saves results.json and report.md in dir and returns the report.
func (r *results) write(dir string) (string, error) {
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), raw, 0o644); err != nil {
		return "", err
	}
	report := r.markdown()
	return report, os.WriteFile(filepath.Join(dir, "report.md"), []byte(report), 0o644)
}

// findBin is the flag's value, else the release build, else the debug build.
func findBin(repo, flagValue, name string) string {
	if flagValue != "" {
		return flagValue
	}
	for _, profile := range []string{"release", "debug"} {
		p := filepath.Join(repo, "target", profile, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func machine() string {
	cpus := 0
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(raw), "processor\t:")
	}
	mem := ""
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(raw), "\n")
		mem = strings.TrimSpace(strings.TrimPrefix(line, "MemTotal:"))
	}
	return fmt.Sprintf("%d CPUs, %s memory", cpus, mem)
}
