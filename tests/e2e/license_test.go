package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLicenseMatchesTheCrates: the LICENSE file at the root is the licence every
// crate declares (the workspace's `license`, which each crate inherits or repeats),
// so a change of one without the other fails here.
func TestLicenseMatchesTheCrates(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	text, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	// The first lines of each licence text this project could declare.
	heads := map[string]string{"Apache-2.0": "Apache License\nVersion 2.0, January 2004\n"}
	ws, err := os.ReadFile(filepath.Join(root, "Cargo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^license = "([^"]+)"$`).FindSubmatch(ws)
	if m == nil {
		t.Fatal("Cargo.toml: no workspace license")
	}
	declared := string(m[1])
	head, ok := heads[declared]
	if !ok {
		t.Fatalf("Cargo.toml declares %s, which this test does not know the text of", declared)
	}
	var lines []string
	for _, l := range strings.Split(string(text), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
		if len(lines) == 2 {
			break
		}
	}
	if got := strings.Join(lines, "\n") + "\n"; got != head {
		t.Errorf("LICENSE begins %q, not the %s text (%q)", got, declared, head)
	}

	manifests, err := filepath.Glob(filepath.Join(root, "*", "Cargo.toml"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(filepath.Join(root, "*", "*", "Cargo.toml"))
	manifests = append(manifests, more...)
	crates := 0
	for _, p := range manifests {
		rel, _ := filepath.Rel(root, p)
		if strings.HasPrefix(rel, "target"+string(filepath.Separator)) {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if !strings.Contains(s, "\n[package]") && !strings.HasPrefix(s, "[package]") {
			continue
		}
		crates++
		if strings.Contains(s, "\npublish = false") && !strings.Contains(s, "\nlicense") {
			continue // unpublished tooling (the fuzz targets) declares none
		}
		if !strings.Contains(s, "\nlicense.workspace = true") && !strings.Contains(s, "\nlicense = \""+declared+"\"") {
			t.Errorf("%s declares a licence other than the workspace's %s", rel, declared)
		}
	}
	if crates < 5 {
		t.Errorf("found only %d crates under %s; the glob no longer sees the workspace", crates, root)
	}
}
