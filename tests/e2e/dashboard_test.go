package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

// The dashboard the chart ships (metrics.grafanaDashboard), relative to the repository.
var dashboardFile = filepath.Join("deploy", "helm", "topodra", "dashboards", "topodra.json")

// The parts of a Grafana dashboard these tests read.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []dashVar `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashVar struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      any             `json:"query"`
	Datasource *dashDatasource `json:"datasource"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
	Options    []struct {
		Value string `json:"value"`
	} `json:"options"`
}

type dashPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *dashDatasource `json:"datasource"`
	GridPos    struct {
		X int `json:"x"`
		W int `json:"w"`
		H int `json:"h"`
	} `json:"gridPos"`
	Targets []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource *dashDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's
}

func loadDashboard(t *testing.T) ([]byte, dashboard) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return raw, d
}

// allPanels flattens rows: a collapsed row holds its panels itself.
func allPanels(ps []dashPanel) []dashPanel {
	var out []dashPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// Grafana's built-in variables the queries may use, and what the tests put in their
// place: a rate window long enough to span the whole scenario, so a counter that
// moved at any point of the run shows it.
var dashBuiltins = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "15s",
	"__range":         "10m",
}

var dashVarRef = regexp.MustCompile(`\$\{?(\w+)\}?`)

const promDatasourceUID = "${datasource}"

// TestDashboardStructure checks what Grafana needs of the dashboard before any query
// runs: the JSON parses, every panel that queries reads the datasource variable
// (so the dashboard works with whatever the Prometheus is called), panel ids are
// unique, every target has a refId (unique in its panel) and an expression, and
// every variable an expression uses is defined.
func TestDashboardStructure(t *testing.T) {
	t.Parallel()
	_, d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed for the sidecar to keep one dashboard across updates", d.UID, d.Title)
	}
	vars := map[string]dashVar{}
	for _, v := range d.Templating.List {
		if _, dup := vars[v.Name]; dup {
			t.Errorf("variable %s defined twice", v.Name)
		}
		vars[v.Name] = v
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || ds.Query != "prometheus" {
		t.Errorf("no variable datasource of type datasource for prometheus: %+v", ds)
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != promDatasourceUID) {
			t.Errorf("variable %s: datasource %+v, want the datasource variable", v.Name, v.Datasource)
		}
	}
	if _, ok := vars["node"]; !ok {
		t.Error("no node variable")
	}
	checkRefs := func(where, s string) {
		for _, m := range dashVarRef.FindAllStringSubmatch(s, -1) {
			if _, ok := vars[m[1]]; !ok && dashBuiltins[m[1]] == "" {
				t.Errorf("%s: %s is neither a variable of the dashboard nor one of Grafana's that the tests know", where, m[0])
			}
		}
	}
	ids := map[int]string{}
	queries := 0
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.ID <= 0 {
			t.Errorf("%s: no id", where)
		} else if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", where, other)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("%s: no title", where)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v outside Grafana's 24 columns", where, p.GridPos)
		}
		checkRefs(where, p.Title)
		if p.Type == "row" {
			if len(p.Targets) > 0 {
				t.Errorf("%s: a row with queries", where)
			}
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != promDatasourceUID {
			t.Errorf("%s: datasource %+v, want {prometheus %s}", where, p.Datasource, promDatasourceUID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		refs := map[string]bool{}
		for i, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s target %d: refId %q missing or repeated", where, i, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s target %s: no expr", where, tg.RefID)
			}
			if tg.Datasource != nil && *tg.Datasource != *p.Datasource {
				t.Errorf("%s target %s: datasource %+v differs from the panel's", where, tg.RefID, tg.Datasource)
			}
			checkRefs(where, tg.Expr)
			queries++
		}
	}
	if queries == 0 {
		t.Error("the dashboard has no queries")
	}
}

// dashQuery is one expression to evaluate, with the template variables replaced.
type dashQuery struct {
	where string // panel and refId, or the variable
	expr  string
}

// dashboardQueries expands every target's expression as Grafana would with the
// widest selection: a query variable by its All value, each value of a custom
// variable in turn (so every alignment level is evaluated), Grafana's own by
// dashBuiltins. The query variables' own label_values() queries are included as
// the PromQL Grafana's Prometheus datasource sends for them.
func dashboardQueries(t *testing.T, d dashboard) []dashQuery {
	t.Helper()
	fixed := map[string]string{}
	for k, v := range dashBuiltins {
		fixed[k] = v
	}
	choices := map[string][]string{}
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			fixed[v.Name] = "" // only in datasource fields
		case "query":
			if !v.IncludeAll || v.AllValue == "" {
				t.Fatalf("variable %s: the tests select All (a regex); give it includeAll and an allValue", v.Name)
			}
			fixed[v.Name] = v.AllValue
		case "custom":
			for _, o := range v.Options {
				choices[v.Name] = append(choices[v.Name], o.Value)
			}
			if len(choices[v.Name]) == 0 {
				t.Fatalf("custom variable %s has no options", v.Name)
			}
		default:
			t.Fatalf("variable %s: type %s is not one the tests expand", v.Name, v.Type)
		}
	}
	expand := func(where, expr string) []dashQuery {
		out := []dashQuery{{where, expr}}
		for name, vals := range choices {
			var next []dashQuery
			for _, q := range out {
				if !regexp.MustCompile(`\$\{?` + name + `\b\}?`).MatchString(q.expr) {
					next = append(next, q)
					continue
				}
				for _, val := range vals {
					e := regexp.MustCompile(`\$\{?`+name+`\b\}?`).ReplaceAllLiteralString(q.expr, val)
					next = append(next, dashQuery{fmt.Sprintf("%s [%s=%s]", q.where, name, val), e})
				}
			}
			out = next
		}
		for i := range out {
			out[i].expr = dashVarRef.ReplaceAllStringFunc(out[i].expr, func(m string) string {
				name := dashVarRef.FindStringSubmatch(m)[1]
				if v, ok := fixed[name]; ok {
					return v
				}
				t.Fatalf("%s: no value for %s", where, m)
				return m
			})
		}
		return out
	}
	var qs []dashQuery
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		s, _ := v.Query.(string)
		m := labelValues.FindStringSubmatch(strings.TrimSpace(s))
		if m == nil {
			t.Fatalf("variable %s: query %v is not label_values(<selector>, <label>)", v.Name, v.Query)
		}
		qs = append(qs, expand("variable "+v.Name, fmt.Sprintf("group by (%s) (%s)", m[2], m[1]))...)
	}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			qs = append(qs, expand(fmt.Sprintf("panel %d %q %s", p.ID, p.Title, tg.RefID), tg.Expr)...)
		}
	}
	return qs
}

// promTools finds Debian's prometheus and promtool, or skips (fails with
// TOPODRA_REQUIRE_TOOLS=1).
func promTools(t *testing.T) (server, promtool string) {
	t.Helper()
	for _, name := range []string{"prometheus", "promtool"} {
		p, err := exec.LookPath(name)
		if err != nil {
			if cluster.RequireTools() {
				t.Fatalf("%s is not on PATH (Debian package prometheus; tests/scripts/setup.sh installs it)", name)
			}
			t.Skipf("skipping: %s is not on PATH (Debian package prometheus)", name)
		}
		if name == "prometheus" {
			server = p
		} else {
			promtool = p
		}
	}
	return server, promtool
}

// promTarget is one scrape target with the labels the chart's ServiceMonitors give
// its series (the Prometheus Operator adds namespace and pod; the plugin's adds node).
type promTarget struct {
	job    string
	addr   string
	labels map[string]string
}

// startPrometheus runs a Prometheus server scraping targets every second, with its
// storage under the test's temporary directory, and returns its base URL once it
// is ready.
func startPrometheus(t *testing.T, bin string, targets []promTarget) string {
	t.Helper()
	dir := t.TempDir()
	type staticConfig struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	type scrapeConfig struct {
		JobName       string         `json:"job_name"`
		StaticConfigs []staticConfig `json:"static_configs"`
	}
	jobs := map[string]*scrapeConfig{}
	var order []string
	for _, tg := range targets {
		if jobs[tg.job] == nil {
			jobs[tg.job] = &scrapeConfig{JobName: tg.job}
			order = append(order, tg.job)
		}
		jobs[tg.job].StaticConfigs = append(jobs[tg.job].StaticConfigs, staticConfig{[]string{tg.addr}, tg.labels})
	}
	var scrapes []scrapeConfig
	for _, j := range order {
		scrapes = append(scrapes, *jobs[j])
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global":         map[string]string{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"scrape_configs": scrapes,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startProc(t, "prometheus", bin, []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
	}, nil, filepath.Join(dir, "prometheus.log"), addr)
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", p.log, tailFile(p.log, 30))
		}
	})
	base := "http://" + addr
	eventually(t, time.Minute, func() error {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("prometheus /-/ready: %s", resp.Status)
		}
		return nil
	})
	return base
}

// promSample is one element of an instant vector as the query API and promtool's
// JSON output give it.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// promQuery evaluates expr now through the HTTP API, for the scenario's waits.
func promQuery(base, expr string) ([]promSample, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, body.Error)
	}
	return body.Data.Result, nil
}

// waitProm waits until expr (a comparison, say) has a result in Prometheus.
func waitProm(t *testing.T, base, expr string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() error {
		r, err := promQuery(base, expr)
		if err != nil {
			return err
		}
		if len(r) == 0 {
			return fmt.Errorf("prometheus: %s is empty", expr)
		}
		return nil
	})
}

// TestDashboardQueries evaluates every query of the chart's dashboard with promtool
// against a Prometheus server that scraped a real run: the plugin on a simulated
// DGX H100 node and two controller replicas, labelled as the chart's ServiceMonitors
// label them, while two 4-GPU NUMA-aligned pods run (two prepares, so the latency
// histogram has a rate) and a third waits for GPUs. Each query must parse, evaluate
// and give at least one sample that is a number: a panel that would stay empty (or
// NaN) on a healthy cluster is a panel nobody can tell from a broken one, so such
// queries fall back to 0 in the dashboard itself.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	server, promtool := promTools(t)
	binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller")
	_, d := loadDashboard(t)
	queries := dashboardQueries(t, d)

	e := newEnv(t, envOptions{profile: "dgx-h100"})
	ctx := context.Background()
	// As deployed with nodeResourceTopology: the leader writes the objects, so its
	// write counters move.
	e.installNRTCRD()
	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "controller.kubeconfig")
	if err := harness.ControllerIdentity(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), kubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	var replicas []*proc
	for _, name := range []string{"ctrl-a", "ctrl-b"} {
		replicas = append(replicas, e.startController(name, kubeconfig))
	}
	e.waitRegistered(2 * time.Minute)
	e.waitDevices(8, time.Minute)
	for _, p := range replicas {
		eventually(t, time.Minute, p.ready)
	}

	ns := harness.PluginNamespace
	targets := []promTarget{{"topodra-kubelet-plugin", e.plugin.http,
		map[string]string{"namespace": ns, "node": e.node, "pod": "topodra-kubelet-plugin-" + e.node}}}
	for _, p := range replicas {
		targets = append(targets, promTarget{"topodra-controller", p.http, map[string]string{"namespace": ns, "pod": p.what}})
	}
	base := startPrometheus(t, server, targets)
	waitProm(t, base, fmt.Sprintf("count(up == 1) == %d", len(targets)), time.Minute)

	const podNS = "dash"
	e.createNamespace(podNS)
	tmpl := strings.Replace(manifestDoc(t, filepath.Join(repoRoot(t), "deploy", "examples", "01-four-gpus-one-numa-node.yaml"), "ResourceClaimTemplate"),
		"metadata:\n", "metadata:\n  namespace: "+podNS+"\n", 1)
	e.kubectlApply(tmpl)
	e.createPod(podNS, "four-a", "four-gpus-one-numa-node")
	e.waitPodRunning(podNS, "four-a", 2*time.Minute)
	// The histogram's series appear with the first prepare; a rate needs Prometheus
	// to have seen them before the second one.
	waitProm(t, base, `sum(topodra_prepare_duration_seconds_count) >= 1`, time.Minute)
	e.createPod(podNS, "four-b", "four-gpus-one-numa-node")
	e.waitPodRunning(podNS, "four-b", 2*time.Minute)
	e.createPod(podNS, "four-c", "four-gpus-one-numa-node")
	e.waitEvent(podNS, "four-c", "WaitingForGPUs", regexp.MustCompile("."), 2*time.Minute)
	if pod, err := e.admin.CoreV1().Pods(podNS).Get(ctx, "four-c", getOpts()); err != nil {
		t.Fatal(err)
	} else if pod.Status.Phase != v1.PodPending {
		t.Fatalf("four-c is %s; it should wait for GPUs", pod.Status.Phase)
	}
	for _, expr := range []string{
		`max(topodra_controller_pending_pods) == 1`,
		`max(topodra_controller_gpus{state="allocated"}) == 8`,
		`sum(rate(topodra_prepare_duration_seconds_count[5m])) > 0`,
		// Both 4-GPU claims prepared, counted by NUMA node, and the plugin's
		// requests by the code of their answers.
		`sum(topodra_numa_devices{state="prepared"}) == 8`,
		`sum(topodra_api_requests_total{code="200"}) > 0`,
	} {
		waitProm(t, base, expr, time.Minute)
	}

	var lines []string
	for _, q := range queries {
		cmd := exec.Command(promtool, "query", "instant", "-o", "json", base, q.expr)
		out, err := cmd.Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Errorf("%s: promtool query instant %s: %v\n%s%s", q.where, q.expr, err, out, stderr)
			continue
		}
		var samples []promSample
		if err := json.Unmarshal(out, &samples); err != nil {
			t.Errorf("%s: %s: promtool printed %s, not an instant vector: %v", q.where, q.expr, out, err)
			continue
		}
		var vals []string
		number := false
		for _, s := range samples {
			v := s.value()
			number = number || !math.IsNaN(v)
			vals = append(vals, fmt.Sprintf("%v=%g", s.Metric, v))
		}
		sort.Strings(vals)
		switch {
		case len(samples) == 0:
			t.Errorf("%s: %s: empty result after a run that should fill it", q.where, q.expr)
		case !number:
			t.Errorf("%s: %s: only NaN: %v", q.where, q.expr, vals)
		}
		lines = append(lines, fmt.Sprintf("%s: %s\n    => %s", q.where, q.expr, strings.Join(vals, ", ")))
	}
	t.Logf("%d dashboard queries evaluated:\n%s", len(queries), strings.Join(lines, "\n"))
}

// TestChartGrafanaDashboard: metrics.grafanaDashboard renders a ConfigMap carrying
// the dashboard file byte for byte (valid JSON, so the sidecar loads it), with the
// sidecar's label, the annotations given and the namespace chosen; off by default.
func TestChartGrafanaDashboard(t *testing.T) {
	t.Parallel()
	raw, _ := loadDashboard(t)
	dir := t.TempDir()
	if b, err := os.ReadFile(helmTemplate(t, dir)); err != nil {
		t.Fatal(err)
	} else if regexp.MustCompile(`(?m)^kind: ConfigMap\s*$`).Match(b) {
		t.Error("the default values render a ConfigMap; the dashboard is opt-in")
	}
	for _, c := range []struct {
		name string
		args []string
		ns   string
		anno map[string]string
	}{
		{"defaults", nil, "topodra-system", nil},
		{"elsewhere", []string{"--set", "metrics.grafanaDashboard.namespace=monitoring",
			"--set", "metrics.grafanaDashboard.annotations.grafana_folder=GPUs"}, "monitoring", map[string]string{"grafana_folder": "GPUs"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--set", "metrics.grafanaDashboard.enabled=true"}, c.args...)
			rendered := helmTemplate(t, t.TempDir(), args...)
			cm := decode[*v1.ConfigMap](t, manifestDoc(t, rendered, "ConfigMap"))
			if cm.Namespace != c.ns {
				t.Errorf("namespace %q, want %q", cm.Namespace, c.ns)
			}
			if cm.Labels["grafana_dashboard"] != "1" {
				t.Errorf("labels %v: no grafana_dashboard: \"1\" for the sidecar", cm.Labels)
			}
			for k, v := range c.anno {
				if cm.Annotations[k] != v {
					t.Errorf("annotations %v, want %s: %s", cm.Annotations, k, v)
				}
			}
			got, ok := cm.Data["topodra.json"]
			if !ok {
				t.Fatalf("no topodra.json in %v", cm.Data)
			}
			if !json.Valid([]byte(got)) {
				t.Fatal("topodra.json in the ConfigMap is not valid JSON")
			}
			if strings.TrimSpace(got) != strings.TrimSpace(string(raw)) {
				t.Errorf("topodra.json in the ConfigMap differs from %s", dashboardFile)
			}
		})
	}
}
