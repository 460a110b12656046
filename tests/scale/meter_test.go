package main

import (
	"strings"
	"testing"
	"time"
)

func TestProcStatCPUCountsAfterTheCommandName(t *testing.T) {
	// A command name with spaces and a parenthesis must not shift the fields.
	stat := "4242 (kube sched) er) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 12 0 100 0 0"
	got, err := parseProcStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if got != 3.0 { // (250 + 50) ticks at 100 a second
		t.Errorf("cpu %v s, want 3", got)
	}
	if _, err := parseProcStatCPU("4242 (short) S 1"); err == nil {
		t.Error("a short line must be an error")
	}
	if got := procStartTime(stat); got != "100" {
		t.Errorf("start time %q, want 100 (field 22)", got)
	}
	if got := procStartTime("4242 (short) S 1"); got != "" {
		t.Errorf("start time of a short line %q, want none", got)
	}
}

func TestKeepSamplesByExactName(t *testing.T) {
	page := `# HELP go_memstats_heap_inuse_bytes x
go_memstats_heap_inuse_bytes 1.5e+07
go_memstats_heap_inuse_bytes_extra 9
rest_client_rate_limiter_duration_seconds_sum{host="h",verb="POST"} 0.25
rest_client_rate_limiter_duration_seconds_bucket{host="h",verb="POST",le="0.1"} 3
scheduler_goroutines{operation="binding"} 4
`
	got := keepSamples(strings.NewReader(page), keptMetrics)
	if len(got) != 3 || got["go_memstats_heap_inuse_bytes"] != 1.5e7 || got[`scheduler_goroutines{operation="binding"}`] != 4 {
		t.Errorf("kept %v", got)
	}
}

func TestBetweenAndBoundBy(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	a := reading{at: t0, cpu: map[string]float64{"kube-scheduler": 10, "kube-apiserver": 20}, busy: 100, total: 1000,
		samples: map[string]map[string]float64{"kube-scheduler": {
			`rest_client_rate_limiter_duration_seconds_sum{verb="POST"}`:                                             1,
			`scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"}`:                      10,
			`scheduler_framework_extension_point_duration_seconds_sum{extension_point="PreBind",status="Success"}`:   1,
			`scheduler_framework_extension_point_duration_seconds_count{extension_point="PreBind",status="Success"}`: 10,
		}}}
	b := reading{at: t0.Add(10 * time.Second), cpu: map[string]float64{"kube-scheduler": 19.5, "kube-apiserver": 25, "topodra-controller": 1},
		busy: 700, total: 3000,
		samples: map[string]map[string]float64{"kube-scheduler": {
			`rest_client_rate_limiter_duration_seconds_sum{verb="POST"}`:                                             1.001,
			`scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"}`:                      110,
			`scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"}`:                  5,
			`scheduler_framework_extension_point_duration_seconds_sum{extension_point="PreBind",status="Success"}`:   3,
			`scheduler_framework_extension_point_duration_seconds_count{extension_point="PreBind",status="Success"}`: 110,
		}}}
	c := between(a, b, peaks{binding: map[string]float64{"kube-scheduler": 7}, heap: map[string]float64{"kube-scheduler": 5e7}})
	if c.Seconds != 10 || c.CPUSeconds["kube-scheduler"] != 9.5 || c.CPUSeconds["topodra-controller"] != 1 || c.MachineBusy != 0.3 {
		t.Fatalf("cost %+v", c)
	}
	sf := c.Schedulers["kube-scheduler"]
	if sf.Attempts["scheduled"] != 100 || sf.Attempts["unschedulable"] != 5 || sf.ExtensionPointMs["PreBind"] != 2000 ||
		sf.ExtensionPointCalls["PreBind"] != 100 || sf.BindingGoroutinesPeak != 7 || sf.HeapPeakBytes != 5e7 {
		t.Errorf("scheduler figures %+v", sf)
	}
	if got := boundBy(c, 2); !strings.HasPrefix(got, "CPU of kube-scheduler at 0.95 cores") {
		t.Errorf("bound by %q: the scheduler near a whole core", got)
	}
	c.LimiterWaitSeconds["kube-controller-manager"] = 3
	if got := boundBy(c, 2); !strings.HasPrefix(got, "client rate limiter of kube-controller-manager") {
		t.Errorf("bound by %q: 3 s waited in 10 s", got)
	}
	c.LimiterWaitSeconds["kube-controller-manager"] = 0
	c.MachineBusy = 0.95
	if got := boundBy(c, 2); !strings.HasPrefix(got, "machine CPU (95% of 2 cores") {
		t.Errorf("bound by %q", got)
	}
}

func TestChurnPlanIsTheSameForBothStacksAndMixed(t *testing.T) {
	c := config{nodes: 100, churn: 60 * time.Second, churnRate: 10}
	p, q := planChurn(c), planChurn(c)
	if len(p.sizes) != 600 {
		t.Fatalf("%d pods, want 600", len(p.sizes))
	}
	count := map[int]int{}
	for i := range p.sizes {
		if p.sizes[i] != q.sizes[i] || p.life[i] != q.life[i] {
			t.Fatal("two plans of one config differ")
		}
		count[p.sizes[i]]++
	}
	for _, m := range churnMix {
		if share := float64(count[m.k]) / 600; share < m.share-0.08 || share > m.share+0.08 {
			t.Errorf("%d-GPU share %.2f, want about %.2f", m.k, share, m.share)
		}
	}
	// Little's law: 10 pods/s × mean life × 1.9 GPUs ≈ 75% of 800 GPUs.
	var life time.Duration
	for _, l := range p.life {
		life += l
	}
	mean := life.Seconds() / 600
	if busy := 10 * mean * 1.9 / 800; busy < 0.65 || busy > 0.85 {
		t.Errorf("busy share %.2f, want about %.2f", busy, churnBusy)
	}
}

func TestPerPodTakesTheBackgroundOff(t *testing.T) {
	ws := []waveResult{
		{Bound: 100, Cost: &cost{CPUSeconds: map[string]float64{"kube-apiserver": 3, "kwok": 0.1},
			BackgroundCPUSeconds: map[string]float64{"kube-apiserver": 1, "kwok": 0.5}}},
		{Bound: 0, Cost: &cost{CPUSeconds: map[string]float64{"kube-apiserver": 99}}}, // nothing bound: no figure
		{Bound: 50, Cost: &cost{CPUSeconds: map[string]float64{"kube-apiserver": 1}}},
	}
	got := perPod(ws, func(w waveResult) *cost { return w.Cost })
	// (3-1)/100 and 1/50 s: 20 ms each; kwok's background exceeds its CPU: 0.
	if got["kube-apiserver"] != 20 || got["kwok"] != 0 {
		t.Errorf("per pod %v", got)
	}
}

// A pod never bound counts in the percentiles until the wave gave up, and a
// wave that gave up is timed to then: a stack that places nothing does not get
// 0 ms.
func TestWaveTimingCountsPodsNeverBound(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	pods := []podTimes{{at(0), at(1)}, {at(0), at(2)}, {at(0), time.Time{}}, {at(0), time.Time{}}}

	r := waveResult{Pods: 4, Bound: 2, TimedOutPod: 2}
	r.timed(start, at(10), pods)
	if r.Seconds != 10 || r.PodsPerSec != 0.2 || r.P50Ms != 10000 || r.P99Ms != 10000 {
		t.Errorf("half bound: %+v", r)
	}

	none := waveResult{Pods: 2, TimedOutPod: 2}
	none.timed(start, at(70), pods[2:])
	if none.P50Ms != 70000 || none.PodsPerSec != 0 {
		t.Errorf("none bound: %+v", none)
	}

	all := waveResult{Pods: 2, Bound: 2}
	all.timed(start, at(70), pods[:2])
	if all.Seconds != 2 || all.PodsPerSec != 1 || all.P50Ms != 2000 {
		t.Errorf("all bound: %+v", all)
	}
}
