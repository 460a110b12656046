package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fairRun = "../../../../docs/benchmarks/scale-100-fair.json"

// The plots of the committed runs come out, and small enough for the repository.
func TestPlotsOfTheCommittedRuns(t *testing.T) {
	dir := t.TempDir()
	withSeries := filepath.Join(dir, "series.json")
	r := results{Nodes: 2, DRA: stack{MemorySeries: &memSeries{
		IntervalSeconds: 5,
		Phases:          map[string]float64{"waves": 5, "idle": 15},
		RSS:             map[string][]int64{"kube-apiserver": {100 << 20, 300 << 20, 250 << 20, 260 << 20}, "etcd": {0, 50 << 20, 60 << 20, 60 << 20}},
	}}}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(withSeries, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(fairRun, withSeries, withSeries+","+withSeries, dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plot-throughput.png", "plot-latency.png", "plot-cpu.png", "plot-heap.png", "plot-memory.png", "plot-apiserver-memory.png"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 100<<10 {
			t.Errorf("%s is %d bytes, over 100 KiB", name, st.Size())
		}
	}
}

// A run of the DRA stack alone has nothing to compare: it is refused by name,
// not drawn as a half-empty plot.
func TestARunWithoutLegacyIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dra-only.json")
	if err := os.WriteFile(path, []byte(`{"nodes": 500, "dra": {"kinds": []}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(path, "", "", dir)
	if err == nil || !strings.Contains(err.Error(), "no run with both stacks") {
		t.Fatalf("got %v", err)
	}
}

// The spread of the runs is their median and range, the median of an even
// count the mean of the middle two.
func TestSpreadOfRuns(t *testing.T) {
	if sp, _ := spreadOf([]float64{3, 1, 2}); sp != (spread{2, 1, 3}) {
		t.Errorf("odd: %+v", sp)
	}
	if sp, _ := spreadOf([]float64{4, 1, 2, 3}); sp != (spread{2.5, 1, 4}) {
		t.Errorf("even: %+v", sp)
	}
	if _, ok := spreadOf(nil); ok {
		t.Error("no runs gave a spread")
	}
}

func TestTicksAreRound(t *testing.T) {
	got := ticks{}.Ticks(0, 37)
	if len(got) < 3 || len(got) > 9 || got[1].Value != 5 {
		t.Errorf("ticks over [0, 37]: %v", got)
	}
	var labelled []string
	for _, tk := range (logTicks{}).Ticks(3, 250) {
		if tk.Label != "" {
			labelled = append(labelled, tk.Label)
		}
	}
	if strings.Join(labelled, ",") != "5,10,20,50,100,200" {
		t.Errorf("log ticks over [3, 250] labelled %v", labelled)
	}
}
