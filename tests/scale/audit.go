package main

import (
	"strings"
	"time"

	"topodra.dev/tests/cluster"
)

// client names the program behind a user agent: "kube-scheduler/v1.37.2 (linux/amd64)
// kubernetes/..." is kube-scheduler.
func client(userAgent string) string {
	name, _, _ := strings.Cut(userAgent, "/")
	name, _, _ = strings.Cut(name, " ")
	if name == "" {
		return "unknown"
	}
	return name
}

// auditCounts counts requests between from and to by client, then "verb resource".
func auditCounts(path string, from, to time.Time) (map[string]map[string]int, error) {
	evs, err := cluster.ReadAuditLog(path, from, to)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]int{}
	for _, ev := range evs {
		c := client(ev.UserAgent)
		if out[c] == nil {
			out[c] = map[string]int{}
		}
		out[c][ev.Verb+" "+ev.Resource()]++
	}
	return out, nil
}

// writesAndLists sums one client's writes (Lease renewals apart) and LISTs.
func writesAndLists(counts map[string]int) (writes, leaseWrites, lists int) {
	for k, n := range counts {
		verb, res, _ := strings.Cut(k, " ")
		switch {
		case cluster.WriteVerbs[verb] && res == "leases":
			leaseWrites += n
		case cluster.WriteVerbs[verb]:
			writes += n
		case verb == "list":
			lists += n
		}
	}
	return writes, leaseWrites, lists
}
