package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"topodra.dev/tests/cluster"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100 on
// every Linux architecture this harness runs on (the kernel fixes it for
// userspace whatever CONFIG_HZ is), and Go has no sysconf(_SC_CLK_TCK) without cgo.
const clockTicks = 100

// keptMetrics are the samples a reading keeps from a component's /metrics: Go
// heap in use, the client-go rate limiter's wait (recorded whenever the client
// has a limiter, so a zero sum proves it never held a request back), and the
// schedulers' own figures.
var keptMetrics = map[string]bool{
	"go_memstats_heap_inuse_bytes":                               true,
	"rest_client_rate_limiter_duration_seconds_sum":              true,
	"rest_client_rate_limiter_duration_seconds_count":            true,
	"scheduler_schedule_attempts_total":                          true,
	"scheduler_scheduling_attempt_duration_seconds_sum":          true,
	"scheduler_scheduling_attempt_duration_seconds_count":        true,
	"scheduler_framework_extension_point_duration_seconds_sum":   true,
	"scheduler_framework_extension_point_duration_seconds_count": true,
	"scheduler_plugin_execution_duration_seconds_sum":            true,
	"scheduler_plugin_execution_duration_seconds_count":          true,
	"scheduler_goroutines":                                       true,
	"scheduler_pending_pods":                                     true,
}

// metered is one process of a stack: its pid for /proc, and where it serves
// /metrics ("" for none, as for topodra's controller, whose Prometheus page has no
// Go runtime figures, and etcd's, which is read without a client certificate).
type metered struct {
	name string
	pid  int
	url  string
	// started is the process's start time (/proc/PID/stat field 22) where it was
	// taken when the process was added: a group's plugins stop before the run ends,
	// and a later process given one of their pids must not be counted as theirs.
	started string
}

// meter reads what one stack's processes spent. A reading is taken at each edge
// of a wave (and of its teardown): the CPU time of every process from /proc, the
// machine's busy time from /proc/stat, and the kept samples of every /metrics.
type meter struct {
	cl    *cluster.Cluster
	mu    sync.Mutex
	procs []metered
	t0    time.Time
	heap  heapSeries
	// heapPeak is each component's highest heap since takeHeapPeaks.
	heapPeak map[string]float64
	// background is each process's CPU in cores while nothing was asked of
	// the stack (leases, heartbeats, resyncs): what a wave's CPU is corrected
	// by, or a wave that waits would be charged for the waiting.
	background map[string]float64
	// settle, when set (-node-path), waits for the kubelet stand-in: at the
	// end of a wave until its prepares are done, so that they fall in the
	// wave's window, and after the teardown until its pods are unprepared.
	settle func(unprepared bool)
}

// heapSeries is Go heap in use per component at every reading: point i was taken
// Seconds[i] after the meter started.
type heapSeries struct {
	Seconds []float64            `json:"seconds"`
	Bytes   map[string][]float64 `json:"bytes"`
}

type reading struct {
	at          time.Time
	cpu         map[string]float64 // seconds of user and system time
	samples     map[string]map[string]float64
	busy, total float64 // jiffies of all CPUs
}

func newMeter(cl *cluster.Cluster) *meter {
	m := &meter{cl: cl, t0: time.Now(), heap: heapSeries{Bytes: map[string][]float64{}}, heapPeak: map[string]float64{}}
	for name, pid := range clusterPids(cl) {
		url := cl.MetricsURL(name)
		if name == cluster.Etcd && cl.EtcdURL != "" {
			url = cl.EtcdURL + "/metrics"
		}
		m.procs = append(m.procs, metered{name: name, pid: pid, url: url})
	}
	m.add("harness", os.Getpid(), "")
	return m
}

// add meters another process.
func (m *meter) add(name string, pid int, url string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.procs {
		if m.procs[i].name == name {
			m.procs[i] = metered{name: name, pid: pid, url: url}
			return
		}
	}
	m.procs = append(m.procs, metered{name: name, pid: pid, url: url})
}

// addGroup meters processes together under one name, their CPU summed: the
// node path's plugins, a hundred processes that are one component.
func (m *meter) addGroup(name string, pids []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, pid := range pids {
		started := ""
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			started = procStartTime(string(b))
		}
		m.procs = append(m.procs, metered{name: name, pid: pid, started: started})
	}
}

func (m *meter) read(ctx context.Context) reading {
	m.mu.Lock()
	procs := append([]metered(nil), m.procs...)
	m.mu.Unlock()
	r := reading{at: time.Now(), cpu: map[string]float64{}, samples: map[string]map[string]float64{}}
	r.busy, r.total = machineJiffies()
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
		if err != nil || (p.started != "" && procStartTime(string(b)) != p.started) {
			continue // gone, or its pid now another process's
		}
		if s, err := parseProcStatCPU(string(b)); err == nil {
			r.cpu[p.name] += s // a group's processes add up
		}
	}
	for _, p := range procs {
		if p.url == "" {
			continue
		}
		if s, err := m.scrape(ctx, p.url); err == nil {
			r.samples[p.name] = s
		}
	}
	m.mu.Lock()
	m.heap.Seconds = append(m.heap.Seconds, r.at.Sub(m.t0).Seconds())
	n := len(m.heap.Seconds)
	for _, p := range procs {
		h, ok := r.samples[p.name]["go_memstats_heap_inuse_bytes"]
		if !ok {
			continue
		}
		// A process metered late gets zeros before it ran: every series shares
		// the time axis.
		for len(m.heap.Bytes[p.name]) < n-1 {
			m.heap.Bytes[p.name] = append(m.heap.Bytes[p.name], 0)
		}
		m.heap.Bytes[p.name] = append(m.heap.Bytes[p.name], h)
		m.heapPeak[p.name] = max(m.heapPeak[p.name], h)
	}
	m.mu.Unlock()
	return r
}

func (m *meter) scrape(ctx context.Context, url string) (map[string]float64, error) {
	raw, err := m.cl.Scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	return keepSamples(bytes.NewReader(raw), keptMetrics), nil
}

func (m *meter) series() *heapSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := &heapSeries{Seconds: append([]float64(nil), m.heap.Seconds...), Bytes: map[string][]float64{}}
	for k, v := range m.heap.Bytes {
		out.Bytes[k] = append([]float64(nil), v...)
	}
	return out
}

// peaks are gauges a reading at the edges of a wave would miss, per scheduler.
type peaks struct {
	binding map[string]float64 // scheduler_goroutines{operation="binding"}
	heap    map[string]float64 // go_memstats_heap_inuse_bytes
}

// pollPeaks scrapes the schedulers once a second until the returned function is
// called, which gives each one's highest count of binding goroutines and Go heap.
func (m *meter) pollPeaks(ctx context.Context, schedulers ...string) func() peaks {
	m.mu.Lock()
	var urls []metered
	for _, p := range m.procs {
		for _, s := range schedulers {
			if p.name == s && p.url != "" {
				urls = append(urls, p)
			}
		}
	}
	m.mu.Unlock()
	pk := peaks{binding: map[string]float64{}, heap: map[string]float64{}}
	var mu sync.Mutex
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			for _, p := range urls {
				s, err := m.scrape(ctx, p.url)
				if err != nil {
					continue
				}
				mu.Lock()
				pk.binding[p.name] = max(pk.binding[p.name], s[`scheduler_goroutines{operation="binding"}`])
				pk.heap[p.name] = max(pk.heap[p.name], s["go_memstats_heap_inuse_bytes"])
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() peaks {
		close(stop)
		<-done
		return pk
	}
}

// procStartTime is field 22 of a /proc/PID/stat line (the process's start, in clock
// ticks after boot), "" where the line is too short.
func procStartTime(stat string) string {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19] // f[0] is field 3
}

// parseProcStatCPU is utime+stime of a process: fields 14 and 15 of a
// /proc/<pid>/stat line, counted after the command name, which may hold spaces.
func parseProcStatCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %.60q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat line %.60q", stat)
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad utime/stime in %.60q", stat)
	}
	return (u + s) / clockTicks, nil
}

// machineJiffies are the busy and total times of all CPUs from /proc/stat's
// first line (user nice system idle iowait irq softirq steal ...); guest time is
// already inside user.
func machineJiffies() (busy, total float64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	fields := strings.Fields(line)
	for i, v := range fields[1:min(len(fields), 9)] {
		x, _ := strconv.ParseFloat(v, 64)
		total += x
		if i != 3 && i != 4 { // idle, iowait
			busy += x
		}
	}
	return busy, total
}

// keepSamples reads a Prometheus text page and keeps the samples whose metric
// name is in names, keyed by their text before the value.
func keepSamples(r io.Reader, names map[string]bool) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end < 0 || !names[line[:end]] {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// cost is what a stack's processes spent between two readings.
type cost struct {
	Seconds    float64            `json:"seconds"`
	CPUSeconds map[string]float64 `json:"cpuSeconds"`
	// BackgroundCPUSeconds is what each process would have spent in the same
	// time with nothing asked of it (meter.background).
	BackgroundCPUSeconds map[string]float64 `json:"backgroundCPUSeconds,omitempty"`
	// LimiterWaitSeconds sums rest_client_rate_limiter_duration_seconds: the time
	// requests of each component's clients spent held back by their own limiter.
	LimiterWaitSeconds map[string]float64 `json:"limiterWaitSeconds"`
	// MachineBusy is the share of all cores' time that was busy.
	MachineBusy float64                 `json:"machineBusy"`
	Schedulers  map[string]schedFigures `json:"schedulers,omitempty"`
}

// schedFigures are a scheduler's own metrics over the window.
type schedFigures struct {
	Attempts map[string]float64 `json:"attempts"` // scheduler_schedule_attempts_total by result
	// AttemptMeanMs is scheduler_scheduling_attempt_duration_seconds' mean.
	AttemptMeanMs float64 `json:"attemptMeanMs"`
	// ExtensionPointMs is the time spent in each extension point, all calls
	// (scheduler_framework_extension_point_duration_seconds), and
	// ExtensionPointCalls how many calls that was.
	ExtensionPointMs    map[string]float64 `json:"extensionPointMs"`
	ExtensionPointCalls map[string]float64 `json:"extensionPointCalls"`
	// PluginMeanMs is the mean of one plugin's call at one extension point,
	// "Filter/DynamicResources": scheduler_plugin_execution_duration_seconds,
	// which kube-scheduler records for a sample of its cycles.
	PluginMeanMs map[string]float64 `json:"pluginMeanMs"`
	// BindingGoroutinesPeak is the highest scheduler_goroutines{operation="binding"}
	// and HeapPeakBytes the highest go_memstats_heap_inuse_bytes seen once a
	// second over the window.
	BindingGoroutinesPeak float64 `json:"bindingGoroutinesPeak"`
	HeapPeakBytes         float64 `json:"heapPeakBytes"`
}

func between(a, b reading, pk peaks) cost {
	c := cost{Seconds: b.at.Sub(a.at).Seconds(), CPUSeconds: map[string]float64{}, LimiterWaitSeconds: map[string]float64{}}
	for name, v := range b.cpu {
		if before, ok := a.cpu[name]; ok {
			c.CPUSeconds[name] = v - before
		} else {
			c.CPUSeconds[name] = v // started inside the window
		}
	}
	if t := b.total - a.total; t > 0 {
		c.MachineBusy = (b.busy - a.busy) / t
	}
	for name, after := range b.samples {
		d := diff(after, a.samples[name])
		wait := 0.0
		for k, v := range d {
			if strings.HasPrefix(k, "rest_client_rate_limiter_duration_seconds_sum") {
				wait += v
			}
		}
		c.LimiterWaitSeconds[name] = wait
		if !hasPrefix(after, "scheduler_") {
			continue
		}
		if c.Schedulers == nil {
			c.Schedulers = map[string]schedFigures{}
		}
		c.Schedulers[name] = schedulerFigures(d, pk.binding[name], pk.heap[name])
	}
	return c
}

// schedulerFigures sums a scheduler's counters and histograms over their labels.
func schedulerFigures(d map[string]float64, binding, heap float64) schedFigures {
	f := schedFigures{Attempts: map[string]float64{}, ExtensionPointMs: map[string]float64{}, ExtensionPointCalls: map[string]float64{},
		PluginMeanMs: map[string]float64{}, BindingGoroutinesPeak: binding, HeapPeakBytes: heap}
	var attemptSum, attemptCount float64
	pluginSum, pluginCount := map[string]float64{}, map[string]float64{}
	for k, v := range d {
		name, _, _ := strings.Cut(k, "{")
		switch name {
		case "scheduler_schedule_attempts_total":
			f.Attempts[label(k, "result")] += v
		case "scheduler_scheduling_attempt_duration_seconds_sum":
			attemptSum += v
		case "scheduler_scheduling_attempt_duration_seconds_count":
			attemptCount += v
		case "scheduler_framework_extension_point_duration_seconds_sum":
			f.ExtensionPointMs[label(k, "extension_point")] += v * 1000
		case "scheduler_framework_extension_point_duration_seconds_count":
			f.ExtensionPointCalls[label(k, "extension_point")] += v
		case "scheduler_plugin_execution_duration_seconds_sum":
			pluginSum[label(k, "extension_point")+"/"+label(k, "plugin")] += v
		case "scheduler_plugin_execution_duration_seconds_count":
			pluginCount[label(k, "extension_point")+"/"+label(k, "plugin")] += v
		}
	}
	if attemptCount > 0 {
		f.AttemptMeanMs = attemptSum / attemptCount * 1000
	}
	for k, n := range pluginCount {
		if n > 0 {
			f.PluginMeanMs[k] = pluginSum[k] / n * 1000
		}
	}
	return f
}

// controlPlane are the processes whose CPU a scheduled pod is charged with;
// kwok (the fake kubelets), the harness (the load, the simulated topology
// updater and the node path's kubelet stand-in) and the node path's plugins
// run on nodes in a real cluster, and are recorded beside them.
func controlPlane(name string) bool {
	return name != cluster.Kwok && name != "harness" && name != pluginClient
}

// boundBy names what held a window back: a client rate limiter that made
// requests wait, else a process near a whole core (kube-scheduler schedules one
// pod at a time), else the machine's cores when they were nearly all busy.
func boundBy(c cost, cores int) string {
	if c.Seconds <= 0 {
		return ""
	}
	type load struct {
		name string
		v    float64
	}
	var waits, cpus []load
	for n, w := range c.LimiterWaitSeconds {
		waits = append(waits, load{n, w})
	}
	for n, s := range c.CPUSeconds {
		cpus = append(cpus, load{n, s / c.Seconds})
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i].v > waits[j].v })
	sort.Slice(cpus, func(i, j int) bool { return cpus[i].v > cpus[j].v })
	// Requests waiting a tenth of the window in all: the limiter shapes the rate.
	if len(waits) > 0 && waits[0].v >= 0.1*c.Seconds {
		return fmt.Sprintf("client rate limiter of %s (%.1f s waited in %.1f s)", waits[0].name, waits[0].v, c.Seconds)
	}
	top := ""
	if len(cpus) > 0 {
		top = fmt.Sprintf("%s at %.2f cores", cpus[0].name, cpus[0].v)
	}
	if c.MachineBusy >= 0.9 {
		return fmt.Sprintf("machine CPU (%.0f%% of %d cores busy; %s)", c.MachineBusy*100, cores, top)
	}
	if len(cpus) > 0 && cpus[0].v >= 0.9 {
		return "CPU of " + top
	}
	return fmt.Sprintf("nothing saturated (%.0f%% of %d cores busy; %s)", c.MachineBusy*100, cores, top)
}

// wave runs one wave between two readings and its teardown between two more.
func (m *meter) wave(ctx context.Context, run func() (waveResult, error), teardown func() error) (waveResult, error) {
	a := m.read(ctx)
	stop := m.pollPeaks(ctx, cluster.Scheduler, topoScheduler)
	r, err := run()
	pk := stop()
	if err != nil {
		return r, err
	}
	if m.settle != nil {
		m.settle(false)
	}
	b := m.read(ctx)
	c := between(a, b, pk)
	c.BackgroundCPUSeconds = m.backgroundFor(c.Seconds)
	r.Cost, r.BoundBy = &c, boundBy(c, runtime.NumCPU())
	if err := teardown(); err != nil {
		return r, err
	}
	if m.settle != nil {
		m.settle(true)
	}
	t := between(b, m.read(ctx), peaks{})
	t.BackgroundCPUSeconds = m.backgroundFor(t.Seconds)
	r.Teardown = &t
	return r, nil
}

func hasPrefix(m map[string]float64, prefix string) bool {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// takeHeapPeaks returns the highest heap of each component since the last call.
func (m *meter) takeHeapPeaks() map[string]float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.heapPeak
	m.heapPeak = map[string]float64{}
	return out
}

// measureBackground reads every process's CPU over a quiet window of length d.
func (m *meter) measureBackground(ctx context.Context, d time.Duration) map[string]float64 {
	a := m.read(ctx)
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	c := between(a, m.read(ctx), peaks{})
	bg := map[string]float64{}
	for name, s := range c.CPUSeconds {
		if c.Seconds > 0 {
			bg[name] = s / c.Seconds
		}
	}
	m.mu.Lock()
	m.background = bg
	m.mu.Unlock()
	return bg
}

func (m *meter) backgroundFor(seconds float64) map[string]float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.background == nil {
		return nil
	}
	out := map[string]float64{}
	for name, cores := range m.background {
		out[name] = cores * seconds
	}
	return out
}
