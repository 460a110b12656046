package main

import (
	"fmt"
	"image/color"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

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
		if err := addLine(p, pts, i, c); err != nil {
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
		if err := addLine(p, pts, i, label); err != nil {
			return err
		}
	}
	headroom(p)
	phases(p, runs[0].DRA.MemorySeries)
	p.Legend.Top = true
	return save(p, path)
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
