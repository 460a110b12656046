package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// AuditPolicy records every request's metadata once, when it completes: enough to
// count requests by user or client, verb and resource.
const AuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
`

// WriteVerbs are the verbs that change objects.
var WriteVerbs = map[string]bool{"create": true, "update": true, "patch": true, "delete": true, "deletecollection": true}

// AuditEvent is the part of an audit record (audit.k8s.io/v1 Event) the tests and
// benchmarks read.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource string `json:"resource"`
		Name     string `json:"name"`
	} `json:"objectRef"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// Resource is the record's resource, "-" for a request about none.
func (ev AuditEvent) Resource() string {
	if ev.ObjectRef == nil {
		return "-"
	}
	return ev.ObjectRef.Resource
}

// AuditLogArgs writes AuditPolicy into dir and returns the kube-apiserver flags that
// write its audit log as JSON, and the log's path.
func AuditLogArgs(dir string) ([]string, string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(AuditPolicy), 0o644); err != nil {
		return nil, "", err
	}
	log := filepath.Join(dir, "audit.log")
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + log, "--audit-log-format=json"}, log, nil
}

// ReadAuditLog returns the audit records received between from and to, in the log's
// order (that of their completion). A record the API server is still writing (a
// last line cut short) is left out; a bad line anywhere else is an error.
func ReadAuditLog(path string, from, to time.Time) ([]AuditEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []AuditEvent
	var bad error
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if bad != nil {
			return nil, bad
		}
		var ev AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			bad = fmt.Errorf("%s line %d: %w", path, line, err)
			continue
		}
		if at := ev.RequestReceivedTimestamp; at.Before(from) || at.After(to) {
			continue
		}
		out = append(out, ev)
	}
	return out, sc.Err()
}
