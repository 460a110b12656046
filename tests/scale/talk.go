package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// pairs are the runs in which both stacks ran: the first, then the repeats.
func (r results) pairs() []repeat {
	var out []repeat
	if r.Legacy != nil {
		out = append(out, repeat{DRA: r.DRA, Legacy: r.Legacy})
	}
	for _, p := range r.Repeats {
		if p.Legacy != nil {
			out = append(out, p)
		}
	}
	return out
}

// figure reads one number of a stack; ok is false where the stack lacks it.
type figure func(s *stackResult) (float64, bool)

func kindFigure(size int, kind string, f func(kindResult) float64) figure {
	return func(s *stackResult) (float64, bool) {
		k, ok := s.kind(size, kind)
		if !ok {
			return 0, false
		}
		return f(k), true
	}
}

// summed is a memory figure summed over components, present when one is.
func summed(m func(s *stackResult) map[string]float64, names ...string) figure {
	return func(s *stackResult) (float64, bool) {
		total, any := 0.0, false
		for _, n := range names {
			if v, ok := m(s)[n]; ok {
				total += v
				any = true
			}
		}
		return total, any
	}
}

// The kinds the talk's comparison reads on each stack: saturating waves, waves
// at a steady rate, and the churn workload (one kind of size 0 on both).
const (
	draSaturating    = "aligned"
	draSteady        = "aligned-steady"
	legacySaturating = "single-numa-node"
	legacySteady     = "single-numa-node-steady"
	churnKindName    = "mixed-churn"
)

func podsPerSecOf(x kindResult) float64 { return x.PodsPerSec }
func p50Of(x kindResult) float64        { return x.P50Ms }
func p99Of(x kindResult) float64        { return x.P99Ms }

// firstWavePodsPerSec is the throughput of a kind's first 1-GPU wave: on the
// legacy stack its only wave on fresh NodeResourceTopology.
func firstWavePodsPerSec(kind string) figure {
	return kindFigure(1, kind, func(x kindResult) float64 {
		if len(x.Waves) == 0 {
			return 0
		}
		return x.Waves[0].PodsPerSec
	})
}

// Scheduler memory, peak RSS: DRA's kube-scheduler, and the legacy stack's two
// schedulers summed (as the talk counted them: its kube-scheduler schedules
// none of the waves' pods) or its topology-aware scheduler alone.
var (
	draSchedulerRSS     = summed(rssOf, "kube-scheduler")
	legacySchedulersRSS = summed(rssOf, "kube-scheduler", topoScheduler)
	topoSchedulerRSS    = summed(rssOf, topoScheduler)
)

// gaveUpWaves counts the waves of the talk's kinds (saturating and steady
// waves of the sizes both stacks run, and the churn workload) that gave up
// with pods never bound; wavesOf counts them all.
func gaveUpWaves(legacy bool) figure {
	return func(s *stackResult) (float64, bool) {
		n := 0
		for _, w := range talkWaves(s, legacy) {
			if w.TimedOutPod > 0 {
				n++
			}
		}
		return float64(n), true
	}
}

func wavesOf(legacy bool) figure {
	return func(s *stackResult) (float64, bool) { return float64(len(talkWaves(s, legacy))), true }
}

func talkWaves(s *stackResult, legacy bool) []waveResult {
	kinds := []string{draSaturating, draSteady}
	if legacy {
		kinds = []string{legacySaturating, legacySteady}
	}
	var out []waveResult
	for _, k := range s.Kinds {
		if (k.Size == 0 && k.Kind == churnKindName) ||
			(slices.Contains(kinds, k.Kind) && slices.Contains(commonSizes([]int{k.Size}), k.Size)) {
			out = append(out, k.Waves...)
		}
	}
	return out
}

// cpuTotal is the control plane's CPU ms per bound pod in one row of the CPU
// table (a size's median wave, or firstWaveRow); cpuProc one process's.
func cpuTotal(row int, kind string, teardown bool) figure {
	return cpuProc(controlPlaneTotal, row, kind, teardown)
}

const controlPlaneTotal = "control plane total"

func cpuProc(name string, row int, kind string, teardown bool) figure {
	return func(s *stackResult) (float64, bool) {
		m, ok := cpuOfRow(s, row, kind, teardown)
		if !ok {
			return 0, false
		}
		if name != controlPlaneTotal {
			v, ok := m[name]
			return v, ok
		}
		total := 0.0
		for p, v := range m {
			if controlPlane(p) {
				total += v
			}
		}
		return total, len(m) > 0
	}
}

func rssOf(s *stackResult) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s.MemoryPeak {
		out[k] = float64(v)
	}
	return out
}

func heapOf(s *stackResult) map[string]float64 { return s.GoHeapPeak }

// spread is a figure over the runs: the median of each side and of the
// per-run ratios, with the ratios' lowest and highest.
type spread struct {
	dra, legacy, ratio, lo, hi float64
	n                          int
}

func over(pairs []repeat, dra, legacy figure) (spread, bool) {
	var ds, ls, rs []float64
	for _, p := range pairs {
		d, okD := dra(&p.DRA)
		l, okL := legacy(p.Legacy)
		if !okD || !okL {
			continue
		}
		ds, ls = append(ds, d), append(ls, l)
		if l != 0 {
			rs = append(rs, d/l)
		}
	}
	if len(ds) == 0 {
		return spread{}, false
	}
	sp := spread{dra: medianOf(ds), legacy: medianOf(ls), n: len(ds)}
	if len(rs) > 0 {
		sp.ratio, sp.lo, sp.hi = medianOf(rs), slices.Min(rs), slices.Max(rs)
	}
	return sp, true
}

// overEach is one stack's figure (the legacy stack's when legacy is set) over
// the runs that have it: its median, or nil when no run has it.
func overEach(pairs []repeat, f figure, legacy bool) *float64 {
	vs := perRun(pairs, f, legacy)
	if len(vs) == 0 {
		return nil
	}
	m := medianOf(vs)
	return &m
}

// perRun is one stack's figure (the legacy stack's when legacy is set) in
// each run that has it, in run order.
func perRun(pairs []repeat, f figure, legacy bool) []float64 {
	var vs []float64
	for i := range pairs {
		s := &pairs[i].DRA
		if legacy {
			s = pairs[i].Legacy
		}
		if s == nil {
			continue
		}
		if v, ok := f(s); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

func msText(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

func podsPerCPUSecondOf(v *float64) string {
	if v == nil {
		return "-"
	}
	return podsPerCPUSecond(*v)
}

func (sp spread) ratioText() string {
	if sp.ratio == 0 {
		return "-"
	}
	if sp.n == 1 {
		return fmt.Sprintf("%.3g (1 run)", sp.ratio)
	}
	return fmt.Sprintf("%.3g (%.3g-%.3g, %d runs)", sp.ratio, sp.lo, sp.hi, sp.n)
}

// talkFigures is the talk's comparison, DRA against legacy, on the workload
// both ran, with the spread of the ratio over the runs.
func (r results) talkFigures(b *strings.Builder) {
	pairs := r.pairs()
	b.WriteString("## The talk's figures: DRA against legacy, the same workload\n\n")
	b.WriteString("Medians over the runs; the ratio is DRA / legacy per run, its median and range. " +
		"Legacy scheduler memory is shown both ways: both of its schedulers summed, as the talk counted it, and the topology-aware scheduler alone, " +
		"the one that schedules the waves' pods (its kube-scheduler schedules none of them).\n\n")
	b.WriteString("| figure | GPUs | DRA | legacy | DRA / legacy |\n|---|---|---|---|---|\n")
	row := func(name string, size int, format func(float64) string, dra, legacy figure) {
		if sp, ok := over(pairs, dra, legacy); ok {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", name, sizeOrBlank(size), format(sp.dra), format(sp.legacy), sp.ratioText())
		}
	}
	perSec := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	ms := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	count := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	mb := func(v float64) string { return mib(int64(v)) }
	row("throughput, the run's first wave (legacy: on fresh NodeResourceTopology), pods/s", 1, perSec,
		firstWavePodsPerSec(draSaturating), firstWavePodsPerSec(legacySaturating))
	for _, k := range commonSizes(kindSizes(r.DRA.Kinds)) {
		row("throughput, saturating waves, median wave, pods/s", k, perSec,
			kindFigure(k, draSaturating, podsPerSecOf), kindFigure(k, legacySaturating, podsPerSecOf))
		row(fmt.Sprintf("latency p50 at %g pods/s, ms", r.SteadyRate), k, ms,
			kindFigure(k, draSteady, p50Of), kindFigure(k, legacySteady, p50Of))
		row(fmt.Sprintf("latency p99 at %g pods/s, ms", r.SteadyRate), k, ms,
			kindFigure(k, draSteady, p99Of), kindFigure(k, legacySteady, p99Of))
	}
	churn := func(f func(kindResult) float64) figure { return kindFigure(0, churnKindName, f) }
	row("churn latency p50, ms", 0, ms, churn(p50Of), churn(p50Of))
	row("churn latency p99, ms", 0, ms, churn(p99Of), churn(p99Of))
	row("churn pods refused by the node (TopologyAffinityError)", 0, count,
		churn(func(x kindResult) float64 { return x.Misaligned }), churn(func(x kindResult) float64 { return x.Misaligned }))
	row("churn pods never scheduled", 0, count,
		churn(func(x kindResult) float64 { return x.Unscheduled }), churn(func(x kindResult) float64 { return x.Unscheduled }))
	row("scheduler memory, peak RSS (legacy: both schedulers summed)", -1, mb, draSchedulerRSS, legacySchedulersRSS)
	row("scheduler memory, peak RSS (legacy: the topology-aware scheduler alone)", -1, mb, draSchedulerRSS, topoSchedulerRSS)
	row("scheduler Go heap in use, peak (legacy: both schedulers summed)", -1, mb, summed(heapOf, "kube-scheduler"), summed(heapOf, "kube-scheduler", topoScheduler))
	row("API server memory, peak RSS", -1, mb, summed(rssOf, "kube-apiserver"), summed(rssOf, "kube-apiserver"))
	row("API server Go heap in use, peak", -1, mb, summed(heapOf, "kube-apiserver"), summed(heapOf, "kube-apiserver"))
	row("etcd memory, peak RSS", -1, mb, summed(rssOf, "etcd"), summed(rssOf, "etcd"))
	draGaveUp, draWaves := sumOver(pairs, gaveUpWaves(false), false), sumOver(pairs, wavesOf(false), false)
	legacyGaveUp, legacyWaves := sumOver(pairs, gaveUpWaves(true), true), sumOver(pairs, wavesOf(true), true)
	fmt.Fprintf(b, "\nWaves that gave up with pods never bound (saturating and steady waves, the churn workload), all runs: DRA %.0f of %.0f, legacy %.0f of %.0f.\n\n",
		draGaveUp, draWaves, legacyGaveUp, legacyWaves)
}

// sumOver is one stack's figure (the legacy stack's when legacy is set) summed
// over the runs.
func sumOver(pairs []repeat, f figure, legacy bool) float64 {
	total := 0.0
	for _, v := range perRun(pairs, f, legacy) {
		total += v
	}
	return total
}

func sizeOrBlank(k int) string {
	switch {
	case k < 0:
		return ""
	case k == 0:
		return "mixed"
	}
	return fmt.Sprint(k)
}

func kindSizes(kinds []kindResult) []int {
	var out []int
	for _, k := range kinds {
		if k.Size > 0 && !slices.Contains(out, k.Size) {
			out = append(out, k.Size)
		}
	}
	sort.Ints(out)
	return out
}

// cpuPerPod is what a scheduled pod costs each process, and how many pods a
// CPU-second of it schedules: the comparison that holds on any machine size.
func (r results) cpuPerPod(b *strings.Builder) {
	pairs := r.pairs()
	b.WriteString("## CPU per scheduled pod, by process (saturating waves; teardown apart)\n\n")
	b.WriteString("CPU time from /proc at the edges of each wave, less the process's background over the same time " +
		"(measured in a quiet window before the waves), per bound pod (median over waves, then over runs); " +
		"pods per CPU-second is its inverse. kwok plays the kubelets and the harness makes the load (and, on the legacy " +
		"stack, plays the topology updater and the kubelet's admission; with -node-path, on the DRA stack, the node path's kubelets), " +
		"and with -node-path the node path's plugins (topodra-kubelet-plugin, their processes summed) run on the same cores: " +
		"each is shown, none is in the total, which is the control plane's.\n\n")
	b.WriteString("The rows \"1, first wave\" are each run's first wave alone: the legacy stack's only wave on fresh NodeResourceTopology " +
		"(its later waves mostly wait for the updater).\n\n")
	b.WriteString("| GPUs | process | DRA ms/pod | legacy ms/pod | DRA pods per CPU-s | legacy pods per CPU-s | teardown DRA ms/pod | teardown legacy ms/pod |\n|---|---|---|---|---|---|---|---|\n")
	for _, k := range append([]int{firstWaveRow}, commonSizes(kindSizes(r.DRA.Kinds))...) {
		procs := map[string]bool{}
		for _, p := range pairs {
			for _, side := range []struct {
				s    *stackResult
				kind string
			}{{&p.DRA, draSaturating}, {p.Legacy, legacySaturating}} {
				m, _ := cpuOfRow(side.s, k, side.kind, false)
				for n := range m {
					procs[n] = true
				}
			}
		}
		names := sortedKeys(procs)
		names = append(names, controlPlaneTotal)
		for _, n := range names {
			cpu := func(kind string, teardown bool) figure { return cpuProc(n, k, kind, teardown) }
			// A process of one stack alone (the topology-aware scheduler) has its
			// own row, with "-" on the other side.
			dra, legacy := overEach(pairs, cpu(draSaturating, false), false), overEach(pairs, cpu(legacySaturating, false), true)
			tdDRA, tdLegacy := overEach(pairs, cpu(draSaturating, true), false), overEach(pairs, cpu(legacySaturating, true), true)
			if dra == nil && legacy == nil {
				continue
			}
			label := fmt.Sprint(k)
			if k == firstWaveRow {
				label = "1, first wave"
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, n, msText(dra), msText(legacy),
				podsPerCPUSecondOf(dra), podsPerCPUSecondOf(legacy), msText(tdDRA), msText(tdLegacy))
		}
	}
	b.WriteString("\n")
}

// firstWaveRow stands for the run's first 1-GPU wave in the CPU table.
const firstWaveRow = -1

// cpuOfRow is CPU ms per pod by process of one row of the CPU table: a size's
// median wave, or (firstWaveRow) the first 1-GPU wave alone.
func cpuOfRow(s *stackResult, row int, kind string, teardown bool) (map[string]float64, bool) {
	size := row
	if row == firstWaveRow {
		size = 1
	}
	x, ok := s.kind(size, kind)
	if !ok {
		return nil, false
	}
	if row == firstWaveRow {
		if len(x.Waves) == 0 {
			return nil, false
		}
		of := func(w waveResult) *cost { return w.Cost }
		if teardown {
			of = func(w waveResult) *cost { return w.Teardown }
		}
		return perPod(x.Waves[:1], of), true
	}
	if teardown {
		return x.TeardownCPUMsPerPod, true
	}
	return x.CPUMsPerPod, true
}

func podsPerCPUSecond(msPerPod float64) string {
	if msPerPod <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", 1000/msPerPod)
}

// whatBound lists, per stack and kind, what held its waves back, and the most
// any component's client rate limiter made requests wait.
func (r results) whatBound(b *strings.Builder) {
	b.WriteString("## What bound each wave (run 1)\n\n| stack | GPUs | kind | bound by (each wave) |\n|---|---|---|---|\n")
	waits := map[string]float64{}
	for _, st := range r.stacks() {
		for _, k := range st.s.Kinds {
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", st.name, sizeText(k.Size), k.Kind, strings.Join(k.BoundBy, "; "))
			for n, w := range k.LimiterWaitSeconds {
				waits[st.name+" "+n] = max(waits[st.name+" "+n], w)
			}
		}
	}
	b.WriteString("\nThe longest a wave's requests waited on a client rate limiter (rest_client_rate_limiter_duration_seconds, summed over requests), by component: ")
	var parts []string
	for _, n := range sortedKeys(waits) {
		parts = append(parts, fmt.Sprintf("%s %.3f s", n, waits[n]))
	}
	if len(parts) == 0 {
		parts = []string{"no component reported its limiter"}
	}
	b.WriteString(strings.Join(parts, ", ") + ".\n\n")
}

// schedulerFigures are the schedulers' own metrics per kind (run 1, median over
// waves): the DRA stack's kube-scheduler and the legacy stack's topology-aware one.
func (r results) schedulerFigures(b *strings.Builder) {
	b.WriteString("## The schedulers' own metrics (run 1, medians over the waves)\n\n")
	b.WriteString("Per bound pod: scheduling attempts (and unschedulable ones), time in the PreFilter, Filter, PreBind and Bind " +
		"extension points; the mean scheduling attempt; the slowest Filter plugin's mean call (sampled by kube-scheduler); " +
		"the most binding goroutines seen; the scheduler's highest Go heap in use (read once a second).\n\n")
	b.WriteString("| stack | GPUs | kind | attempts/pod | unschedulable/pod | attempt mean ms | PreFilter ms/pod | Filter ms/pod | PreBind ms/pod | Bind ms/pod | slowest Filter plugin, mean ms | binding goroutines peak | heap peak |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, st := range r.stacks() {
		sched := "kube-scheduler"
		if st.name == "legacy" {
			sched = topoScheduler
		}
		for _, k := range st.s.Kinds {
			var att, unsched, mean, pre, filt, preBind, bind, peak, heap []float64
			plugin := map[string][]float64{}
			for _, w := range k.Waves {
				if w.Cost == nil || w.Bound == 0 {
					continue
				}
				f, ok := w.Cost.Schedulers[sched]
				if !ok {
					continue
				}
				n := float64(w.Bound)
				tot := 0.0
				for _, v := range f.Attempts {
					tot += v
				}
				att, unsched = append(att, tot/n), append(unsched, f.Attempts["unschedulable"]/n)
				mean = append(mean, f.AttemptMeanMs)
				pre, filt = append(pre, f.ExtensionPointMs["PreFilter"]/n), append(filt, f.ExtensionPointMs["Filter"]/n)
				preBind, bind = append(preBind, f.ExtensionPointMs["PreBind"]/n), append(bind, f.ExtensionPointMs["Bind"]/n)
				peak, heap = append(peak, f.BindingGoroutinesPeak), append(heap, f.HeapPeakBytes)
				for p, v := range f.PluginMeanMs {
					if strings.HasPrefix(p, "Filter/") {
						plugin[p] = append(plugin[p], v)
					}
				}
			}
			if len(att) == 0 {
				continue
			}
			slowest, slowestMs := "-", 0.0
			for p, v := range plugin {
				if m := medianOf(v); m > slowestMs {
					slowest, slowestMs = strings.TrimPrefix(p, "Filter/"), m
				}
			}
			fmt.Fprintf(b, "| %s | %s | %s | %.2f | %.2f | %.1f | %.2f | %.2f | %.2f | %.2f | %s %.2f | %.0f | %s |\n", st.name, sizeText(k.Size), k.Kind,
				medianOf(att), medianOf(unsched), medianOf(mean), medianOf(pre), medianOf(filt), medianOf(preBind), medianOf(bind), slowest, slowestMs,
				medianOf(peak), mib(int64(medianOf(heap))))
		}
	}
	b.WriteString("\n")
}

// requestsPerPod is every client's API requests during the common waves per
// bound pod (from the audit log), both stacks.
func (r results) requestsPerPod(b *strings.Builder) {
	if r.Legacy == nil || r.DRA.PodsBound == 0 || r.Legacy.PodsBound == 0 {
		return
	}
	b.WriteString("## API requests per bound pod, common waves (run 1, audit log)\n\n| client | DRA | legacy |\n|---|---|---|\n")
	per := func(s *stackResult, client string) float64 { return s.RequestsPerPod[client] }
	clients := map[string]bool{}
	for c := range r.DRA.RequestsByClient {
		clients[c] = true
	}
	for c := range r.Legacy.RequestsByClient {
		clients[c] = true
	}
	var dt, lt float64
	for _, c := range sortedKeys(clients) {
		d, l := per(&r.DRA, c), per(r.Legacy, c)
		dt, lt = dt+d, lt+l
		fmt.Fprintf(b, "| %s | %.2f | %.2f |\n", c, d, l)
	}
	fmt.Fprintf(b, "| all | %.2f | %.2f |\n\n", dt, lt)
}

// runs are every run's stacks, the first run first: both stacks where the
// legacy one ran, else DRA alone.
func (r results) runs() []repeat {
	return append([]repeat{{DRA: r.DRA, Legacy: r.Legacy}}, r.Repeats...)
}

// requestSplit is every run's API requests per bound pod over the common
// waves, with Lease renewals and the other periodic requests apart
// (requestShares).
func (r results) requestSplit(b *strings.Builder) {
	b.WriteString("## API requests per bound pod, common waves, every run\n\n" +
		"From the audit log. Lease renewals, and the other requests that grow with the length of the run rather than with its pods " +
		"(node status writes, watch starts, non-resource GETs), are apart.")
	if r.Legacy != nil {
		b.WriteString(" On the legacy stack the rest still holds the simulated topology updater's interval writes " +
			"and the topology-aware scheduler's retries, which the log cannot tell from per-pod work.")
	}
	b.WriteString("\n\n")
	b.WriteString("| run | stack | all | Lease renewals | other periodic | the rest | writes among the rest | NodeResourceTopology writes |\n|---|---|---|---|---|---|---|---|\n")
	for i, run := range r.runs() {
		for _, st := range []namedStack{{"DRA", &run.DRA}, {"legacy", run.Legacy}} {
			if st.s == nil {
				continue
			}
			sh, ok := st.s.requestShares()
			if !ok {
				continue
			}
			fmt.Fprintf(b, "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", i+1, st.name,
				sh.all, sh.leases, sh.periodic, sh.rest, sh.restWrites, sh.nrtWrites)
		}
	}
	b.WriteString("\n")
}
