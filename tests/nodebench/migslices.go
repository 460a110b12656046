package main

// The -mig-slices mode: what a simulated DGX H100 publishes, in ResourceSlice bytes
// per GPU, with and without MIG partitions, for topodra (--dynamic-mig) and for
// NVIDIA's GPU kubelet plugin (its alpha DynamicMIG feature gate), each on the same
// fake NVML and through the same API server. Nothing is prepared: the plugins start,
// publish their pool, and stop. See docs/benchmarks.md "Slice size with dynamic MIG".

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"topodra.dev/tests/cluster"
)

// sliceRun is one plugin in one mode on one simulated node: what its pool holds.
type sliceRun struct {
	Driver     string `json:"driver"`
	DriverName string `json:"driverName"`
	// Mode is the flag added to the plugin's command line; empty: its defaults.
	Mode    string `json:"mode"`
	Profile string `json:"profile"`
	// PoolStats is what the pool holds; nil (left out) when there was none.
	*PoolStats
	// Error is why the plugin published no pool; LogTail its last log lines.
	Error   string   `json:"error,omitempty"`
	LogTail []string `json:"logTail,omitempty"`
	slices  []resourceapi.ResourceSlice
}

// PoolStats count a published pool.
type PoolStats struct {
	Slices  int `json:"slices"`
	Devices int `json:"devices"`
	// CounterSets and Counters are the pool's shared counter sets and the
	// counters in them (KEP-4815, partitionable devices).
	CounterSets int `json:"counterSets"`
	Counters    int `json:"counters"`
	// SpecBytes is the JSON size of all the pool's slice specs, as the node-path
	// benchmark counts it (specBytesPerDevice); CounterSetBytes the part of it
	// that is the sharedCounters lists.
	SpecBytes       int     `json:"specBytes"`
	CounterSetBytes int     `json:"counterSetBytes"`
	BytesPerGPU     float64 `json:"bytesPerGPU"`
	// The means per device of what a device carries: attributes, capacities,
	// and counters it consumes (over all its counter sets).
	AttributesPerDevice       float64 `json:"attributesPerDevice"`
	CapacitiesPerDevice       float64 `json:"capacitiesPerDevice"`
	ConsumedCountersPerDevice float64 `json:"consumedCountersPerDevice"`
	StartToPoolMs             float64 `json:"startToPoolMs"`
}

type migSlicesReport struct {
	Date  string `json:"date"`
	About string `json:"about"`
	// GPUs is the divisor of bytesPerGPU: the profiles' GPU count.
	GPUs         int               `json:"gpus"`
	Plugins      map[string]string `json:"plugins"`
	ControlPlane map[string]string `json:"controlPlane"`
	Machine      map[string]string `json:"machine"`
	Runs         []sliceRun        `json:"runs"`
	// NvidiaDynamicMig is set when NVIDIA's plugin published no pool with its
	// DynamicMIG gate on: why, in one line.
	NvidiaDynamicMig *runError `json:"nvidiaDynamicMig,omitempty"`
	WallSeconds      float64   `json:"wallSeconds"`
}

type runError struct {
	Error string `json:"error"`
}

// migSlicesOptions are the -mig-slices mode's inputs.
type migSlicesOptions struct {
	out, specsOut string
	profiles      []string
	gpus          int
	settle        time.Duration
	workDir       string
	// clean takes this machine's paths out of what the report quotes: it is
	// committed.
	clean func(string) string
}

// sliceModes are the runs on each profile: each plugin with its defaults, then
// with its dynamic MIG switch.
func sliceModes(bins binaries, profile string) []sliceMode {
	topodra := topodraDriver(bins.topodra, bins.sim, profile)
	nvidia := nvidiaDriver(bins.nvidia, bins.sim, profile, bins.cdiHook, "nvidia")
	return []sliceMode{
		{topodra, ""},
		{topodra, "--dynamic-mig"},
		{nvidia, ""},
		// The kubelet plugin's --feature-gates (pkg/flags/featuregates.go);
		// DynamicMIG is alpha and off by default in v0.4.1.
		{nvidia, "--feature-gates=DynamicMIG=true"},
	}
}

type sliceMode struct {
	d    driver
	mode string
}

// withFlag is d with flag appended to its command line.
func withFlag(d driver, flag string) driver {
	if flag == "" {
		return d
	}
	base := d.args
	d.args = func(dir, node, kubeconfig string) ([]string, []string, error) {
		args, env, err := base(dir, node, kubeconfig)
		return append(args, flag), env, err
	}
	return d
}

func runMigSlices(bins binaries, o migSlicesOptions) error {
	began := time.Now()
	if bins.nvidia == "" || bins.cdiHook == "" {
		return fmt.Errorf("-nvidia-plugin and -nvidia-cdi-hook are required")
	}
	ctx, stop := signalContext()
	defer stop()
	workDir, keep, err := makeWorkDir(o.workDir, "nodebench-mig-slices-")
	if err != nil {
		return err
	}
	klogFile, err := logKlogTo(workDir)
	if err != nil {
		return err
	}
	defer klogFile.Close()
	o.clean = strings.NewReplacer(workDir, "<work-dir>",
		filepath.Dir(bins.nvidia), "<nvidia-plugin-dir>", filepath.Dir(bins.topodra), "<topodra-plugin-dir>").Replace

	c, admin, err := startControlPlane(ctx, workDir)
	if err != nil {
		return err
	}
	defer func() { _ = c.Stop() }()

	rep := migSlicesReport{
		Date:  time.Now().UTC().Format(time.RFC3339),
		About: "ResourceSlices each plugin publishes on a simulated node (fake NVML), listed from a real API server; nothing prepared",
		GPUs:  o.gpus, ControlPlane: c.Versions, Machine: machine(),
		Plugins: map[string]string{
			"topodra": version(bins.topodra, "--version"), "nvidia": version(bins.nvidia, "--version"),
		},
	}
	n := 0
	for _, profile := range o.profiles {
		for _, m := range sliceModes(bins, profile) {
			// Node names of one length: the node's name is in every slice spec.
			node := fmt.Sprintf("migslices-%02d", n)
			n++
			r, err := measureSlices(ctx, c, admin, m, profile, node, filepath.Join(workDir, node), o)
			if err != nil {
				return err
			}
			rep.Runs = append(rep.Runs, *r)
			if r.Error != "" && r.Driver == "nvidia" && r.Mode != "" && rep.NvidiaDynamicMig == nil {
				rep.NvidiaDynamicMig = &runError{Error: r.Error}
			}
		}
	}
	rep.WallSeconds = time.Since(began).Seconds()
	if err := writeMigSlices(&rep, o); err != nil {
		return err
	}
	logf("wrote %s (%.0f s)", o.out, rep.WallSeconds)
	if !keep {
		_ = c.Stop()
		_ = os.RemoveAll(workDir)
	}
	return nil
}

// measureSlices runs one plugin in one mode until its pool has settled. A plugin
// that publishes no pool is a result (Error) for NVIDIA's plugin, whose dynamic
// MIG is alpha and meets a fake NVML; for topodra it fails the run.
func measureSlices(ctx context.Context, c *cluster.Cluster, admin kubernetes.Interface, m sliceMode, profile, node, dir string, o migSlicesOptions) (*sliceRun, error) {
	d := withFlag(m.d, m.mode)
	label := strings.TrimSpace(d.Key + " " + m.mode)
	logf("== %s on %s (node %s)", label, profile, node)
	r := &sliceRun{Driver: d.Key, DriverName: d.DriverName, Mode: m.mode, Profile: profile}
	p, err := startPlugin(ctx, c, d, dir, node)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	defer p.stop()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	slices, at, err := settledPool(wctx, admin, node, d.DriverName, p.exited, o.settle)
	if err != nil {
		if d.Key == "topodra" {
			return nil, p.fail(err)
		}
		// The last line a plugin logs is most often why it stopped.
		last := tail(p.logPath, 5)
		r.Error = o.clean(fmt.Sprintf("%v; its last log line: %s", err, last[strings.LastIndex(last, "\n")+1:]))
		for _, l := range strings.Split(last, "\n") {
			r.LogTail = append(r.LogTail, o.clean(l))
		}
		logf("%s: no pool: %v\n%s", label, err, last)
		return r, nil
	}
	r.slices, r.PoolStats = slices, tally(slices, o.gpus)
	r.StartToPoolMs = ms(at.Sub(p.started))
	logf("%s: %d slices, %d devices, %d counter sets; %d bytes, %.0f per GPU",
		label, r.Slices, r.Devices, r.CounterSets, r.SpecBytes, r.BytesPerGPU)
	// topodra's partitions come with one counter set per GPU: a check of the
	// divisor, which the slices cannot give where no GPU is in MIG mode.
	if d.Key == "topodra" && r.Devices > o.gpus && r.CounterSets != o.gpus {
		return nil, p.fail(fmt.Errorf("%d counter sets for %d devices, want one per GPU (%d): is -mig-slices-gpus the profile's GPU count?", r.CounterSets, r.Devices, o.gpus))
	}
	return r, nil
}

// settledPool waits for the node's pool of driverName to be complete and then
// unchanged for settle: a plugin may publish its pool in more than one step, and
// a pool of no devices is complete as soon as it is listed. It returns the pool's
// slices and when they were first listed as returned.
func settledPool(ctx context.Context, admin kubernetes.Interface, node, driverName string, exited <-chan error, settle time.Duration) ([]resourceapi.ResourceSlice, time.Time, error) {
	sel := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", node),
		fields.OneTermEqualSelector("spec.driver", driverName)).String()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var seen string
	var since time.Time
	for {
		list, err := admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		now := time.Now()
		if err == nil {
			if _, current, ok := completePool(list.Items); ok {
				if f := fingerprint(current); f != seen {
					seen, since = f, now
				} else if now.Sub(since) >= settle {
					return current, since, nil
				}
			} else {
				seen = ""
			}
		}
		select {
		case <-ctx.Done():
			return nil, time.Time{}, fmt.Errorf("no complete pool of %s on %s: %w", driverName, node, ctx.Err())
		case err := <-exited:
			return nil, time.Time{}, fmt.Errorf("plugin exited before its pool settled: %v", err)
		case <-tick.C:
		}
	}
}

// fingerprint names the slices' versions: equal when nothing was written between
// two lists.
func fingerprint(slices []resourceapi.ResourceSlice) string {
	var v []string
	for _, s := range slices {
		v = append(v, s.Name+"@"+s.ResourceVersion)
	}
	sort.Strings(v)
	return strings.Join(v, ",")
}

// tally counts the pool's slices.
func tally(slices []resourceapi.ResourceSlice, gpus int) *PoolStats {
	r := &PoolStats{}
	var attrs, caps, consumed int
	for _, s := range slices {
		r.Slices++
		r.Devices += len(s.Spec.Devices)
		r.CounterSets += len(s.Spec.SharedCounters)
		for _, cs := range s.Spec.SharedCounters {
			r.Counters += len(cs.Counters)
		}
		if len(s.Spec.SharedCounters) > 0 {
			b, _ := json.Marshal(s.Spec.SharedCounters)
			r.CounterSetBytes += len(b)
		}
		for _, d := range s.Spec.Devices {
			attrs += len(d.Attributes)
			caps += len(d.Capacity)
			for _, cc := range d.ConsumesCounters {
				consumed += len(cc.Counters)
			}
		}
	}
	r.SpecBytes = specBytes(slices)
	r.BytesPerGPU = float64(r.SpecBytes) / float64(gpus)
	if r.Devices > 0 {
		per := func(n int) float64 { return float64(n) / float64(r.Devices) }
		r.AttributesPerDevice, r.CapacitiesPerDevice, r.ConsumedCountersPerDevice = per(attrs), per(caps), per(consumed)
	}
	return r
}

func writeMigSlices(rep *migSlicesReport, o migSlicesOptions) error {
	if err := writeJSON(o.out, rep); err != nil {
		return err
	}
	if o.specsOut == "" {
		return nil
	}
	// The specs themselves, by run, for reading what the bytes are made of.
	specs := map[string][]resourceapi.ResourceSliceSpec{}
	for _, r := range rep.Runs {
		key := strings.TrimSpace(r.Profile + " " + r.Driver + " " + r.Mode)
		for _, s := range r.slices {
			specs[key] = append(specs[key], s.Spec)
		}
	}
	return writeJSON(o.specsOut, specs)
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// Without HTML escaping: the report quotes log lines with <work-dir> in them.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
