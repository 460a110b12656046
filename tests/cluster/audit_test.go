package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadAuditLogWindowAndTornLastLine(t *testing.T) {
	at := func(s int) string { return time.Unix(1_800_000_000+int64(s), 0).UTC().Format(time.RFC3339Nano) }
	lines := []string{
		`{"verb":"get","user":{"username":"u"},"requestReceivedTimestamp":"` + at(1) + `"}`,
		`{"verb":"patch","objectRef":{"resource":"nodes","name":"a"},"requestReceivedTimestamp":"` + at(10) + `"}`,
		`{"verb":"list","requestReceivedTimestamp":"` + at(12) + `"}`,
		`{"verb":"watch","objectRef":{"reso`,
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := ReadAuditLog(path, time.Unix(1_800_000_005, 0), time.Unix(1_800_000_050, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Resource() != "nodes" || evs[1].Resource() != "-" {
		t.Fatalf("events %+v, want the patch of nodes and the list", evs)
	}

	// A bad line followed by others is a broken log, not a record being written.
	lines[1], lines[3] = `not json`, lines[1]
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAuditLog(path, time.Time{}, time.Unix(1_900_000_000, 0)); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("err = %v, want one naming line 2", err)
	}
}
