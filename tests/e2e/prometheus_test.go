package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"topodra.dev/tests/cluster"
)

// TestPrometheusRules renders the chart's PrometheusRule with its default thresholds
// and runs Prometheus' own rule checker on it: `promtool check rules` (syntax, PromQL)
// and `promtool test rules` with tests/prometheus/rules_test.yaml, which drives every
// alert with series shaped as the chart's ServiceMonitors store them. promtool comes
// from Debian's prometheus package (tests/scripts/setup.sh installs it).
func TestPrometheusRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if cluster.RequireTools() {
			t.Fatal("promtool is not on PATH (Debian package prometheus; tests/scripts/setup.sh installs it)")
		}
		t.Skip("skipping: promtool is not on PATH (Debian package prometheus)")
	}
	dir := t.TempDir()
	rendered := helmTemplate(t, dir, "--set", "metrics.prometheusRule.enabled=true")
	doc := manifestDoc(t, rendered, "PrometheusRule")
	var rule struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(doc), &rule); err != nil {
		t.Fatal(err)
	}
	groups, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(repoRoot(t), "tests", "prometheus", "rules_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}
