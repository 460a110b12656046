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
	return countRequests(evs), nil
}

// countRequests counts audit records by client, then "verb resource".
func countRequests(evs []cluster.AuditEvent) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, ev := range evs {
		c := client(ev.UserAgent)
		if out[c] == nil {
			out[c] = map[string]int{}
		}
		out[c][ev.Verb+" "+ev.Resource()]++
	}
	return out
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

// The kinds of request requestKind tells apart.
const (
	perPodRequest   = "per pod"
	leaseRequest    = "Lease renewals"
	periodicRequest = "other periodic"
)

// requestKind sorts one "verb resource" count by what makes it, for
// requestShares and the node path's figures: Lease renewals; the other
// requests that grow with the run's length rather than with its pods (watch
// starts, non-resource GETs, node status writes); and the rest, per-pod work.
// What the rest cannot tell apart: a plugin's periodic check of its prepared
// claims (a GET each, every 10 minutes by default) is a GET of a claim like the
// one of a prepare.
func requestKind(verbResource string) string {
	verb, res, _ := strings.Cut(verbResource, " ")
	switch {
	case res == "leases" && verb != "watch":
		return leaseRequest
	case verb == "watch", res == "-", res == "nodes" && cluster.WriteVerbs[verb]:
		return periodicRequest
	}
	return perPodRequest
}

// requestShare is one stack's API requests over the common waves per bound pod
// (audit log), split by what makes them. leases are Lease renewals (kwok's node
// Leases, the API server's own); periodic is the rest of what grows with the
// run's length rather than with its pods: node status writes, watch starts and
// non-resource GETs (health checks, discovery, the harness's /metrics reads);
// rest is everything else, restWrites the writes among it. nrtWrites are the
// NodeResourceTopology writes (topodra's controller; the simulated updater),
// which rest holds. What rest cannot tell apart: the updater writes at its
// interval and on admissions, and a scheduler that retries a pod writes its
// events and status again, so part of rest grows with how long pods wait.
type requestShare struct {
	all, leases, periodic, rest, restWrites, nrtWrites float64
}

// requestShares splits s's requests over the common waves; false when no pod
// was bound.
func (s *stackResult) requestShares() (requestShare, bool) {
	if s.PodsBound == 0 {
		return requestShare{}, false
	}
	var sh requestShare
	for _, counts := range s.RequestsByClient {
		for k, n := range counts {
			verb, res, _ := strings.Cut(k, " ")
			v := float64(n)
			sh.all += v
			switch requestKind(k) {
			case leaseRequest:
				sh.leases += v
			case periodicRequest:
				sh.periodic += v
			default:
				sh.rest += v
				if cluster.WriteVerbs[verb] {
					sh.restWrites += v
				}
				if cluster.WriteVerbs[verb] && res == "noderesourcetopologies" {
					sh.nrtWrites += v
				}
			}
		}
	}
	per := float64(s.PodsBound)
	for _, f := range []*float64{&sh.all, &sh.leases, &sh.periodic, &sh.rest, &sh.restWrites, &sh.nrtWrites} {
		*f /= per
	}
	return sh, true
}
