package main

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

type results struct {
	Nodes         int          `json:"nodes"`
	GPUs          int          `json:"gpus"`
	Waves         int          `json:"waves"`
	Fill          float64      `json:"fill"`
	Machine       string       `json:"machine"`
	APIServerGOGC int          `json:"apiserverGOGC,omitempty"` // 0: GOGC unset
	GoawayChance  float64      `json:"goawayChance,omitempty"`
	Started       time.Time    `json:"started"`
	Seconds       float64      `json:"seconds"`
	DRA           stackResult  `json:"dra"`
	Legacy        *stackResult `json:"legacy,omitempty"`
	LegacySkipped string       `json:"legacySkipped,omitempty"`
	// Repeats are runs 2.. of -runs: the common workload on both stacks again.
	Repeats []repeat `json:"repeats,omitempty"`
	// SteadyRate, ChurnSeconds and ChurnRate are the workload's settings.
	SteadyRate   float64 `json:"steadyRate,omitempty"`
	ChurnSeconds float64 `json:"churnSeconds,omitempty"`
	ChurnRate    float64 `json:"churnRate,omitempty"`
	// KwokLeaseSeconds is the fake nodes' Lease duration where -kwok-lease
	// lengthened it (0: the kubelet's default, 40 s).
	KwokLeaseSeconds int `json:"kwokLeaseSeconds,omitempty"`
	// WaveGapSeconds is the pause after each wave's teardown (-wave-gap; 0: none).
	WaveGapSeconds float64 `json:"waveGapSeconds,omitempty"`
}

// repeat is one more run of both stacks.
type repeat struct {
	DRA    stackResult  `json:"dra"`
	Legacy *stackResult `json:"legacy,omitempty"`
}

func (s stackResult) kind(size int, kind string) (kindResult, bool) {
	for _, k := range s.Kinds {
		if k.Size == size && k.Kind == kind {
			return k, true
		}
	}
	return kindResult{}, false
}

// namedStack is one stack's results with its name in the report.
type namedStack struct {
	name string
	s    *stackResult
}

// stacks lists the stacks that ran: DRA, then legacy unless it was skipped.
func (r *results) stacks() []namedStack {
	out := []namedStack{{"DRA", &r.DRA}}
	if r.Legacy != nil {
		out = append(out, namedStack{"legacy", r.Legacy})
	}
	return out
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

func mibOrDash(m map[string]int64, k string) string {
	if v, ok := m[k]; ok {
		return mib(v)
	}
	return "-"
}

func sizeText(k int) string {
	if k == 0 {
		return "mixed"
	}
	return fmt.Sprint(k)
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// markdown is the report: the DRA stack's waves, the variants, the legacy stack and
// the ratios, memory, requests, and idle requests.
func (r results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Scale run: %d nodes, %d GPUs\n\n", r.Nodes, r.GPUs)
	fmt.Fprintf(&b, "%s; %d waves per row (medians), each asking for %.0f%% of the GPUs; %s in all; %d run(s) of each stack, alternated.\n\n",
		r.Machine, r.Waves, r.Fill*100, time.Duration(r.Seconds*float64(time.Second)).Round(time.Second), 1+len(r.Repeats))
	fmt.Fprintf(&b, "Feature gates: %s. Client QPS of the schedulers, the controller-manager and the harness: %d (burst %d). "+
		"Steady waves at %g pods/s; the churn workload %g s at %g pods/s, sizes 1, 2 and 4 mixed, %.0f%% of the GPUs busy once settled.\n\n",
		orDash(r.DRA.FeatureGates), clientQPS, 2*clientQPS, r.SteadyRate, r.ChurnSeconds, r.ChurnRate, churnBusy*100)
	if r.WaveGapSeconds > 0 {
		fmt.Fprintf(&b, "Each wave's teardown is followed by a pause of %g s before the next wave (-wave-gap).\n\n", r.WaveGapSeconds)
	}
	fmt.Fprintf(&b, "kube-apiserver: %s, %s.\n\n", r.gogcText(), r.goawayText())
	if line := r.schedulersText(); line != "" {
		b.WriteString(line)
	}
	if r.KwokLeaseSeconds > 0 {
		fmt.Fprintf(&b, "kwok's node Leases: %d s, renewed every %d s (a kubelet's: 40 s, every 10 s), the controller-manager's node-monitor grace period raised to %d s (-kwok-lease).\n\n",
			r.KwokLeaseSeconds, r.KwokLeaseSeconds/4, r.KwokLeaseSeconds)
	}

	b.WriteString("## Scheduling, DRA stack (kube-scheduler, topodra slices)\n\n")
	b.WriteString("| GPUs | kind | constraint | pods/s | p50 ms | p99 ms | unscheduled |\n|---|---|---|---|---|---|---|\n")
	for _, k := range r.DRA.Kinds {
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %.0f | %.0f | %.0f |\n", sizeText(k.Size), k.Kind, orDash(k.Attribute), k.PodsPerSec, k.P50Ms, k.P99Ms, k.Unscheduled)
	}
	b.WriteString("\n| ratio | GPUs | value |\n|---|---|---|\n")
	for _, k := range r.DRA.Kinds {
		if k.Kind != "aligned" {
			continue
		}
		if any, ok := r.DRA.kind(k.Size, "any"); ok {
			fmt.Fprintf(&b, "| aligned / unconstrained throughput | %d | %s |\n", k.Size, ratio(k.PodsPerSec, any.PodsPerSec))
		}
		if sh, ok := r.DRA.kind(k.Size, "aligned-shuffled"); ok {
			fmt.Fprintf(&b, "| topodra order / shuffled throughput | %d | %s |\n", k.Size, ratio(k.PodsPerSec, sh.PodsPerSec))
		}
		if l, ok := r.DRA.kind(k.Size, "aligned-list"); ok {
			fmt.Fprintf(&b, "| int / list numaNode throughput | %d | %s |\n", k.Size, ratio(k.PodsPerSec, l.PodsPerSec))
		}
	}
	for _, p := range r.DRA.peerRatios() {
		fmt.Fprintf(&b, "| topodra's slices (before, after) / NVIDIA's plugin's, unconstrained throughput | %d | %s, %s |\n",
			p.size, ratio(p.before, p.nvidia), ratio(p.after, p.nvidia))
	}
	fmt.Fprintf(&b, "\nResourceSlice bytes per GPU: topodra %.0f, NVIDIA's attribute set for the same GPUs %.0f (ratio %s).\n\n",
		r.DRA.SliceBytesPerGPU, r.DRA.NvidiaBytesPerGPU, ratio(r.DRA.SliceBytesPerGPU, r.DRA.NvidiaBytesPerGPU))
	if r.DRA.NvidiaPluginBytesPerGPU > 0 {
		fmt.Fprintf(&b, "The slices NVIDIA's plugin itself published (make bench-node), replicated over the fleet for the peer waves: %.0f bytes per GPU (topodra / NVIDIA %s).\n\n",
			r.DRA.NvidiaPluginBytesPerGPU, ratio(r.DRA.SliceBytesPerGPU, r.DRA.NvidiaPluginBytesPerGPU))
	}

	if r.Legacy != nil {
		b.WriteString("## Scheduling, legacy stack (topology-aware scheduler, NodeResourceTopology)\n\n")
		b.WriteString("| GPUs | kind | pods/s | p50 ms | p99 ms | unscheduled | refused (TopologyAffinityError) |\n|---|---|---|---|---|---|---|\n")
		for _, k := range r.Legacy.Kinds {
			fmt.Fprintf(&b, "| %s | %s | %.1f | %.0f | %.0f | %.0f | %.0f |\n", sizeText(k.Size), k.Kind, k.PodsPerSec, k.P50Ms, k.P99Ms, k.Unscheduled, k.Misaligned)
		}
		b.WriteString("\n")
		r.talkFigures(&b)
		r.cpuPerPod(&b)
		r.requestsPerPod(&b)
	} else {
		fmt.Fprintf(&b, "## Legacy stack\n\nNot run: %s.\n\n", r.LegacySkipped)
	}
	r.requestSplit(&b)
	r.nodePathSection(&b)
	r.attributeSetSection(&b)
	r.whatBound(&b)
	r.schedulerFigures(&b)

	b.WriteString("## Memory (peak RSS and Go heap in use during the common waves; RSS in the DRA-only waves, at the start and the end of the idle period)\n\n" +
		"| stack | component | RSS peak | Go heap peak | RSS peak, DRA-only waves | idle start | idle end |\n|---|---|---|---|---|---|---|\n")
	for _, st := range r.stacks() {
		for _, name := range sortedKeys(st.s.MemoryPeak) {
			heap := "-"
			if h, ok := st.s.GoHeapPeak[name]; ok {
				heap = mib(int64(h))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", st.name, name, mib(st.s.MemoryPeak[name]), heap,
				mibOrDash(st.s.MemoryPeakDRAOnly, name), mibOrDash(st.s.MemoryIdleStart, name), mibOrDash(st.s.MemoryIdle, name))
		}
	}

	b.WriteString("\n## API server: CPU and Go heap\n\n| stack | CPU s, waves | CPU s, idle | Go heap in use, end of waves | Go heap in use, end of idle |\n|---|---|---|---|---|\n")
	for _, st := range r.stacks() {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %s | %s |\n", st.name, st.s.APIServerCPU["waves"], st.s.APIServerCPU["idle"],
			mib(int64(st.s.GoHeap["kube-apiserver"])), mib(int64(st.s.GoHeapIdle["kube-apiserver"])))
	}

	b.WriteString("\n## Requests during the DRA stack's common waves, by client (API server audit log)\n\n| client | verb resource | count |\n|---|---|---|\n")
	for _, c := range sortedKeys(r.DRA.RequestsByClient) {
		for _, vr := range sortedKeys(r.DRA.RequestsByClient[c]) {
			fmt.Fprintf(&b, "| %s | %s | %d |\n", c, vr, r.DRA.RequestsByClient[c][vr])
		}
	}
	fmt.Fprintf(&b, "\n## Idle for %.0f s: requests by client\n\n| stack | client | writes (not Leases) | Lease writes | LISTs | all |\n|---|---|---|---|---|---|\n", r.DRA.IdleSeconds)
	for _, st := range r.stacks() {
		clients := sortedKeys(st.s.IdleByClient)
		if st.name == "DRA" {
			// topodra's own components appear even when they sent nothing.
			for _, ours := range []string{"topodra-controller", "topodra-kubelet-plugin"} {
				if _, ok := st.s.IdleByClient[ours]; !ok {
					clients = append(clients, ours)
				}
			}
		}
		for _, c := range clients {
			w, lw, l := writesAndLists(st.s.IdleByClient[c])
			all := 0
			for _, n := range st.s.IdleByClient[c] {
				all += n
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d |\n", st.name, c, w, lw, l, all)
		}
	}
	if p := r.DRA.Plugins; p != nil {
		fmt.Fprintf(&b, "\n## topodra's kubelet plugins\n\n%d real plugin processes, one per node: all slices published %.1f s after they started; "+
			"resident memory %s in all, %s the largest, at the end of the idle period.\n\n| startup requests (all plugins) | count |\n|---|---|\n",
			p.Count, p.StartSeconds, mib(p.RSSTotal), mib(p.RSSLargest))
		for _, vr := range sortedKeys(p.Startup) {
			fmt.Fprintf(&b, "| %s | %d |\n", vr, p.Startup[vr])
		}
	}
	if w := r.DRA.ControllerWaves; w != nil && r.DRA.PodsBound > 0 {
		writes := 0.0
		for k, v := range w {
			if strings.HasPrefix(k, "topodra_controller_writes_total") {
				writes += v
			}
		}
		fmt.Fprintf(&b, "\ntopodra's controller over the common waves: %.0f writes for %d bound pods, %.3f a pod (its own counter: NodeResourceTopology writes and Events together).\n",
			writes, r.DRA.PodsBound, writes/float64(r.DRA.PodsBound))
	}
	if line := controllerWritesLine(&r.DRA); line != "" {
		b.WriteString("\n" + line)
	}
	b.WriteString(controllerWritesByKind(&r.DRA))
	if m := r.DRA.ControllerMetrics; m != nil {
		b.WriteString("\n## topodra's controller\n\n| metric | value |\n|---|---|\n")
		for _, k := range sortedKeys(m) {
			if strings.Contains(k, "writes") || strings.Contains(k, "api_requests") || strings.HasPrefix(k, "topodra_controller_nodes ") {
				fmt.Fprintf(&b, "| `%s` | %.0f |\n", k, m[k])
			}
		}
	}
	for _, st := range []*stackResult{&r.DRA, r.Legacy} {
		if st == nil {
			continue
		}
		for _, n := range st.Notes {
			fmt.Fprintf(&b, "\nNote: %s\n", n)
		}
	}
	return b.String()
}

// peerWaves are the peer waves of one size: unconstrained throughput on
// topodra's slices before and after NVIDIA's plugin's, and on NVIDIA's.
type peerWaves struct {
	size                  int
	before, after, nvidia float64
}

// peerRatios lists the sizes with peer waves, in run order.
func (s stackResult) peerRatios() []peerWaves {
	var out []peerWaves
	for _, k := range s.Kinds {
		if k.Kind != "any-nvidia" {
			continue
		}
		a, okA := s.kind(k.Size, "any-topodra-a")
		b, okB := s.kind(k.Size, "any-topodra-b")
		if okA && okB {
			out = append(out, peerWaves{k.Size, a.PodsPerSec, b.PodsPerSec, k.PodsPerSec})
		}
	}
	return out
}

func (r results) gogcText() string {
	if r.APIServerGOGC == 0 {
		return "GOGC unset (100)"
	}
	return fmt.Sprintf("GOGC=%d", r.APIServerGOGC)
}

func (r results) goawayText() string {
	if r.GoawayChance == 0 {
		return "--goaway-chance off"
	}
	return fmt.Sprintf("--goaway-chance=%g", r.GoawayChance)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// schedulersText names each stack's scheduler and its release, where the run
// recorded them (runs before the record have none).
func (r results) schedulersText() string {
	var names []string
	for _, s := range []*stackResult{&r.DRA, r.Legacy} {
		if s != nil && s.Scheduler != "" {
			names = append(names, s.Scheduler)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return "Schedulers (--version): " + strings.Join(names, "; ") + ".\n\n"
}
