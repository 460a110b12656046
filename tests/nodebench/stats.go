package main

import (
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Summary of one latency series, in microseconds.
type Summary struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	Max  float64 `json:"max_us"`
	Mean float64 `json:"mean_us"`
}

// percentile is nearest-rank (the same method as kubelet-plugin/benches/prepare.rs),
// so p99 of 200 samples is the 2nd slowest one, not an interpolation between samples.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}

func summarize(samples []time.Duration) Summary {
	us := make([]float64, len(samples))
	var sum float64
	for i, d := range samples {
		us[i] = float64(d.Nanoseconds()) / 1e3
		sum += us[i]
	}
	sort.Float64s(us)
	s := Summary{N: len(us)}
	if len(us) == 0 {
		return s
	}
	s.P50, s.P90, s.P99 = percentile(us, 50), percentile(us, 90), percentile(us, 99)
	s.Max = us[len(us)-1]
	s.Mean = sum / float64(len(us))
	return s
}

// procStatusKiB reads one "<Key>: <n> kB" line of /proc/<pid>/status.
func procStatusKiB(pid int, key string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return parseStatusKiB(string(b), key)
}

func parseStatusKiB(status, key string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		return strconv.ParseInt(f[0], 10, 64)
	}
	return 0, os.ErrNotExist
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
