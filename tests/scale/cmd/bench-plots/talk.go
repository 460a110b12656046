package main

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

const topoScheduler = "topology-aware-scheduler"

// talkPlots draws the talk's comparison from a run of both stacks.
func talkPlots(r *results, out string) error {
	pairs := r.pairs()
	if len(pairs) == 0 {
		return fmt.Errorf("no run with both stacks (legacy skipped?)")
	}
	for name, draw := range map[string]func([]repeat, *results, string) error{
		"plot-throughput.png": throughputPlot,
		"plot-latency.png":    latencyPlot,
		"plot-cpu.png":        cpuPlot,
		"plot-heap.png":       heapPlot,
	} {
		if err := draw(pairs, r, filepath.Join(out, name)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// A dotSeries is one figure per category and run: a dot at the median over the
// runs and a whisker from the lowest to the highest.
type dotSeries struct {
	label string
	shape draw.GlyphDrawer
	color color.Color
	// value reads the figure of category i from one run; ok is false where the
	// run lacks it (the legacy stack has no 8-GPU pods).
	value func(p repeat, i int) (float64, bool)
}

// dots draws the series side by side in each category, on a log axis: the
// stacks' figures differ by orders of magnitude.
func dots(p *plot.Plot, pairs []repeat, categories []string, ss []dotSeries) error {
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = logTicks{}
	lo, hi := 0.0, 0.0
	for si, s := range ss {
		offset := 0.6 * (float64(si) - float64(len(ss)-1)/2) / float64(len(ss))
		var mids plotter.XYs
		for ci := range categories {
			var vs []float64
			for _, run := range pairs {
				if v, ok := s.value(run, ci); ok && v > 0 {
					vs = append(vs, v)
				}
			}
			sp, ok := spreadOf(vs)
			if !ok {
				continue
			}
			x := float64(ci) + offset
			mids = append(mids, plotter.XY{X: x, Y: sp.mid})
			if lo == 0 || sp.lo < lo {
				lo = sp.lo
			}
			hi = max(hi, sp.hi)
			if sp.hi > sp.lo {
				w, err := plotter.NewLine(plotter.XYs{{X: x, Y: sp.lo}, {X: x, Y: sp.hi}})
				if err != nil {
					return err
				}
				w.Color, w.Width = s.color, vg.Points(1)
				p.Add(w)
			}
		}
		if len(mids) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(mids)
		if err != nil {
			return err
		}
		sc.GlyphStyle = draw.GlyphStyle{Color: s.color, Radius: vg.Points(3.5), Shape: s.shape}
		p.Add(sc)
		p.Legend.Add(s.label, sc)
	}
	if hi == 0 {
		return fmt.Errorf("no figure to draw")
	}
	// Room above for the legend.
	p.Y.Min, p.Y.Max = lo/2, hi*8
	p.X.Min, p.X.Max = -0.5, float64(len(categories))-0.5
	p.NominalX(categories...)
	p.Legend.Top = true
	return nil
}

func runsText(pairs []repeat) string {
	if len(pairs) == 1 {
		return "one run"
	}
	return fmt.Sprintf("medians of %d alternated runs, whiskers: their range", len(pairs))
}

func runsShort(pairs []repeat) string {
	if len(pairs) == 1 {
		return "one run"
	}
	return fmt.Sprintf("medians of %d runs", len(pairs))
}

func throughputPlot(pairs []repeat, r *results, path string) error {
	sizes := []int{1, 2, 4}
	cats := []string{"1 GPU", "2 GPUs", "4 GPUs"}
	pps := func(s *stack, size int, name string, firstWave bool) (float64, bool) {
		if s == nil {
			return 0, false
		}
		k, ok := s.kind(size, name)
		if !ok {
			return 0, false
		}
		if firstWave {
			if len(k.Waves) == 0 {
				return 0, false
			}
			return k.Waves[0].PodsPerSec, true
		}
		return k.PodsPerSec, true
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Saturating waves, NUMA-aligned pods (%d nodes; %s)", r.Nodes, runsText(pairs))
	p.Y.Label.Text = "pods bound per second"
	p.X.Label.Text = "GPUs per pod"
	return saveDots(p, pairs, cats, []dotSeries{
		{"DRA (median wave)", draw.CircleGlyph{}, palette[0], func(run repeat, i int) (float64, bool) {
			return pps(&run.DRA, sizes[i], "aligned", false)
		}},
		{"legacy, the run's first wave (fresh NodeResourceTopology)", draw.SquareGlyph{}, palette[1], func(run repeat, i int) (float64, bool) {
			if sizes[i] != 1 {
				return 0, false
			}
			return pps(run.Legacy, 1, "single-numa-node", true)
		}},
		{"legacy, back to back (median wave)", draw.TriangleGlyph{}, palette[3], func(run repeat, i int) (float64, bool) {
			return pps(run.Legacy, sizes[i], "single-numa-node", false)
		}},
	}, path)
}

func latencyPlot(pairs []repeat, r *results, path string) error {
	// The steady waves by size, then the churn workload (size 0).
	sizes := []int{1, 2, 4, 0}
	cats := []string{"1 GPU", "2 GPUs", "4 GPUs", "churn, mixed"}
	lat := func(s *stack, i int, dra, p99 bool) (float64, bool) {
		if s == nil {
			return 0, false
		}
		name := "single-numa-node-steady"
		switch {
		case sizes[i] == 0:
			name = "mixed-churn"
		case dra:
			name = "aligned-steady"
		}
		k, ok := s.kind(sizes[i], name)
		if !ok {
			return 0, false
		}
		if p99 {
			return k.P99Ms, true
		}
		return k.P50Ms, true
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Latency, created to bound, at %g pods/s and under churn at %g pods/s (%d nodes)", r.SteadyRate, r.ChurnRate, r.Nodes)
	// The runs go under the axis: a y label longer than the plot is tall
	// squashes the plot area and is cut at both ends.
	p.Y.Label.Text = "milliseconds"
	p.X.Label.Text = runsText(pairs)
	// Top left, where the one-GPU waves leave room: at the right the legacy
	// churn figures reach the top.
	p.Legend.Left = true
	return saveDots(p, pairs, cats, []dotSeries{
		{"DRA p50", draw.CircleGlyph{}, palette[0], func(run repeat, i int) (float64, bool) { return lat(&run.DRA, i, true, false) }},
		{"DRA p99", draw.RingGlyph{}, palette[0], func(run repeat, i int) (float64, bool) { return lat(&run.DRA, i, true, true) }},
		{"legacy p50", draw.SquareGlyph{}, palette[3], func(run repeat, i int) (float64, bool) { return lat(run.Legacy, i, false, false) }},
		{"legacy p99", draw.BoxGlyph{}, palette[3], func(run repeat, i int) (float64, bool) { return lat(run.Legacy, i, false, true) }},
	}, path)
}

func saveDots(p *plot.Plot, pairs []repeat, cats []string, ss []dotSeries, path string) error {
	if err := dots(p, pairs, cats, ss); err != nil {
		return err
	}
	return save(p, path)
}

// cpuOf is a wave's CPU per bound pod by control-plane process, background
// off, as tests/scale computes it; kwok (the kubelets) and the harness are left
// out, as in the report's total.
func cpuOf(w wave) map[string]float64 {
	out := map[string]float64{}
	if w.Cost == nil || w.Bound == 0 {
		return out
	}
	for name, s := range w.Cost.CPUSeconds {
		if name == "kwok" || name == "harness" {
			continue
		}
		out[name] = max(0, s-w.Cost.BackgroundCPUSeconds[name]) * 1000 / float64(w.Bound)
	}
	return out
}

// cpuPlot stacks each process's CPU per pod of the 1-GPU saturating waves: DRA's
// median wave against legacy's first wave (fresh objects) and its median wave
// (mostly waiting for the updater).
func cpuPlot(pairs []repeat, r *results, path string) error {
	bars := []struct {
		label string
		of    func(run repeat) (map[string]float64, bool)
	}{
		{"DRA", func(run repeat) (map[string]float64, bool) {
			k, ok := run.DRA.kind(1, "aligned")
			return withoutKubelets(k.CPUMsPerPod), ok
		}},
		{"legacy, first wave", func(run repeat) (map[string]float64, bool) {
			k, ok := run.Legacy.kind(1, "single-numa-node")
			if !ok || len(k.Waves) == 0 {
				return nil, false
			}
			return cpuOf(k.Waves[0]), true
		}},
		{"legacy, median wave", func(run repeat) (map[string]float64, bool) {
			k, ok := run.Legacy.kind(1, "single-numa-node")
			return withoutKubelets(k.CPUMsPerPod), ok
		}},
	}
	// Each bar's value per process is its median over the runs.
	values := make([]map[string]float64, len(bars))
	procs := map[string]bool{}
	for i, b := range bars {
		byProc := map[string][]float64{}
		for _, run := range pairs {
			if m, ok := b.of(run); ok {
				for n, v := range m {
					byProc[n] = append(byProc[n], v)
					procs[n] = true
				}
			}
		}
		values[i] = map[string]float64{}
		for n, vs := range byProc {
			sp, _ := spreadOf(vs)
			values[i][n] = sp.mid
		}
	}
	order := []string{"kube-apiserver", "etcd", "kube-scheduler", topoScheduler, "kube-controller-manager", "topodra-controller"}
	for n := range procs {
		if !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Control-plane CPU per bound pod, 1-GPU saturating waves (%d nodes; %s)", r.Nodes, runsShort(pairs))
	p.Y.Label.Text = "CPU milliseconds per pod"
	const width = 0.5
	top := 0.0
	for ci, proc := range order {
		if !procs[proc] {
			continue
		}
		var legend plot.Thumbnailer
		for i := range bars {
			below := 0.0
			for _, q := range order[:ci] {
				below += values[i][q]
			}
			v := values[i][proc]
			if v <= 0 {
				continue
			}
			x0, x1 := float64(i)-width/2, float64(i)+width/2
			poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: below}, {X: x1, Y: below}, {X: x1, Y: below + v}, {X: x0, Y: below + v}})
			if err != nil {
				return err
			}
			poly.Color = palette[ci%len(palette)]
			poly.LineStyle.Width = 0
			p.Add(poly)
			legend = poly
			top = max(top, below+v)
		}
		if legend != nil {
			p.Legend.Add(proc, legend)
		}
	}
	names := make([]string, len(bars))
	for i, b := range bars {
		total := 0.0
		for _, v := range values[i] {
			total += v
		}
		names[i] = fmt.Sprintf("%s: %.1f ms", b.label, total)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(bars))-0.5
	p.Y.Min, p.Y.Max = 0, top*1.6
	p.Legend.Top = true
	return save(p, path)
}

func withoutKubelets(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for n, v := range m {
		if n != "kwok" && n != "harness" {
			out[n] = v
		}
	}
	return out
}

// heapPlot is the Go heap in use of the API server, the scheduler(s) and the
// controller-manager over the first run's common workload, DRA solid, legacy
// dashed (its two schedulers summed). DRA's series stops where its DRA-only
// waves begin, after the memory reading both stacks share.
func heapPlot(pairs []repeat, r *results, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Go heap in use over the common workload (%d nodes, run 1)", r.Nodes)
	p.X.Label.Text = "seconds since the stack's first wave"
	p.Y.Label.Text = "MiB"
	run := pairs[0]
	draEnd := 0.0
	if m := run.DRA.MemorySeries; m != nil {
		draEnd = m.Phases["dra-only"]
	}
	components := []struct {
		label string
		names []string
	}{
		{"kube-apiserver", []string{"kube-apiserver"}},
		{"scheduler(s)", []string{"kube-scheduler", topoScheduler}},
		{"kube-controller-manager", []string{"kube-controller-manager"}},
		{"etcd", []string{"etcd"}},
	}
	drawn := 0
	for ci, c := range components {
		for _, st := range []struct {
			name string
			s    *stack
			end  float64
		}{{"DRA", &run.DRA, draEnd}, {"legacy", run.Legacy, 0}} {
			pts := heapPoints(st.s, c.names, st.end)
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color, l.Width = palette[ci%len(palette)], vg.Points(1.2)
			if st.name == "legacy" {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			p.Add(l)
			p.Legend.Add(st.name+" "+c.label, l)
			drawn++
		}
	}
	if drawn == 0 {
		return fmt.Errorf("no heap series (written by runs of the fair method)")
	}
	// Eight legend rows: more room above than headroom leaves.
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.9
	p.X.Tick.Marker = ticks{}
	p.Legend.Top = true
	return save(p, path)
}

// heapPoints sums the named components' heap at each reading up to end (0: all),
// from the stack's first wave on.
func heapPoints(s *stack, names []string, end float64) plotter.XYs {
	if s == nil || s.HeapSeries == nil {
		return nil
	}
	h := s.HeapSeries
	start := 0.0
	if s.MemorySeries != nil {
		start = s.MemorySeries.Phases["waves"]
	}
	type reading struct{ t, mib float64 }
	var rs []reading
	for i, t := range h.Seconds {
		if t < start || (end > 0 && t > end) {
			continue
		}
		sum, any := 0.0, false
		for _, n := range names {
			if v := h.Bytes[n]; i < len(v) && v[i] > 0 {
				sum += float64(v[i])
				any = true
			}
		}
		if any {
			rs = append(rs, reading{t - start, sum / (1 << 20)})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].t < rs[j].t })
	pts := make(plotter.XYs, len(rs))
	for i, x := range rs {
		pts[i] = plotter.XY{X: x.t, Y: x.mib}
	}
	return pts
}
