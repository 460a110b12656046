// bench-plots draws the committed results of `make bench-scale` as PNG files for
// docs/benchmarks.md. From a run of both stacks by the fair method (one or more
// alternated runs): throughput of the saturating waves, latency at a steady rate
// and under churn, CPU per pod by process, and Go heap over the run, DRA against
// legacy, each a median over the runs with their range. From the earlier API
// server tuning runs: memory over time.
//
//	go run ./cmd/bench-plots -scale ../../docs/benchmarks/scale-100-fair.json \
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
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The fields of tests/scale's results.json that the plots use (that program is a
// main package and cannot be imported).
type results struct {
	Nodes         int      `json:"nodes"`
	APIServerGOGC int      `json:"apiserverGOGC"`
	GoawayChance  float64  `json:"goawayChance"`
	SteadyRate    float64  `json:"steadyRate"`
	ChurnRate     float64  `json:"churnRate"`
	DRA           stack    `json:"dra"`
	Legacy        *stack   `json:"legacy"`
	Repeats       []repeat `json:"repeats"`
}

type repeat struct {
	DRA    stack  `json:"dra"`
	Legacy *stack `json:"legacy"`
}

type stack struct {
	Kinds        []kind      `json:"kinds"`
	MemorySeries *memSeries  `json:"memorySeries"`
	HeapSeries   *heapSeries `json:"heapSeries"`
}

type kind struct {
	Size        int                `json:"size"`
	Kind        string             `json:"kind"`
	PodsPerSec  float64            `json:"podsPerSec"`
	P50Ms       float64            `json:"p50Ms"`
	P99Ms       float64            `json:"p99Ms"`
	CPUMsPerPod map[string]float64 `json:"cpuMsPerPod"`
	Waves       []wave             `json:"waves"`
}

type wave struct {
	Bound      int     `json:"bound"`
	PodsPerSec float64 `json:"podsPerSec"`
	Cost       *cost   `json:"cost"`
}

type cost struct {
	CPUSeconds           map[string]float64 `json:"cpuSeconds"`
	BackgroundCPUSeconds map[string]float64 `json:"backgroundCPUSeconds"`
}

type memSeries struct {
	IntervalSeconds float64            `json:"intervalSeconds"`
	Phases          map[string]float64 `json:"phases"`
	RSS             map[string][]int64 `json:"rssBytes"`
}

type heapSeries struct {
	Seconds []float64          `json:"seconds"`
	Bytes   map[string][]int64 `json:"bytes"`
}

var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff},
	color.RGBA{0xff, 0x7f, 0x0e, 0xff},
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xd6, 0x27, 0x28, 0xff},
	color.RGBA{0x94, 0x67, 0xbd, 0xff},
	color.RGBA{0x8c, 0x56, 0x4b, 0xff},
	color.RGBA{0xe3, 0x77, 0xc2, 0xff},
	color.RGBA{0x7f, 0x7f, 0x7f, 0xff},
}

func main() {
	scale := flag.String("scale", "", "a results.json of both stacks by the fair method (-runs N for spreads): throughput, latency, CPU and heap plots")
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
		if err := talkPlots(r, out); err != nil {
			return fmt.Errorf("%s: %w", scalePath, err)
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

// pairs are the runs in which both stacks ran: the first, then the repeats.
func (r *results) pairs() []repeat {
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

func (s *stack) kind(size int, name string) (kind, bool) {
	for _, k := range s.Kinds {
		if k.Size == size && k.Kind == name {
			return k, true
		}
	}
	return kind{}, false
}

// spread is one figure over the runs: its median, lowest and highest.
type spread struct{ mid, lo, hi float64 }

func spreadOf(vs []float64) (spread, bool) {
	if len(vs) == 0 {
		return spread{}, false
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	mid := s[len(s)/2]
	if len(s)%2 == 0 {
		mid = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{mid, s[0], s[len(s)-1]}, true
}

// addLine draws pts as the n-th line of p, in the n-th palette colour, with a
// legend entry when label is not empty.
func addLine(p *plot.Plot, pts plotter.XYs, n int, label string) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = palette[n%len(palette)]
	l.Width = vg.Points(1.2)
	p.Add(l)
	if label != "" {
		p.Legend.Add(label, l)
	}
	return nil
}

// headroom leaves the top of a linear plot to the legend and the phase labels.
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

// logTicks labels the powers of ten and the 2s and 5s between them on a log
// axis, and marks the other integers unlabelled.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for decade := math.Pow10(int(math.Floor(math.Log10(lo)))); decade <= hi; decade *= 10 {
		for i := 1; i < 10; i++ {
			v := decade * float64(i)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if i == 1 || i == 2 || i == 5 {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			out = append(out, t)
		}
	}
	return out
}

func save(p *plot.Plot, path string) error {
	if _, log := p.Y.Scale.(plot.LogScale); !log {
		p.Y.Tick.Marker = ticks{}
	}
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}
