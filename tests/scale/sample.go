package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// cpuMetric is the API server's own CPU time, from its /metrics.
const cpuMetric = "process_cpu_seconds_total"

// seriesEvery is how often (in samples, one a second) the memory series keeps a
// point: coarse enough that a long idle period stays a few hundred points.
const seriesEvery = 5

// memSeries is RSS over time, per component, for the plots: point i was taken
// i*IntervalSeconds after the sampler started (0 where the process was not
// running), and Phases says when each phase of the run began.
type memSeries struct {
	IntervalSeconds float64            `json:"intervalSeconds"`
	Phases          map[string]float64 `json:"phases"`
	RSS             map[string][]int64 `json:"rssBytes"`
}

// memSampler reads the resident memory of processes once a second and keeps, per
// component, the peak, the last value and a coarser series.
type memSampler struct {
	mu     sync.Mutex
	pids   map[string]int
	peak   map[string]int64
	last   map[string]int64
	t0     time.Time
	n      int
	points int
	ser    memSeries
	stop   chan struct{}
	done   chan struct{}
}

func newMemSampler(pids map[string]int) *memSampler {
	s := &memSampler{pids: pids, peak: map[string]int64{}, last: map[string]int64{}, t0: time.Now(),
		ser:  memSeries{IntervalSeconds: seriesEvery, Phases: map[string]float64{}, RSS: map[string][]int64{}},
		stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *memSampler) run() {
	defer close(s.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.sample()
		s.mu.Lock()
		if s.n%seriesEvery == 0 {
			for name := range s.pids {
				// A component added late gets zeros before it ran, so that every
				// series shares the same time axis.
				for len(s.ser.RSS[name]) < s.points {
					s.ser.RSS[name] = append(s.ser.RSS[name], 0)
				}
				s.ser.RSS[name] = append(s.ser.RSS[name], s.last[name])
			}
			s.points++
		}
		s.n++
		s.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

func (s *memSampler) sample() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, pid := range s.pids {
		rss, err := rssBytes(pid)
		if err != nil {
			continue
		}
		s.last[name] = rss
		if rss > s.peak[name] {
			s.peak[name] = rss
		}
	}
}

// add starts sampling another process.
func (s *memSampler) add(name string, pid int) {
	s.mu.Lock()
	s.pids[name] = pid
	s.mu.Unlock()
}

// reset forgets the peaks: the next phase starts its own.
func (s *memSampler) reset() {
	s.mu.Lock()
	s.peak = map[string]int64{}
	s.mu.Unlock()
	s.sample()
}

// mark notes that a phase of the run starts now.
func (s *memSampler) mark(phase string) {
	s.mu.Lock()
	s.ser.Phases[phase] = time.Since(s.t0).Seconds()
	s.mu.Unlock()
}

func (s *memSampler) series() *memSeries {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &memSeries{IntervalSeconds: s.ser.IntervalSeconds, Phases: map[string]float64{}, RSS: map[string][]int64{}}
	for k, v := range s.ser.Phases {
		out.Phases[k] = v
	}
	for k, v := range s.ser.RSS {
		out.RSS[k] = slices.Clone(v)
	}
	return out
}

func (s *memSampler) snapshot() (peak, last map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	peak, last = map[string]int64{}, map[string]int64{}
	for k, v := range s.peak {
		peak[k] = v
	}
	for k, v := range s.last {
		last[k] = v
	}
	return peak, last
}

func (s *memSampler) close() {
	close(s.stop)
	<-s.done
}

// rssBytes is VmRSS of a process.
func rssBytes(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// apiserverMetrics scrapes the API server's /metrics as admin and returns the samples
// whose name is one of names, keyed by their full text before the value.
func apiserverMetrics(ctx context.Context, cs kubernetes.Interface, names ...string) (map[string]float64, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
	}
	return keepSamples(bytes.NewReader(raw), keep), nil
}

// requestsByVerbResource sums apiserver_request_total by verb and resource.
func requestsByVerbResource(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if !strings.HasPrefix(k, "apiserver_request_total{") {
			continue
		}
		out[label(k, "verb")+" "+label(k, "resource")] += v
	}
	return out
}

func label(sample, name string) string {
	i := strings.Index(sample, name+`="`)
	if i < 0 {
		return ""
	}
	rest := sample[i+len(name)+2:]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return rest[:j]
}

func diff(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// parseMetrics reads a Prometheus text exposition and keeps the samples whose name
// starts with prefix, keyed by their text before the value.
func parseMetrics(r io.Reader, prefix string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
