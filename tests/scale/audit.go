package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"time"
)

// auditPolicy records every request's metadata once, when it completes: enough to
// count requests by client, verb and resource.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
`

type auditEvent struct {
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource string `json:"resource"`
	} `json:"objectRef"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

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
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev auditEvent
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		at := ev.RequestReceivedTimestamp
		if at.Before(from) || at.After(to) {
			continue
		}
		res := "-"
		if ev.ObjectRef != nil {
			res = ev.ObjectRef.Resource
		}
		c := client(ev.UserAgent)
		if out[c] == nil {
			out[c] = map[string]int{}
		}
		out[c][ev.Verb+" "+res]++
	}
	return out, sc.Err()
}

var writeVerbs = map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true}

// writesAndLists sums one client's writes (Lease renewals apart) and LISTs.
func writesAndLists(counts map[string]int) (writes, leaseWrites, lists int) {
	for k, n := range counts {
		verb, res, _ := strings.Cut(k, " ")
		switch {
		case writeVerbs[verb] && res == "leases":
			leaseWrites += n
		case writeVerbs[verb]:
			writes += n
		case verb == "list":
			lists += n
		}
	}
	return writes, leaseWrites, lists
}
