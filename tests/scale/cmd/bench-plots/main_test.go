package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The plots of a committed run come out, and small enough for the repository.
func TestPlotsOfACommittedRun(t *testing.T) {
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
	if err := run("../../../../docs/benchmarks/scale-500.json", withSeries, withSeries+","+withSeries, dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plot-latency.png", "plot-throughput.png", "plot-memory.png", "plot-apiserver-memory.png"} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 100<<10 {
			t.Errorf("%s is %d bytes, over 100 KiB", name, st.Size())
		}
	}
}

func TestTicksAreRound(t *testing.T) {
	got := ticks{}.Ticks(0, 37)
	if len(got) < 3 || len(got) > 9 || got[1].Value != 5 {
		t.Errorf("ticks over [0, 37]: %v", got)
	}
}
