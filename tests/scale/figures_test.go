package main

// The figures that README.md ("Numbers") and docs/benchmarks.md (the talk's
// figures at 100 and 500 nodes) quote from the committed results under
// docs/benchmarks are recomputed here from those results, so that no table or
// verdict drifts from its data.
//
// How it works. A region of a document that this test owns is framed by
//
//	<!-- figures: NAME -->
//	...
//	<!-- figures: end -->
//
// Inside a region every number is a checked figure. Each block (a table row, a
// paragraph, a list item) names its figures, in the order they appear, in a
// comment anywhere in the block:
//
//	| scheduler memory | 1.05 (0.89–1.15) | 1.68 <!-- fig: s100.schedAlone s100.schedAlone.range s500.schedAlone --> |
//
// Each key is computed in committedFigures from the JSON, with the report's own
// helpers (talk.go, audit.go, report.go), and formatted as the docs print it. A
// key's text must appear in its block after the previous key's text, and every
// number in the block must lie inside one of those texts. A few keys are words
// ("before", "no LIST and no write"): the data decides them too. Numbers in
// code spans, link targets and comments are not figures; a number that is not
// from the data (a claim size in a row's name) is spelled out in words.
//
// To change a figure, change the data (commit a new run): the test names the
// text it now expects. To quote a new one, add its key in committedFigures and
// name the key in the block. TestFigureCheckCatchesHandEdits shows what fails.
// `go test -run TestFiguresFollowTheData -v` lists every key and its text.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// figureDocs are the documents, from the repository root, and the regions of
// each that this test owns; each must be there.
var figureDocs = map[string][]string{
	"README.md":          {"readme-numbers"},
	"docs/benchmarks.md": {"bench-reorganisation", "bench-100", "bench-500", "bench-500-verdicts", "bench-controller-writes", "bench-attribute-sets"},
}

const repoRoot = "../.."

// The architecture reorganisation (the driver's crates under driver/, the
// plugin and the controller as libraries behind thin mains): the docs say that
// every committed run predates it. Without git (an exported tree, a shallow
// clone) the test takes these for granted and says so.
const (
	reorganisation      = "bdafbd7"
	reorganisationFiles = 248
)

var reorganisationDate = time.Date(2026, 12, 5, 0, 10, 32, 0, time.UTC)

// The talk's own figures, which no run here measured: what the docs compare
// with. DRA against legacy: scheduling throughput 2 times, scheduler memory
// from 1.3 GB to 1.0 GB, API server memory 0.8.
const (
	talkThroughput    = 2.0
	talkSchedulerFrom = 1.3
	talkSchedulerTo   = 1.0
	talkAPIServer     = 0.8
)

// nodePath is the part of make bench-node's node-path.json (written by
// tests/nodebench) that the README quotes: topodra's ratios to each driver
// and each driver's idle RSS.
type nodePath struct {
	Date    time.Time                     `json:"date"`
	Ratios  map[string]map[string]float64 `json:"ratios"`
	Drivers []struct {
		Driver struct {
			Key string `json:"key"`
		} `json:"driver"`
		RSSIdleKiB float64 `json:"rssIdleKiB"`
	} `json:"drivers"`
}

// loader reads a committed result by file name; tests give a doctored one.
type loader func(t testing.TB, name string) []byte

func committed(t testing.TB, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs/benchmarks", name))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func decode[T any](t testing.TB, load loader, name string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(load(t, name), &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// figures maps a key to the text the docs print for it.
type figures map[string]string

func (f figures) set(t testing.TB, key, text string) {
	t.Helper()
	if _, dup := f[key]; dup {
		t.Fatalf("figure %s defined twice", key)
	}
	f[key] = text
}

// Formats, as the docs write numbers.

func fixed(digits int) func(float64) string {
	return func(v float64) string { return strconv.FormatFloat(v, 'f', digits, 64) }
}

// whole is an integer with thousands separators: 1,019.
func whole(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ratioText: 37, 6.04, 0.58, 0.0015.
func ratioText(v float64) string {
	switch {
	case v >= 10:
		return whole(v)
	case v >= 0.1:
		return fixed(2)(v)
	}
	return strconv.FormatFloat(v, 'g', 2, 64)
}

// seconds is a duration of a second or more: 2.8 s, 111 s.
func seconds(ms float64) string {
	if ms < 9950 {
		return fixed(1)(ms/1000) + " s"
	}
	return whole(ms/1000) + " s"
}

// duration is milliseconds below a second, else seconds.
func duration(ms float64) string {
	if math.Round(ms) < 1000 {
		return whole(ms) + " ms"
	}
	return seconds(ms)
}

// durations are one figure by size, or p50 and p99: "29 / 29 / 33 ms", or
// each with its unit where one is a second or more: "2.8 s / 46 s / 43 s".
func durations(ms ...float64) string {
	short := true
	for _, v := range ms {
		short = short && math.Round(v) < 1000
	}
	var parts []string
	for _, v := range ms {
		if short {
			parts = append(parts, whole(v))
		} else {
			parts = append(parts, duration(v))
		}
	}
	if short {
		return strings.Join(parts, " / ") + " ms"
	}
	return strings.Join(parts, " / ")
}

// durationRange is the lowest and highest: "27–39 ms", "11 ms–44 s", "31–111 s".
func durationRange(vs []float64) string {
	lo, hi := slices.Min(vs), slices.Max(vs)
	switch {
	case math.Round(hi) < 1000:
		return whole(lo) + "–" + whole(hi) + " ms"
	case math.Round(lo) >= 1000:
		return strings.TrimSuffix(seconds(lo), " s") + "–" + seconds(hi)
	}
	return duration(lo) + "–" + duration(hi)
}

// span is the lowest and highest of vs in format f, one value where both print alike.
func span(vs []float64, f func(float64) string) string {
	lo, hi := f(slices.Min(vs)), f(slices.Max(vs))
	if lo == hi {
		return lo
	}
	return lo + "–" + hi
}

func joined(vs []float64, f func(float64) string) string {
	var parts []string
	for _, v := range vs {
		parts = append(parts, f(v))
	}
	return strings.Join(parts, " / ")
}

func mibText(bytes float64) string { return whole(bytes/(1<<20)) + " MiB" }

func msOne(v float64) string { return fixed(1)(v) + " ms" }

// talkSizes are the claim sizes both stacks run, in the order the docs list them.
var talkSizes = []int{1, 2, 4}

// bySize is a figure of each of talkSizes, read from one kind.
func bySize(kind string, f func(kindResult) float64) []figure {
	var out []figure
	for _, k := range talkSizes {
		out = append(out, kindFigure(k, kind, f))
	}
	return out
}

// spreads is over() of each figure; it fails where no run has one.
func spreads(t testing.TB, pairs []repeat, dra, legacy []figure) []spread {
	t.Helper()
	var out []spread
	for i := range dra {
		sp, ok := over(pairs, dra[i], legacy[i])
		if !ok {
			t.Fatalf("figure %d of %d: no run has it", i+1, len(dra))
		}
		out = append(out, sp)
	}
	return out
}

func one(t testing.TB, pairs []repeat, dra, legacy figure) spread {
	t.Helper()
	return spreads(t, pairs, []figure{dra}, []figure{legacy})[0]
}

// everyRun is one stack's figures in every run, for their lowest and highest.
func everyRun(pairs []repeat, fs []figure, legacy bool) []float64 {
	var out []float64
	for _, f := range fs {
		out = append(out, perRun(pairs, f, legacy)...)
	}
	return out
}

func of(sps []spread, f func(spread) float64) []float64 {
	var out []float64
	for _, sp := range sps {
		out = append(out, f(sp))
	}
	return out
}

func draOf(s spread) float64    { return s.dra }
func legacyOf(s spread) float64 { return s.legacy }
func ratioOf(s spread) float64  { return s.ratio }

// rangeText is a spread's per-run ratios, lowest and highest.
func (sp spread) rangeText() string { return ratioText(sp.lo) + "–" + ratioText(sp.hi) }

// committedFigures computes every figure the docs' regions quote.
func committedFigures(t testing.TB, load loader) figures {
	t.Helper()
	f := figures{}
	s100 := decode[results](t, load, "scale-100-fair.json")
	s500 := decode[results](t, load, "scale-500-fair.json")
	idle := decode[results](t, load, "tuning-default.json")
	np := decode[nodePath](t, load, "node-path.json")

	scaleFigures(t, f, "s100", s100)
	scaleFigures(t, f, "s500", s500)
	// The paced controller's writes in the first DRA run of each.
	for _, r := range []struct {
		prefix string
		res    results
	}{{"s100.cw", s100}, {"s500.cw", s500}} {
		if r.res.DRA.ControllerUntilSettled != nil {
			controllerWriteFigures(t, f, r.prefix, results{Nodes: r.res.Nodes, DRA: r.res.DRA})
		}
	}

	// The simulated topology updater, as each legacy run's note records it.
	interval, onAdmission := "", ""
	for _, r := range []results{s100, s500} {
		for _, p := range r.pairs() {
			for _, n := range p.Legacy.Notes {
				m := regexp.MustCompile(`interval (\S+), only changed nodes; on admissions too: (\w+)`).FindStringSubmatch(n)
				if m == nil {
					continue
				}
				d, err := time.ParseDuration(m[1])
				if err != nil {
					t.Fatal(err)
				}
				iv, adm := strconv.FormatFloat(d.Seconds(), 'f', -1, 64), "and on admissions"
				if m[2] != "true" {
					adm = "and not on admissions"
				}
				if interval != "" && (iv != interval || adm != onAdmission) {
					t.Fatalf("the runs' updaters differ: %s %q against %s %q", iv, adm, interval, onAdmission)
				}
				interval, onAdmission = iv, adm
			}
		}
	}
	if interval == "" {
		t.Fatal("no legacy run notes its updater's interval")
	}
	f.set(t, "updater.interval", interval)
	f.set(t, "updater.onAdmission", onAdmission)

	// The machine: "2 CPUs, 24683784 kB memory".
	cores, _, _ := strings.Cut(s100.Machine, " CPUs")
	f.set(t, "machine.cores", cores)

	// Ten minutes idle at 50 nodes with real plugin processes (the tuning
	// runs' default): what topodra's components sent.
	if idle.DRA.Plugins == nil {
		t.Fatal("tuning-default.json: no plugin processes")
	}
	f.set(t, "idle.minutes", whole(idle.DRA.IdleSeconds/60))
	f.set(t, "idle.nodes", strconv.Itoa(idle.Nodes))
	f.set(t, "idle.plugins", strconv.Itoa(idle.DRA.Plugins.Count))
	lists, writes := 0, 0
	for _, c := range []string{"topodra-controller", "topodra-kubelet-plugin"} {
		w, lw, l := writesAndLists(idle.DRA.IdleByClient[c])
		lists, writes = lists+l, writes+w+lw
	}
	verdict := "no LIST and no write"
	if lists+writes > 0 {
		verdict = fmt.Sprintf("%d LISTs and %d writes", lists, writes)
	}
	f.set(t, "idle.verdict", verdict)

	// The node path (one committed run): topodra against the other drivers with
	// their client limiters lifted.
	for _, d := range []struct{ key, driver string }{{"example", "example-unthrottled"}, {"nvidia", "nvidia-unthrottled"}} {
		r, ok := np.Ratios[d.driver]
		if !ok {
			t.Fatalf("node-path.json: no ratios to %s", d.driver)
		}
		f.set(t, "node."+d.key+".prepare", joined([]float64{r["prepare_p50_1gpu"], r["prepare_p50_4gpu"], r["prepare_p50_8gpu"]}, fixed(2)))
		f.set(t, "node."+d.key+".rss", whole(nodeRSSMiB(t, np, d.driver)))
	}
	f.set(t, "node.topodra.rss", whole(nodeRSSMiB(t, np, "topodra")))

	// The controller's NodeResourceTopology writes, paced (runs at the commit that
	// paced them, DRA stack alone): per pod, by the audit log, until no node waited.
	for _, cw := range controllerWriteRuns {
		controllerWriteFigures(t, f, cw.prefix, decode[results](t, load, cw.file))
	}
	// The 2,000-node run with the earlier default of one write a second, which
	// passed a tenth of a write a pod and so moved the default.
	controllerWriteFigures(t, f, "cw2000x1", decode[results](t, load, "controller-writes-2000-one-a-second.json"))
	// The attribute sets under one kube-scheduler (-attribute-sets, 500 nodes).
	attributeSetKeys(t, f, "as500", decode[results](t, load, "attribute-sets-500.json"))

	// The peer waves (run 1 of the 100-node runs): topodra's slices before and
	// after NVIDIA's plugin's, against them.
	var peer []float64
	for _, p := range s100.DRA.peerRatios() {
		peer = append(peer, p.before/p.nvidia, p.after/p.nvidia)
	}
	if len(peer) == 0 {
		t.Fatal("scale-100-fair.json: no peer waves")
	}
	f.set(t, "peer.range", span(peer, fixed(2)))

	// The talk's figures.
	f.set(t, "talk.throughput", strconv.FormatFloat(talkThroughput, 'f', -1, 64))
	f.set(t, "talk.schedFrom", fixed(1)(talkSchedulerFrom))
	f.set(t, "talk.schedTo", fixed(1)(talkSchedulerTo))
	f.set(t, "talk.sched", ratioText(talkSchedulerTo/talkSchedulerFrom))
	f.set(t, "talk.apiserver", fixed(1)(talkAPIServer))

	// When each run quoted was made, against the reorganisation.
	files, date := reorganisationFiles, reorganisationDate
	if out, err := exec.Command("git", "-C", repoRoot, "show", "--shortstat", "--format=%cI", reorganisation).Output(); err != nil {
		t.Logf("git show %s: %v; taking %d files and %s as recorded here", reorganisation, err, files, date)
	} else {
		lines := strings.Fields(string(out))
		if len(lines) < 3 || lines[2] != "files" {
			t.Fatalf("git show --shortstat %s: %q", reorganisation, out)
		}
		if date, err = time.Parse(time.RFC3339, lines[0]); err != nil {
			t.Fatal(err)
		}
		if files, err = strconv.Atoi(lines[1]); err != nil {
			t.Fatal(err)
		}
	}
	f.set(t, "reorg.files", strconv.Itoa(files))
	// Every scale run (scale-*.json, tuning-*.json) and the node path's.
	ends := map[string]time.Time{"node-path.json": np.Date}
	runs, err := filepath.Glob(filepath.Join(repoRoot, "docs/benchmarks", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range runs {
		name := filepath.Base(p)
		if !strings.HasPrefix(name, "scale-") && !strings.HasPrefix(name, "tuning-") {
			continue
		}
		r := decode[results](t, load, name)
		ends[name] = r.Started.Add(time.Duration(r.Seconds * float64(time.Second)))
	}
	// The fair runs, re-run after it, and every other run: each group is
	// "before" or "after" only where all of its runs are.
	fair := map[string]bool{"scale-100-fair.json": true, "scale-500-fair.json": true}
	whenOf := func(inGroup func(string) bool) string {
		before, after := 0, 0
		for _, name := range sortedKeys(ends) {
			if !inGroup(name) {
				continue
			}
			if end := ends[name]; !end.IsZero() && end.Before(date) {
				before++
			} else {
				t.Logf("%s: run ended %s, not before %s (%s)", name, end, reorganisation, date)
				after++
			}
		}
		switch {
		case after == 0:
			return "before"
		case before == 0:
			return "after"
		}
		return "partly before and partly after"
	}
	f.set(t, "reorg.fair", whenOf(func(name string) bool { return fair[name] }))
	f.set(t, "reorg.others", whenOf(func(name string) bool { return !fair[name] }))
	return f
}

// controllerWriteRuns are the committed runs of the paced controller (their names
// keep them out of the reorganisation check above: they were made after it).
var controllerWriteRuns = []struct {
	prefix, file string
	// atDefaults: the run had the controller's pacing defaults of today; the
	// others ran with one write a second, the default before (docs/benchmarks.md
	// says which is which).
	atDefaults bool
}{
	{"cw100", "controller-writes-100.json", true},
	{"cw500", "controller-writes-500.json", false},
	{"cw2000", "controller-writes-2000.json", true},
}

func controllerWriteFigures(t testing.TB, f figures, prefix string, r results) {
	t.Helper()
	k := func(name string) string { return prefix + "." + name }
	s := r.DRA
	if s.PodsBound == 0 || s.ControllerUntilSettled == nil {
		t.Fatalf("%s: no bound pods or no count until settled", prefix)
	}
	if s.ControllerStillWaiting > 0 {
		t.Fatalf("%s: %d nodes still waited for a write: the count is not until settled", prefix, s.ControllerStillWaiting)
	}
	w := controllerWritesOf(s.ControllerUntilSettled)
	f.set(t, k("nodes"), whole(float64(r.Nodes)))
	f.set(t, k("pods"), whole(float64(s.PodsBound)))
	f.set(t, k("writes"), whole(float64(w.NRT)))
	f.set(t, k("perPod"), fixed(3)(float64(w.NRT)/float64(s.PodsBound)))
	waves := controllerWritesOf(s.RequestsByClient["topodra-controller"])
	f.set(t, k("waves.writes"), whole(float64(waves.NRT)))
	f.set(t, k("waves.perPod"), fixed(3)(float64(waves.NRT)/float64(s.PodsBound)))
	f.set(t, k("tail"), whole(float64(w.NRT-waves.NRT))) // after the waves, until none waited
	f.set(t, k("tail.perPod"), fixed(3)(float64(w.NRT-waves.NRT)/float64(s.PodsBound)))
	f.set(t, k("settle"), whole(s.ControllerSettleSeconds)+" s")
	n, mean, p50, p99 := writeLag(s.ControllerWaves)
	if n == 0 {
		t.Fatalf("%s: no write lag histogram", prefix)
	}
	f.set(t, k("lag.mean"), whole(mean)+" s")
	f.set(t, k("lag.p50"), whole(p50)+" s")
	f.set(t, k("lag.p99"), whole(p99)+" s")
	f.set(t, k("bound"), whole(stalenessBound(r.Nodes, s.ControllerPacing).Seconds())+" s")
	f.set(t, k("budget"), strconv.FormatFloat(s.ControllerPacing.writesPerSecond(), 'f', -1, 64))
	if s.NodePath != nil && s.NodePath.WavesSeconds > 0 {
		// The waves' window (the audit window of "during the waves"): the rate
		// the machine bound pods at, and the controller's writes a second in it.
		secs := s.NodePath.WavesSeconds
		f.set(t, k("waves.seconds"), whole(secs)+" s")
		f.set(t, k("waves.podsPerSec"), fixed(1)(float64(s.PodsBound)/secs))
		f.set(t, k("waves.writesPerSec"), fixed(2)(float64(waves.NRT)/secs))
	}
	if s.NodePath != nil {
		nodePathKeys(t, f, prefix+".np", s, r.Nodes)
	}
	// By workload, where the run counted them (PREFIX.kind.LABEL.SIZE.*, SIZE "mixed"
	// for the churn), and the fake nodes' Lease where the run lengthened it.
	for _, kr := range s.Kinds {
		if kr.NRTWrites == nil || kr.WindowSeconds <= 0 {
			continue
		}
		bound := kr.bound()
		kk := func(name string) string { return k("kind." + kr.Kind + "." + sizeText(kr.Size) + "." + name) }
		f.set(t, kk("pods"), whole(float64(bound)))
		f.set(t, kk("writes"), whole(float64(*kr.NRTWrites)))
		f.set(t, kk("perPod"), fixed(3)(float64(*kr.NRTWrites)/float64(bound)))
		f.set(t, kk("writesPerSec"), fixed(2)(float64(*kr.NRTWrites)/kr.WindowSeconds))
		f.set(t, kk("podsPerSec"), fixed(1)(float64(bound)/kr.WindowSeconds))
		if kr.Rate > 0 {
			f.set(t, kk("rate"), whole(kr.Rate))
		}
	}
	f.set(t, k("podsPerNode"), fixed(1)(float64(s.PodsBound)/float64(r.Nodes)))
	if r.KwokLeaseSeconds > 0 {
		f.set(t, k("kwokLease"), whole(float64(r.KwokLeaseSeconds))+" s")
	}
}

// stalenessBound is docs/controller.md's bound on how long an object trails its
// node ("How stale an object can be") with the pacing the run had: write delay +
// node interval + one turn of the budget for every node of the fleet.
func stalenessBound(nodes int, pacing *controllerPacing) time.Duration {
	p := pacing.orBefore()
	return time.Duration((p.WriteDelaySeconds + p.NodeIntervalSeconds + float64(nodes)/p.WritesPerSecond) * float64(time.Second))
}

// controllerDefaults is the pacing the controller's flags default to, read from
// their source, so that a change of default finds the committed runs that no
// longer show it.
func controllerDefaults(t testing.TB) controllerPacing {
	t.Helper()
	src := readDoc(t, "controller/src/args.rs")
	def := func(field string) float64 {
		m := regexp.MustCompile(`default_value_t = ([0-9_.]+)\s*\)\]\s*pub\(crate\) ` + field + `:`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("controller/src/args.rs: no default for %s", field)
		}
		v, err := strconv.ParseFloat(strings.ReplaceAll(m[1], "_", ""), 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return controllerPacing{
		WriteDelaySeconds:   def("write_delay_milliseconds") / 1000,
		NodeIntervalSeconds: def("nrt_node_interval_seconds"),
		WritesPerSecond:     def("nrt_writes_per_second"),
	}
}

// attributeSetKeys are a -attribute-sets run's figures per set (lean-a, full,
// nvidia, lean-b): bytes a GPU, kube-scheduler CPU a pod in the 1-GPU
// unconstrained and aligned waves, and the heap floors of the scheduler and the
// API server, keyed PREFIX.SET.NAME.
func attributeSetKeys(t testing.TB, f figures, prefix string, r results) {
	t.Helper()
	s := r.DRA
	if len(s.AttributeSets) == 0 {
		t.Fatalf("%s: no attribute sets", prefix)
	}
	f.set(t, prefix+".nodes", whole(float64(r.Nodes)))
	bytes := map[string]float64{}
	for _, set := range s.AttributeSets {
		bytes[set.Set] = set.BytesPerGPU
	}
	f.set(t, prefix+".bytesFullOverLean", whole(bytes["full"]-bytes["lean-a"]))
	for _, set := range s.AttributeSets {
		k := func(name string) string { return prefix + "." + set.Set + "." + name }
		f.set(t, k("bytes"), whole(set.BytesPerGPU))
		for _, kind := range []string{"any", "aligned"} {
			if kr, ok := s.kind(1, kind+"-"+set.Set); ok {
				f.set(t, k("cpu."+kind), fixed(2)(kr.CPUMsPerPod["kube-scheduler"])+" ms")
			}
		}
		for component, name := range map[string]string{"kube-scheduler": "sched", "kube-apiserver": "api"} {
			if v := set.GoHeapFloor[component]; v > 0 {
				f.set(t, k("floor."+name), mibText(v))
			}
		}
	}
}

// nodePathKeys are a run's node path (-node-path), recomputed from its
// pod counts and the audit counts by client.
func nodePathKeys(t testing.TB, f figures, prefix string, s stackResult, fleetNodes int) {
	t.Helper()
	k := func(name string) string { return prefix + "." + name }
	np := s.NodePath
	if np.Pods == 0 {
		t.Fatalf("%s: no pod on the node path", prefix)
	}
	f.set(t, k("nodes"), whole(float64(np.Nodes)))
	f.set(t, k("pods"), whole(float64(np.Pods)))
	f.set(t, k("prepared"), whole(float64(np.Prepared)))
	f.set(t, k("unprepared"), whole(float64(np.Unprepared)))
	f.set(t, k("errors"), whole(float64(np.PrepareErrors+np.UnprepareErrors+np.Unsettled)))
	f.set(t, k("cutShort"), whole(float64(np.CutShort)))
	f.set(t, k("devices"), whole(float64(np.Devices)))
	f.set(t, k("allocated"), whole(float64(np.Allocated)))
	f.set(t, k("prepare.p50"), fixed(1)(np.Prepare.P50Ms)+" ms")
	f.set(t, k("prepare.p99"), fixed(1)(np.Prepare.P99Ms)+" ms")
	f.set(t, k("unprepare.p50"), fixed(1)(np.Unprepare.P50Ms)+" ms")
	per := s.nodePathPerPod()
	f.set(t, k("kubelet.perPod"), fixed(2)(per[kubeletClient]))
	f.set(t, k("plugin.perPod"), fixed(2)(per[pluginClient]))
	for _, r := range topodraRequests(&s, fleetNodes) {
		if r.Process == pluginClient && r.Request == "watch resourceslices" {
			f.set(t, k("plugin.watch.perNodeHour"), fixed(1)(r.PerNodeHour))
		}
	}
	sh, ok := s.requestShares()
	if !ok {
		t.Fatalf("%s: no bound pod", prefix)
	}
	f.set(t, k("all.perPod"), fixed(1)(sh.all)) // requestShares are per bound pod
	every, ok := s.allPerPodEveryNodePath()
	if !ok {
		t.Fatalf("%s: no requests per pod with every node path", prefix)
	}
	f.set(t, k("all.perPod.every"), fixed(1)(every))
}

func nodeRSSMiB(t testing.TB, np nodePath, driver string) float64 {
	t.Helper()
	for _, d := range np.Drivers {
		if d.Driver.Key == driver {
			return d.RSSIdleKiB / 1024
		}
	}
	t.Fatalf("node-path.json: no driver %q", driver)
	return 0
}

// scaleFigures are the figures of one scale run, keyed prefix.NAME: with
// several runs, "NAME.range" is the range of the per-run ratios, and the
// medians are over the runs.
func scaleFigures(t testing.TB, f figures, prefix string, r results) {
	t.Helper()
	pairs := r.pairs()
	if len(pairs) == 0 {
		t.Fatalf("%s: no run of both stacks", prefix)
	}
	several := len(pairs) > 1
	k := func(name string) string { return prefix + "." + name }
	f.set(t, k("nodes"), strconv.Itoa(r.Nodes))
	f.set(t, k("gpus"), whole(float64(r.GPUs)))
	f.set(t, k("runs"), strconv.Itoa(len(pairs)))
	f.set(t, k("rate"), strconv.FormatFloat(r.SteadyRate, 'f', -1, 64))
	f.set(t, k("churnRate"), strconv.FormatFloat(r.ChurnRate, 'f', -1, 64))
	f.set(t, k("churnPods"), whole(r.ChurnSeconds*r.ChurnRate))
	ratio := func(name string, sp spread) {
		f.set(t, k(name), ratioText(sp.ratio))
		if several {
			f.set(t, k(name+".range"), sp.rangeText())
		}
	}

	// The first 1-GPU wave: the legacy stack's only one on fresh objects.
	fresh := one(t, pairs, firstWavePodsPerSec(draSaturating), firstWavePodsPerSec(legacySaturating))
	ratio("fresh", fresh)
	f.set(t, k("fresh.dra"), fixed(1)(fresh.dra))
	f.set(t, k("fresh.legacy"), fixed(1)(fresh.legacy))
	if several {
		f.set(t, k("fresh.dra.runs"), joined(perRun(pairs, firstWavePodsPerSec(draSaturating), false), fixed(1)))
		f.set(t, k("fresh.legacy.runs"), joined(perRun(pairs, firstWavePodsPerSec(legacySaturating), true), fixed(1)))
	}

	// Latency at a steady rate by size, and under churn: medians, and where
	// there are several runs the lowest and highest of any size and run.
	churn := map[string]spread{}
	for _, p := range []struct {
		name string
		of   func(kindResult) float64
	}{{"p50", p50Of}, {"p99", p99Of}} {
		dra, legacy := bySize(draSteady, p.of), bySize(legacySteady, p.of)
		sps := spreads(t, pairs, dra, legacy)
		f.set(t, k("steady."+p.name+".dra"), durations(of(sps, draOf)...))
		f.set(t, k("steady."+p.name+".legacy"), durations(of(sps, legacyOf)...))
		c := kindFigure(0, churnKindName, p.of)
		churn[p.name] = one(t, pairs, c, c)
		f.set(t, k("churn."+p.name+".dra"), duration(churn[p.name].dra))
		f.set(t, k("churn."+p.name+".legacy"), duration(churn[p.name].legacy))
		if several {
			f.set(t, k("steady."+p.name+".dra.range"), durationRange(everyRun(pairs, dra, false)))
			f.set(t, k("steady."+p.name+".legacy.range"), durationRange(everyRun(pairs, legacy, true)))
			f.set(t, k("steady."+p.name+".legacy.max"), duration(slices.Max(everyRun(pairs, legacy, true))))
			f.set(t, k("churn."+p.name+".dra.range"), durationRange(perRun(pairs, c, false)))
			f.set(t, k("churn."+p.name+".legacy.range"), durationRange(perRun(pairs, c, true)))
			var runs []string
			for _, v := range perRun(pairs, c, true) {
				runs = append(runs, duration(v))
			}
			f.set(t, k("churn."+p.name+".legacy.runs"), strings.Join(runs, ", "))
		}
	}
	f.set(t, k("churn.dra"), durations(churn["p50"].dra, churn["p99"].dra))
	f.set(t, k("churn.legacy"), durations(churn["p50"].legacy, churn["p99"].legacy))

	// Saturating waves back to back: the median wave of each size.
	sat := spreads(t, pairs, bySize(draSaturating, podsPerSecOf), bySize(legacySaturating, podsPerSecOf))
	f.set(t, k("b2b.dra"), joined(of(sat, draOf), fixed(1)))
	f.set(t, k("b2b.legacy"), joined(of(sat, legacyOf), fixed(1)))
	f.set(t, k("b2b"), joined(of(sat, ratioOf), ratioText))
	f.set(t, k("b2b.span"), span(of(sat, ratioOf), ratioText))
	f.set(t, k("b2b.small"), span(of(sat[:2], ratioOf), ratioText))
	f.set(t, k("b2b.four"), ratioText(sat[2].ratio))
	if several {
		var parts []string
		for _, sp := range sat {
			parts = append(parts, sp.rangeText())
		}
		f.set(t, k("b2b.range"), strings.Join(parts, ", "))
	}

	// Waves that gave up with pods never bound; pods the simulated kubelet refused.
	gave := func(legacy bool) string {
		return fmt.Sprintf("%.0f of %.0f", sumOver(pairs, gaveUpWaves(legacy), legacy), sumOver(pairs, wavesOf(legacy), legacy))
	}
	f.set(t, k("gaveUp.dra"), gave(false))
	f.set(t, k("gaveUp.legacy"), gave(true))
	refused := func(legacy bool) figure {
		return func(s *stackResult) (float64, bool) {
			n := 0
			for _, w := range talkWaves(s, legacy) {
				n += w.Misaligned
			}
			return float64(n), true
		}
	}
	f.set(t, k("refused.dra"), whole(sumOver(pairs, refused(false), false)))
	f.set(t, k("refused.legacy"), whole(sumOver(pairs, refused(true), true)))

	// Memory (the scheduler both ways), the API server's CPU, CPU per pod.
	kubeSched := cpuProc("kube-scheduler", firstWaveRow, draSaturating, false)
	legacySched := func(s *stackResult) (float64, bool) {
		a, okA := cpuProc("kube-scheduler", firstWaveRow, legacySaturating, false)(s)
		b, okB := cpuProc(topoScheduler, firstWaveRow, legacySaturating, false)(s)
		return a + b, okA && okB
	}
	apiserverCPU := func(s *stackResult) (float64, bool) {
		v, ok := s.APIServerCPU["waves"]
		return v, ok
	}
	for _, m := range []struct {
		name        string
		dra, legacy figure
		format      func(float64) string
	}{
		{"schedAlone", draSchedulerRSS, topoSchedulerRSS, mibText},
		{"schedSum", draSchedulerRSS, legacySchedulersRSS, mibText},
		{"schedHeap", summed(heapOf, "kube-scheduler"), summed(heapOf, "kube-scheduler", topoScheduler), mibText},
		{"apiserver", summed(rssOf, "kube-apiserver"), summed(rssOf, "kube-apiserver"), mibText},
		{"apiserverHeap", summed(heapOf, "kube-apiserver"), summed(heapOf, "kube-apiserver"), mibText},
		{"etcd", summed(rssOf, "etcd"), summed(rssOf, "etcd"), mibText},
		{"apiserverCPU", apiserverCPU, apiserverCPU, func(v float64) string { return whole(v) + " s" }},
		{"cpu", cpuTotal(firstWaveRow, draSaturating, false), cpuTotal(firstWaveRow, legacySaturating, false), msOne},
		{"cpuSched", kubeSched, legacySched, msOne},
	} {
		sp := one(t, pairs, m.dra, m.legacy)
		ratio(m.name, sp)
		f.set(t, k(m.name+".dra"), m.format(sp.dra))
		f.set(t, k(m.name+".legacy"), m.format(sp.legacy))
	}
	// The legacy stack's scheduler CPU as its two parts: "0.7 + 11.2 ms".
	f.set(t, k("cpuSched.legacyParts"), fixed(1)(*overEach(pairs, cpuProc("kube-scheduler", firstWaveRow, legacySaturating, false), true))+
		" + "+msOne(*overEach(pairs, cpuProc(topoScheduler, firstWaveRow, legacySaturating, false), true)))

	// CPU per pod by process, the first 1-GPU wave: "13.41 | 8.95", "– | 4.66".
	for _, proc := range []string{"kube-apiserver", "kube-scheduler", topoScheduler, "kube-controller-manager", "etcd", "topodra-controller", "kwok", "harness", pluginClient} {
		cell := func(kind string, legacy bool) string {
			if v := overEach(pairs, cpuProc(proc, firstWaveRow, kind, false), legacy); v != nil {
				return fixed(2)(*v)
			}
			return "–"
		}
		dra, legacy := cell(draSaturating, false), cell(legacySaturating, true)
		if several {
			// Each run's own: the same work a pod costs more CPU in a run where
			// this machine is slower, so the runs' spread is the machine's drift.
			for _, side := range []struct {
				name   string
				kind   string
				legacy bool
			}{{"dra", draSaturating, false}, {"legacy", legacySaturating, true}} {
				if vs := perRun(pairs, cpuProc(proc, firstWaveRow, side.kind, false), side.legacy); len(vs) > 0 {
					f.set(t, k("cpu1."+proc+"."+side.name+".runs"), joined(vs, fixed(2)))
				}
			}
		}
		f.set(t, k("cpu1."+proc), dra+" | "+legacy)
		f.set(t, k("cpu1."+proc+".dra"), dra)
		f.set(t, k("cpu1."+proc+".legacy"), legacy)
	}
	// The control plane's CPU per pod in the median wave of each size, and in
	// deleting the first wave's pods.
	var medDRA, medLegacy []figure
	for _, size := range talkSizes {
		medDRA, medLegacy = append(medDRA, cpuTotal(size, draSaturating, false)), append(medLegacy, cpuTotal(size, legacySaturating, false))
	}
	med := spreads(t, pairs, medDRA, medLegacy)
	f.set(t, k("cpuMedian.dra"), joined(of(med, draOf), fixed(2)))
	f.set(t, k("cpuMedian.legacy"), joined(of(med, legacyOf), fixed(2)))
	f.set(t, k("cpuMedian1.legacy"), msOne(med[0].legacy))
	draCheaper, legacyCheaper := 0, 0
	for _, sp := range med {
		switch {
		case sp.dra < sp.legacy:
			draCheaper++
		case sp.legacy < sp.dra:
			legacyCheaper++
		}
	}
	cheaper := "neither stack is the cheaper one at every size"
	switch len(med) {
	case draCheaper:
		cheaper = "DRA is the cheaper stack at every size"
	case legacyCheaper:
		cheaper = "the legacy stack is the cheaper one at every size"
	}
	f.set(t, k("cpuMedian.cheaper"), cheaper)
	td := one(t, pairs, cpuTotal(firstWaveRow, draSaturating, true), cpuTotal(firstWaveRow, legacySaturating, true))
	f.set(t, k("cpuTeardown"), fixed(2)(td.dra)+" | "+fixed(2)(td.legacy))

	// API requests per bound pod, every run, what grows with time apart.
	for _, side := range []struct {
		name   string
		legacy bool
	}{{"dra", false}, {"legacy", true}} {
		var shs []requestShare
		for i, p := range pairs {
			s := &p.DRA
			if side.legacy {
				s = p.Legacy
			}
			sh, ok := s.requestShares()
			if !ok {
				t.Fatalf("%s run %d: no pod bound", prefix, i+1)
			}
			shs = append(shs, sh)
			f.set(t, k(fmt.Sprintf("req.run%d.%s", i+1, side.name)), strings.Join([]string{
				fixed(2)(sh.all), fixed(2)(sh.leases), fixed(2)(sh.periodic), fixed(2)(sh.rest),
				fixed(2)(sh.restWrites), fixed(2)(sh.nrtWrites)}, " | "))
		}
		pick := func(name string, digits int, v func(requestShare) float64) {
			var vs []float64
			for _, sh := range shs {
				vs = append(vs, v(sh))
			}
			f.set(t, k("req."+name+"."+side.name), span(vs, fixed(digits)))
		}
		pick("all", 1, func(s requestShare) float64 { return s.all })
		pick("leases", 1, func(s requestShare) float64 { return s.leases })
		pick("rest", 1, func(s requestShare) float64 { return s.rest })
		pick("writes", 1, func(s requestShare) float64 { return s.restWrites })
		pick("nrt", 2, func(s requestShare) float64 { return s.nrtWrites })
	}

	// The node path (-node-path) of the DRA runs: the first run's in full, and
	// over every run the pods it prepared and the errors.
	if pairs[0].DRA.NodePath == nil {
		return
	}
	nodePathKeys(t, f, k("np"), pairs[0].DRA, r.Nodes)
	prepared, errs := 0, 0
	for i, p := range pairs {
		np := p.DRA.NodePath
		if np == nil {
			t.Fatalf("%s run %d: no node path where run 1 had one", prefix, i+1)
		}
		prepared += np.Prepared
		errs += np.PrepareErrors + np.UnprepareErrors + np.Unsettled
	}
	f.set(t, k("np.prepared.all"), whole(float64(prepared)))
	f.set(t, k("np.errors.all"), whole(float64(errs)))
}

// A region of a document, its blocks, and the numbers in them.

var (
	regionStart = regexp.MustCompile(`^<!-- figures: ([a-z0-9-]+) -->\s*$`)
	listItem    = regexp.MustCompile(`^\d+\. `)
	figComment  = regexp.MustCompile(`<!--\s*fig:([^>]*?)-->`)
	comment     = regexp.MustCompile(`<!--[\s\S]*?-->`)
	codeSpan    = regexp.MustCompile("`[^`]*`")
	linkTarget  = regexp.MustCompile(`\]\([^)]*\)`)
)

const regionEnd = "<!-- figures: end -->"

// block is a table row, a paragraph or a list item, from its first line (1-based).
type block struct {
	line int
	text string
}

// regions finds the owned regions of a document and their blocks; problems
// are returned as messages.
func regions(name, doc string) (map[string][]block, []string) {
	out := map[string][]block{}
	var errs []string
	current, start := "", 0
	var cur *block
	flush := func() {
		if cur != nil {
			out[current] = append(out[current], *cur)
			cur = nil
		}
	}
	for i, line := range strings.Split(doc, "\n") {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		if m := regionStart.FindStringSubmatch(trimmed); m != nil && trimmed != regionEnd {
			if current != "" {
				errs = append(errs, fmt.Sprintf("%s:%d: region %q starts inside region %q (from line %d)", name, n, m[1], current, start))
				flush()
			}
			if _, dup := out[m[1]]; dup {
				errs = append(errs, fmt.Sprintf("%s:%d: region %q twice", name, n, m[1]))
			}
			current, start = m[1], n
			out[current] = nil
			continue
		}
		if trimmed == regionEnd {
			if current == "" {
				errs = append(errs, fmt.Sprintf("%s:%d: %s outside a region", name, n, regionEnd))
			}
			flush()
			current = ""
			continue
		}
		if current == "" {
			continue
		}
		newBlock := strings.HasPrefix(trimmed, "|") || strings.HasPrefix(trimmed, "- ") || strings.HasPrefix(trimmed, "* ") ||
			strings.HasPrefix(trimmed, "#") || listItem.MatchString(trimmed)
		switch {
		case trimmed == "":
			flush()
		case newBlock || cur == nil:
			flush()
			cur = &block{line: n, text: line}
		default:
			cur.text += "\n" + line
		}
		if strings.HasPrefix(trimmed, "|") {
			flush() // a table row is a block of its own
		}
	}
	if current != "" {
		flush()
		errs = append(errs, fmt.Sprintf("%s:%d: region %q is not closed by %s", name, start, current, regionEnd))
	}
	return out, errs
}

// blank replaces the matches of re in s with spaces, keeping every offset.
func blank(s string, re *regexp.Regexp) string {
	return re.ReplaceAllStringFunc(s, func(m string) string { return strings.Repeat(" ", len(m)) })
}

func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' }

// numbers are the offsets [start, end) of the numbers in s: 1,019, 0.58, 20.
// Digits inside a word are not numbers: p50, H100, v1.37.2, scale-100-fair.
func numbers(s string) [][2]int {
	var out [][2]int
	for i := 0; i < len(s); {
		if !isDigit(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && (isDigit(s[j]) || (s[j] == '.' || s[j] == ',') && j+1 < len(s) && isDigit(s[j+1])) {
			j++
		}
		inWord := i > 0 && (isLetter(s[i-1]) || s[i-1] == '.' || s[i-1] == '-' && i > 1 && (isLetter(s[i-2]) || isDigit(s[i-2])))
		if inWord {
			for j < len(s) && (isLetter(s[j]) || isDigit(s[j]) || s[j] == '.' || s[j] == '-') {
				j++
			}
		} else {
			out = append(out, [2]int{i, j})
		}
		i = j
	}
	return out
}

// findFigure finds want in s at or after from, not inside a longer number or a
// name; a space in want stands for any run of white space (a line break, an
// indent).
// It returns the match's offsets, or -1.
func findFigure(s, want string, from int) (int, int) {
	parts := strings.Fields(want)
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	re := regexp.MustCompile(strings.Join(parts, `\s+`))
	for at := from; at <= len(s); {
		m := re.FindStringIndex(s[at:])
		if m == nil {
			return -1, -1
		}
		i, end := at+m[0], at+m[1]
		startsInNumber := isDigit(s[i]) && i > 0 && (isDigit(s[i-1]) || (s[i-1] == '.' || s[i-1] == ',') && i > 1 && isDigit(s[i-2]) ||
			isLetter(s[i-1])) // a name such as H100 is no figure, as numbers has it
		endsInNumber := isDigit(s[end-1]) && end < len(s) && (isDigit(s[end]) || (s[end] == '.' || s[end] == ',') && end+1 < len(s) && isDigit(s[end+1]))
		if !startsInNumber && !endsInNumber {
			return i, end
		}
		at = i + 1
	}
	return -1, -1
}

// checkFigures checks the regions of one document against the figures: every
// region there, every key known and its text in place, every number a key's.
func checkFigures(name, doc string, want []string, figs figures) []string {
	found, errs := regions(name, doc)
	for _, r := range want {
		if _, ok := found[r]; !ok {
			errs = append(errs, fmt.Sprintf("%s: no region %q (<!-- figures: %s --> ... %s)", name, r, r, regionEnd))
		}
	}
	for _, r := range sortedKeys(found) {
		if !slices.Contains(want, r) {
			errs = append(errs, fmt.Sprintf("%s: region %q is not one this test knows (figureDocs)", name, r))
		}
		for _, b := range found[r] {
			errs = append(errs, checkBlock(name, b, figs)...)
		}
	}
	return errs
}

// checkBlock checks one block: one message listing what is wrong with it,
// with the block, or none.
func checkBlock(name string, b block, figs figures) []string {
	var keys []string
	for _, m := range figComment.FindAllStringSubmatch(b.text, -1) {
		keys = append(keys, strings.Fields(m[1])...)
	}
	text := blank(blank(blank(b.text, comment), codeSpan), linkTarget)
	var problems []string
	var covered [][2]int
	cursor := 0
	for _, key := range keys {
		want, ok := figs[key]
		if !ok {
			problems = append(problems, fmt.Sprintf("no figure %q (committedFigures)", key))
			continue
		}
		at, end := findFigure(text, want, cursor)
		if at < 0 {
			problems = append(problems, fmt.Sprintf("%s is %q in the data; the block does not have it there", key, want))
			continue
		}
		covered = append(covered, [2]int{at, end})
		cursor = end
	}
	if len(problems) == 0 {
		// Numbers that no key covers; while a key is amiss they follow from it.
		for _, n := range numbers(text) {
			if !slices.ContainsFunc(covered, func(c [2]int) bool { return c[0] <= n[0] && n[1] <= c[1] }) {
				problems = append(problems, fmt.Sprintf("%q is not a checked figure: name its key in the block's <!-- fig: --> comment, "+
					"or spell it out if it is not from the data", text[n[0]:n[1]]))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s:%d:\n\t%s\nin:\n%s", name, b.line, strings.Join(problems, "\n\t"), b.text)}
}

func readDoc(t testing.TB, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestFiguresFollowTheData: every number in the docs' owned regions is
// recomputed from the committed results and printed the same.
func TestFiguresFollowTheData(t *testing.T) {
	figs := committedFigures(t, committed)
	for _, k := range sortedKeys(figs) {
		t.Logf("%-36s %s", k, figs[k])
	}
	for _, name := range sortedKeys(figureDocs) {
		for _, e := range checkFigures(name, readDoc(t, name), figureDocs[name], figs) {
			t.Error(e)
		}
	}
}

// The check fails where a doc is edited by hand, and where the data changes
// and the doc does not.
func TestFigureCheckCatchesHandEdits(t *testing.T) {
	figs := committedFigures(t, committed)
	const name = "README.md"
	readme := readDoc(t, name)
	if errs := checkFigures(name, readme, figureDocs[name], figs); len(errs) > 0 {
		t.Fatalf("the committed README fails already:\n%s", strings.Join(errs, "\n"))
	}
	region := func(doc string) string {
		_, rest, _ := strings.Cut(doc, "<!-- figures: readme-numbers -->")
		in, _, _ := strings.Cut(rest, regionEnd)
		return in
	}
	// Each edit replaces the first occurrence of from inside the region.
	for _, c := range []struct {
		what, from, to, want string
	}{
		{"a ratio edited", figs["s100.fresh"] + " (", "0.75 (", `s100.fresh is "` + figs["s100.fresh"] + `"`},
		{"a range edited", figs["s100.schedAlone.range"], "0.90–1.15", "s100.schedAlone.range"},
		{"a number added", "median of", "median of 4", `"4" is not a checked figure`},
		{"two figures swapped", figs["s100.fresh.dra"] + " vs " + figs["s100.fresh.legacy"],
			figs["s100.fresh.legacy"] + " vs " + figs["s100.fresh.dra"], "s100.fresh.legacy"},
		{"a key removed", "<!-- fig: s100.fresh ", "<!-- fig: ", `is not a checked figure`},
		{"the end of the region removed", regionEnd, "", "is not closed"},
	} {
		t.Run(c.what, func(t *testing.T) {
			if !strings.Contains(region(readme)+regionEnd, c.from) {
				t.Fatalf("the README's region has no %q to edit", c.from)
			}
			head, rest, _ := strings.Cut(readme, "<!-- figures: readme-numbers -->")
			doctored := head + "<!-- figures: readme-numbers -->" + strings.Replace(rest, c.from, c.to, 1)
			errs := strings.Join(checkFigures(name, doctored, figureDocs[name], figs), "\n")
			if !strings.Contains(errs, c.want) {
				t.Errorf("after %s, want an error with %q; got:\n%s", c.what, c.want, errs)
			}
		})
	}
	// New data: the topology-aware scheduler's peak RSS doubled in every
	// 100-node run; the README, unchanged, no longer matches it.
	doctoredData := func(t testing.TB, n string) []byte {
		raw := committed(t, n)
		if n != "scale-100-fair.json" {
			return raw
		}
		var r results
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		for _, p := range r.pairs() {
			p.Legacy.MemoryPeak[topoScheduler] *= 2
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	errs := strings.Join(checkFigures(name, readme, figureDocs[name], committedFigures(t, doctoredData)), "\n")
	for _, want := range []string{"s100.schedAlone is", "s100.schedSum is"} {
		if !strings.Contains(errs, want) {
			t.Errorf("with the topology-aware scheduler's memory doubled, want an error with %q; got:\n%s", want, errs)
		}
	}
}

// The number scanner: what counts as a figure in the docs' text.
func TestFigureNumbers(t *testing.T) {
	s := "p50 of 1,019 MiB on DGX H100 (v1.37.2, scale-100-fair) was 0.58 (0.53–0.59), -20 %, 2x, 1-GPU."
	var got []string
	for _, n := range numbers(s) {
		got = append(got, s[n[0]:n[1]])
	}
	want := []string{"1,019", "0.58", "0.53", "0.59", "20", "2", "1"}
	if !slices.Equal(got, want) {
		t.Errorf("numbers(%q) = %q, want %q", s, got, want)
	}
	if at, _ := findFigure("0.53 and 3", "3", 0); at != 9 {
		t.Errorf(`findFigure of "3" matched inside 0.53: at %d`, at)
	}
}
