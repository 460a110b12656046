// bench-plots draws the committed results of `make bench-scale` as PNG files for
// docs/benchmarks.md: scheduling latency and throughput by claim size (DRA against
// legacy, aligned against unconstrained) from one run with both stacks, and memory
// over time from the runs that recorded a memory series.
//
//	go run ./cmd/bench-plots -scale ../../docs/benchmarks/scale-500.json \
//	    -memory ../../docs/benchmarks/tuning-default.json \
//	    -series ../../docs/benchmarks/tuning-default.json,../../docs/benchmarks/tuning-gogc50.json \
//	    -out ../../docs/benchmarks
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The fields of tests/scale's results.json that the plots use (that program is a
// main package and cannot be imported).
type results struct {
	Nodes         int     `json:"nodes"`
	APIServerGOGC int     `json:"apiserverGOGC"`
	GoawayChance  float64 `json:"goawayChance"`
	DRA           stack   `json:"dra"`
	Legacy        *stack  `json:"legacy"`
}

type stack struct {
	Kinds        []kind     `json:"kinds"`
	MemorySeries *memSeries `json:"memorySeries"`
}

type kind struct {
	Size       int     `json:"size"`
	Kind       string  `json:"kind"`
	PodsPerSec float64 `json:"podsPerSec"`
	P50Ms      float64 `json:"p50Ms"`
	P99Ms      float64 `json:"p99Ms"`
}

type memSeries struct {
	IntervalSeconds float64            `json:"intervalSeconds"`
	Phases          map[string]float64 `json:"phases"`
	RSS             map[string][]int64 `json:"rssBytes"`
}

// A series is one bar group's values by claim size.
type series struct {
	label string
	by    map[int]float64
}

var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff},
	color.RGBA{0xff, 0x7f, 0x0e, 0xff},
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xd6, 0x27, 0x28, 0xff},
	color.RGBA{0x94, 0x67, 0xbd, 0xff},
	color.RGBA{0x8c, 0x56, 0x4b, 0xff},
}

func main() {
	scale := flag.String("scale", "", "a results.json with both stacks: latency and throughput plots")
	memory := flag.String("memory", "", "a results.json with a memory series: memory of every component over the run")
	seriesFiles := flag.String("series", "", "comma-separated results.json files with a memory series and different API server settings: their API server memory")
	out := flag.String("out", ".", "directory for the PNG files")
	flag.Parse()
	if err := run(*scale, *memory, *seriesFiles, *out); err != nil {
		fmt.Fprintf(os.Stderr, "bench-plots: %v\n", err)
		os.Exit(1)
	}
}

func run(scalePath, memoryPath, seriesPaths, out string) error {
	if scalePath != "" {
		r, err := load(scalePath)
		if err != nil {
			return err
		}
		if err := latencyPlot(r, filepath.Join(out, "plot-latency.png")); err != nil {
			return err
		}
		if err := throughputPlot(r, filepath.Join(out, "plot-throughput.png")); err != nil {
			return err
		}
	}
	if memoryPath != "" {
		r, err := load(memoryPath)
		if err != nil {
			return err
		}
		if r.DRA.MemorySeries == nil {
			return fmt.Errorf("%s has no memory series (written by runs since the series was added)", memoryPath)
		}
		if err := memoryPlot(r, strings.TrimSuffix(filepath.Base(memoryPath), ".json"), filepath.Join(out, "plot-memory.png")); err != nil {
			return err
		}
	}
	var runs []*results
	for _, p := range strings.Split(seriesPaths, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		r, err := load(p)
		if err != nil {
			return err
		}
		if r.DRA.MemorySeries == nil {
			return fmt.Errorf("%s has no memory series (written by runs since the series was added)", p)
		}
		runs = append(runs, r)
	}
	if len(runs) > 0 {
		if err := apiserverMemoryPlot(runs, filepath.Join(out, "plot-apiserver-memory.png")); err != nil {
			return err
		}
	}
	return nil
}

func load(path string) (*results, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r results
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

func pick(s *stack, kindName string, value func(kind) float64) map[int]float64 {
	out := map[int]float64{}
	if s == nil {
		return out
	}
	for _, k := range s.Kinds {
		if k.Kind == kindName {
			out[k.Size] = value(k)
		}
	}
	return out
}

func sizesOf(ss []series) []int {
	seen := map[int]bool{}
	for _, s := range ss {
		for k := range s.by {
			seen[k] = true
		}
	}
	var out []int
	for k := range seen {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// bars draws grouped bars, one group per claim size; a series without a value
// for a size leaves a gap (the legacy stack has no 8-GPU pods).
func bars(p *plot.Plot, ss []series, colors []color.Color) error {
	sizes := sizesOf(ss)
	w := vg.Points(60 / float64(len(ss)))
	for i, s := range ss {
		vals := make(plotter.Values, len(sizes))
		for j, size := range sizes {
			vals[j] = s.by[size]
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Color = colors[i%len(colors)]
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(len(ss)-1)/2)
		p.Add(b)
		p.Legend.Add(s.label, b)
	}
	names := make([]string, len(sizes))
	for i, s := range sizes {
		names[i] = fmt.Sprintf("%d GPU", s)
	}
	p.NominalX(names...)
	p.Legend.Top = true
	return nil
}

func ms(k kind) float64  { return k.P50Ms / 1000 }
func p99(k kind) float64 { return k.P99Ms / 1000 }

func latencyPlot(r *results, path string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Scheduling latency, pod created to bound (%d nodes)", r.Nodes)
	p.Y.Label.Text = "seconds (p50 solid, p99 light)"
	p.X.Label.Text = "GPUs per pod"
	kinds := []struct{ label, kind string }{
		{"DRA aligned", "aligned"}, {"DRA unconstrained", "any"}, {"DRA aligned, claims made first", "aligned-precreated"},
	}
	var p50s, p99s []series
	for _, k := range kinds {
		p50s = append(p50s, series{k.label, pick(&r.DRA, k.kind, ms)})
		p99s = append(p99s, series{"", pick(&r.DRA, k.kind, p99)})
	}
	if r.Legacy != nil {
		p50s = append(p50s, series{"legacy single-numa-node", pick(r.Legacy, "single-numa-node", ms)})
		p99s = append(p99s, series{"", pick(r.Legacy, "single-numa-node", p99)})
	}
	// The p99 bars behind, the p50 bars in front: one bar shows both.
	light := make([]color.Color, len(palette))
	for i, c := range palette {
		r, g, b, _ := c.RGBA()
		light[i] = color.RGBA{uint8(r>>8/2 + 127), uint8(g>>8/2 + 127), uint8(b>>8/2 + 127), 0xff}
	}
	if err := bars(p, p99s, light); err != nil {
		return err
	}
	p.Legend = plot.NewLegend()
	if err := bars(p, p50s, palette); err != nil {
		return err
	}
	headroom(p)
	return save(p, path)
}

func throughputPlot(r *results, path string) error {
	pps := func(k kind) float64 { return k.PodsPerSec }
	ss := []series{
		{"DRA aligned", pick(&r.DRA, "aligned", pps)},
		{"DRA unconstrained", pick(&r.DRA, "any", pps)},
		{"DRA aligned, claims made first", pick(&r.DRA, "aligned-precreated", pps)},
	}
	if r.Legacy != nil {
		ss = append(ss, series{"legacy single-numa-node", pick(r.Legacy, "single-numa-node", pps)})
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Scheduling throughput by claim size (%d nodes)", r.Nodes)
	p.Y.Label.Text = "pods bound per second (median wave)"
	p.X.Label.Text = "GPUs per pod"
	if err := bars(p, ss, palette); err != nil {
		return err
	}
	headroom(p)
	return save(p, path)
}

// memoryPlot is one run's resident memory per control-plane component, with the
// run's phases marked.
func memoryPlot(r *results, name, path string) error {
	m := r.DRA.MemorySeries
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Resident memory over a DRA run (%s, %d nodes)", name, r.Nodes)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "MiB"
	i := 0
	for _, c := range []string{"kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "topodra-controller"} {
		pts := points(m, c)
		if pts == nil {
			continue
		}
		if err := addSeries(p, pts, i, c); err != nil {
			return err
		}
		i++
	}
	headroom(p)
	phases(p, m)
	p.Legend.Top = true
	return save(p, path)
}

// apiserverMemoryPlot compares the API server's resident memory across runs with
// different API server settings.
func apiserverMemoryPlot(runs []*results, path string) error {
	p := plot.New()
	p.Title.Text = "kube-apiserver resident memory, by API server setting"
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "MiB"
	for i, r := range runs {
		pts := points(r.DRA.MemorySeries, "kube-apiserver")
		if pts == nil {
			continue
		}
		label := "default"
		switch {
		case r.APIServerGOGC != 0:
			label = fmt.Sprintf("GOGC=%d", r.APIServerGOGC)
		case r.GoawayChance != 0:
			label = fmt.Sprintf("--goaway-chance=%g", r.GoawayChance)
		}
		if err := addSeries(p, pts, i, label); err != nil {
			return err
		}
	}
	headroom(p)
	phases(p, runs[0].DRA.MemorySeries)
	p.Legend.Top = true
	return save(p, path)
}

// addSeries draws pts as the n-th line of p, in the n-th palette colour, with a
// legend entry.
func addSeries(p *plot.Plot, pts plotter.XYs, n int, label string) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = palette[n%len(palette)]
	l.Width = vg.Points(1.2)
	p.Add(l)
	p.Legend.Add(label, l)
	return nil
}

func points(m *memSeries, component string) plotter.XYs {
	v := m.RSS[component]
	if len(v) == 0 {
		return nil
	}
	pts := make(plotter.XYs, len(v))
	for i, b := range v {
		pts[i].X = float64(i) * m.IntervalSeconds
		pts[i].Y = float64(b) / (1 << 20)
	}
	return pts
}

// phases draws a dashed vertical line where each phase of the run began.
func phases(p *plot.Plot, m *memSeries) {
	names := make([]string, 0, len(m.Phases))
	for n := range m.Phases {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return m.Phases[names[i]] < m.Phases[names[j]] })
	for i, n := range names {
		x := m.Phases[n]
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: p.Y.Max}})
		if err != nil {
			continue
		}
		l.Color = color.Gray{Y: 0x90}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(l)
		// Phases can start seconds apart: their labels go down a step each.
		y := p.Y.Max * (1 - 0.06*float64(i))
		labels, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: y}}, Labels: []string{" " + n}})
		if err == nil {
			for i := range labels.TextStyle {
				labels.TextStyle[i].YAlign = draw.YTop
			}
			p.Add(labels)
		}
	}
}

// headroom leaves the top of the plot to the legend and the phase labels.
func headroom(p *plot.Plot) {
	p.Y.Min = 0
	p.Y.Max *= 1.4
}

// ticks labels round values, about six of them: the default marker labels
// only a few.
type ticks struct{}

func (ticks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
	for (hi-lo)/step > 8 {
		switch {
		case fmt.Sprint(step)[0] == '2':
			step *= 2.5
		default:
			step *= 2
		}
	}
	for (hi-lo)/step < 3 && step > 1e-9 {
		step /= 2
	}
	var out []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return out
}

func save(p *plot.Plot, path string) error {
	p.Y.Tick.Marker = ticks{}
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}
