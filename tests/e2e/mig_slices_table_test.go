package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The slice-size run (tests/nodebench -mig-slices): what topodra and NVIDIA's plugin
// publish on the simulated DGX H100, with and without dynamic MIG. Only the fields
// the table and the prose quote.
type migSlicesReport struct {
	GPUs             int            `json:"gpus"`
	Runs             []migSlicesRun `json:"runs"`
	NvidiaDynamicMig *struct {
		Error string `json:"error"`
	} `json:"nvidiaDynamicMig"`
}

// migSlicesRun is one plugin's pool in one mode on one simulated node.
type migSlicesRun struct {
	Driver                    string   `json:"driver"`
	Mode                      string   `json:"mode"`
	Profile                   string   `json:"profile"`
	Slices                    *int     `json:"slices"`
	Devices                   int      `json:"devices"`
	CounterSets               int      `json:"counterSets"`
	CounterSetBytes           int      `json:"counterSetBytes"`
	SpecBytes                 int      `json:"specBytes"`
	BytesPerGPU               float64  `json:"bytesPerGPU"`
	AttributesPerDevice       float64  `json:"attributesPerDevice"`
	CapacitiesPerDevice       float64  `json:"capacitiesPerDevice"`
	ConsumedCountersPerDevice float64  `json:"consumedCountersPerDevice"`
	Error                     string   `json:"error"`
	LogTail                   []string `json:"logTail"`
}

// migSlicesTable renders the table docs/benchmarks.md quotes.
func migSlicesTable(t *testing.T, r migSlicesReport) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("| node | driver | mode | devices | counter sets | slices | bytes per GPU |\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|\n")
	names := map[string]string{"topodra": "topodra", "nvidia": "NVIDIA's plugin"}
	for _, run := range r.Runs {
		name, ok := names[run.Driver]
		if !ok {
			t.Fatalf("driver %q: the table has no name for it", run.Driver)
		}
		mode := "defaults"
		if run.Mode != "" {
			mode = "`" + run.Mode + "`"
		}
		row := fmt.Sprintf("| `%s` | %s | %s |", run.Profile, name, mode)
		switch {
		case run.Error != "":
			why := "none"
			if strings.Contains(run.Error, "exited") {
				why = "none: the plugin exited"
			}
			row += " – | – | – | " + why + " |"
		case run.Slices == nil:
			t.Fatalf("%s %s on %s: neither counts nor an error", run.Driver, run.Mode, run.Profile)
		default:
			if got := float64(run.SpecBytes) / float64(r.GPUs); got != run.BytesPerGPU {
				t.Fatalf("%s %s on %s: bytesPerGPU %v, specBytes/gpus %v", run.Driver, run.Mode, run.Profile, run.BytesPerGPU, got)
			}
			row += fmt.Sprintf(" %d | %d | %d | %s |", run.Devices, run.CounterSets, *run.Slices, thousands(run.BytesPerGPU))
		}
		b.WriteString(row + "\n")
	}
	return b.String()
}

// thousands rounds f and writes it as the docs write numbers: 14,442.
func thousands(f float64) string {
	s := fmt.Sprintf("%.0f", f)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestMigSlicesTableMatchesItsData: the slice-size table in docs/benchmarks.md is
// the committed run's, and so are the ratios and the failure its prose states.
func TestMigSlicesTableMatchesItsData(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs/benchmarks/mig-slices.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r migSlicesReport
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	if r.GPUs <= 0 {
		t.Fatalf("gpus %d", r.GPUs)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs/benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := migSlicesTable(t, r)
	if !strings.Contains(string(doc), table) {
		t.Fatalf("docs/benchmarks.md does not quote docs/benchmarks/mig-slices.json as:\n%s", table)
	}
	// The prose, with its line breaks as spaces.
	prose := strings.Join(strings.Fields(string(doc)), " ")

	// The prose's ratios: topodra's partitions over its whole GPUs, and its whole
	// GPUs over NVIDIA's.
	perGPU := func(driver, mode, profile string) float64 {
		for _, run := range r.Runs {
			if run.Driver == driver && run.Mode == mode && run.Profile == profile && run.Error == "" {
				return run.BytesPerGPU
			}
		}
		t.Fatalf("no %s %q run on %s with a pool", driver, mode, profile)
		return 0
	}
	carved, whole := perGPU("topodra", "--dynamic-mig", "dgx-h100-mig"), perGPU("topodra", "", "dgx-h100")
	claim := fmt.Sprintf("%.1f times", carved/whole)
	if !strings.Contains(prose, claim) {
		t.Fatalf("docs/benchmarks.md should say partitions make topodra's slices %q larger per GPU", claim)
	}
	claim = fmt.Sprintf("%.2f times NVIDIA's", whole/perGPU("nvidia", "", "dgx-h100"))
	if !strings.Contains(prose, claim) {
		t.Fatalf("docs/benchmarks.md should say topodra's whole GPUs take %q bytes", claim)
	}
	// Beside NVIDIA's DynamicMIG, where it published: the ratio, and each side's
	// counts per device and counter-set bytes as the prose gives them.
	if r.NvidiaDynamicMig == nil {
		var nv, tp *migSlicesRun
		for i := range r.Runs {
			run := &r.Runs[i]
			if run.Profile != "dgx-h100-mig" || run.Error != "" {
				continue
			}
			switch {
			case run.Driver == "nvidia" && strings.Contains(run.Mode, "DynamicMIG=true"):
				nv = run
			case run.Driver == "topodra" && run.Mode == "--dynamic-mig":
				tp = run
			}
		}
		if nv == nil || tp == nil {
			t.Fatalf("no NVIDIA DynamicMIG or topodra --dynamic-mig run with a pool on dgx-h100-mig")
		}
		for _, want := range []string{
			fmt.Sprintf("%s bytes per GPU, %.2f times topodra's %s", thousands(nv.BytesPerGPU), nv.BytesPerGPU/tp.BytesPerGPU, thousands(tp.BytesPerGPU)),
			fmt.Sprintf("NVIDIA's carry %.1f attributes, %.1f capacities and %.1f consumed counters, topodra's %.1f, %.1f and %.1f",
				nv.AttributesPerDevice, nv.CapacitiesPerDevice, nv.ConsumedCountersPerDevice,
				tp.AttributesPerDevice, tp.CapacitiesPerDevice, tp.ConsumedCountersPerDevice),
			fmt.Sprintf("take %s bytes against %s", thousands(float64(nv.CounterSetBytes)), thousands(float64(tp.CounterSetBytes))),
			fmt.Sprintf("same %d devices and %d counter sets", tp.Devices, tp.CounterSets),
		} {
			if nv.Devices != tp.Devices || nv.CounterSets != tp.CounterSets {
				t.Fatalf("NVIDIA published %d devices and %d counter sets, topodra %d and %d: the prose says the same", nv.Devices, nv.CounterSets, tp.Devices, tp.CounterSets)
			}
			if !strings.Contains(prose, want) {
				t.Errorf("docs/benchmarks.md should say %q", want)
			}
		}
	}

	// Where NVIDIA's DynamicMIG published nothing, the prose names the NVML call it
	// stopped at, as the plugin's log gives it.
	if r.NvidiaDynamicMig != nil {
		m := regexp.MustCompile(`undefined symbol: (\w+)`).FindStringSubmatch(r.NvidiaDynamicMig.Error)
		if m == nil {
			t.Fatalf("nvidiaDynamicMig.error names no missing symbol: %q; say why in the prose and here", r.NvidiaDynamicMig.Error)
		}
		if !strings.Contains(prose, "`"+m[1]+"`") {
			t.Fatalf("docs/benchmarks.md should name the call NVIDIA's DynamicMIG stopped at, `%s`", m[1])
		}
	}
}
