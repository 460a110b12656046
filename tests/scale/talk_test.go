package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// One 1-GPU kind of two waves whose CPU per pod is apiserver ms first, then
// second; podsPerSec likewise.
func twoWaves(kind string, first, second float64) kindResult {
	wave := func(ms float64) waveResult {
		cpu := map[string]float64{"kube-apiserver": ms / 10}
		down := map[string]float64{"kube-apiserver": ms / 20}
		if kind == "single-numa-node" {
			cpu["topology-aware-scheduler"] = ms / 100
			down["topology-aware-scheduler"] = ms / 200
		}
		return waveResult{Pods: 100, Bound: 100, PodsPerSec: ms,
			Cost:     &cost{CPUSeconds: cpu},
			Teardown: &cost{CPUSeconds: down}}
	}
	return summarize(kindResult{Size: 1, Kind: kind, Waves: []waveResult{wave(first), wave(second), wave(second)}})
}

// The legacy stack's first wave, its only one on fresh NodeResourceTopology, is
// reported apart from the median wave, with its spread over the runs.
func TestTalkFiguresKeepTheFirstWaveApart(t *testing.T) {
	run := func(draFirst, legacyFirst float64) repeat {
		return repeat{
			DRA:    stackResult{Kinds: []kindResult{twoWaves("aligned", draFirst, 80)}},
			Legacy: &stackResult{Kinds: []kindResult{twoWaves("single-numa-node", legacyFirst, 3)}},
		}
	}
	first := run(80, 160)
	r := results{DRA: first.DRA, Legacy: first.Legacy, Repeats: []repeat{run(80, 100), run(80, 200)}}
	var b strings.Builder
	r.talkFigures(&b)
	r.cpuPerPod(&b)
	got := b.String()
	for _, want := range []string{
		// First waves: DRA 80 against legacy 160, 100, 200: ratios 0.5, 0.8, 0.4.
		"| throughput, the run's first wave (legacy: on fresh NodeResourceTopology), pods/s | 1 | 80.0 | 160.0 | 0.5 (0.4-0.8, 3 runs) |",
		// Median waves: 80 against 3.
		"| throughput, saturating waves, median wave, pods/s | 1 | 80.0 | 3.0 | 26.7 (26.7-26.7, 3 runs) |",
		// CPU of the first wave alone: 8 s and 16 s over 100 pods.
		"| 1, first wave | kube-apiserver | 80.00 | 160.00 | 12 | 6 | 40.00 | 80.00 |",
		// The median wave: 80 and 3 ms a pod.
		"| 1 | kube-apiserver | 80.00 | 3.00 |",
		// A process of the legacy stack alone has its own row.
		"| 1, first wave | topology-aware-scheduler | - | 16.00 | - | 62 | - | 8.00 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// Requests per bound pod: Lease renewals and the other periodic requests
// apart from the rest, and the writes among the rest.
func TestRequestShares(t *testing.T) {
	s := stackResult{PodsBound: 2, RequestsByClient: map[string]map[string]int{
		"kwok":                 {"update leases": 10, "watch leases": 1, "patch nodes": 3, "patch pods": 4},
		"metrics-scraper":      {"get -": 1},
		"nfd-topology-updater": {"get noderesourcetopologies": 5, "update noderesourcetopologies": 6},
		"scale":                {"create pods": 2, "list pods": 1, "watch pods": 2},
	}}
	got, ok := s.requestShares()
	want := requestShare{all: 35.0 / 2, leases: 10.0 / 2, periodic: 7.0 / 2, rest: 18.0 / 2, restWrites: 12.0 / 2, nrtWrites: 6.0 / 2}
	if !ok || got != want {
		t.Errorf("requestShares() = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := (&stackResult{}).requestShares(); ok {
		t.Error("requestShares of a stack that bound no pod: ok")
	}
}

// The committed reports of the fair-method runs are what the report's code
// renders from the results beside them (go run . -rerender DIR writes them again).
func TestCommittedReportsRenderFromTheirData(t *testing.T) {
	for _, name := range []string{"scale-100-fair", "scale-500-fair", "scale-500-no-nrt", "scale-100-list-form", "controller-writes-100", "controller-writes-500", "controller-writes-2000", "controller-writes-2000-one-a-second", "attribute-sets-500"} {
		raw, err := os.ReadFile(filepath.Join("../../docs/benchmarks", name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var r results
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s.json: %v", name, err)
		}
		report, err := os.ReadFile(filepath.Join("../../docs/benchmarks", name+".md"))
		if err != nil {
			t.Fatal(err)
		}
		if r.markdown() != string(report) {
			t.Errorf("docs/benchmarks/%s.md is not what the report's code renders from %s.json: "+
				"copy the .json to DIR/results.json, run go run . -rerender DIR and commit DIR/report.md as %s.md", name, name, name)
		}
	}
}
