package main

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i)*time.Microsecond)
	}
	s := summarize(d)
	if s.P50 != 100 || s.P99 != 198 || s.Max != 200 || s.N != 200 {
		t.Fatalf("got %+v", s)
	}
	if one := summarize([]time.Duration{7 * time.Microsecond}); one.P50 != 7 || one.P99 != 7 {
		t.Fatalf("one sample: %+v", one)
	}
}

func TestParseStatusKiB(t *testing.T) {
	st := "Name:\tx\nVmHWM:\t   20480 kB\nVmRSS:\t   19456 kB\n"
	if v, err := parseStatusKiB(st, "VmRSS"); err != nil || v != 19456 {
		t.Fatalf("VmRSS = %d, %v", v, err)
	}
	if _, err := parseStatusKiB(st, "VmSwap"); err == nil {
		t.Fatal("missing key: want an error")
	}
}
