package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// The fragmentation benchmark (make bench-fragmentation): a seeded churn of MIG
// profile and whole-GPU claims on the simulated DGX H100 with dynamic MIG, through
// the real allocator, once per device order. After every arrival or departure it
// asks whether one more whole GPU, and one more 7g.80gb, would still be allocated
// (and takes them back). Orders:
//   - topodra: the slices as built, named in index order;
//   - topodra-generated-names: the same slices under server-generated names
//     (`<node>-<driver>-` and a random suffix, as the publisher creates them), which
//     the allocator sorts by, so the slices come in a random order; several seeds;
//   - lexical: every device sorted by name, the order a driver that lists its
//     devices by name gets (NVIDIA's DynamicMIG names devices by GPU and profile);
//   - shuffled: a random order.
// The workload is the same sequence of events for every order; what each order's
// allocations leave free differs.

// fragWeights is the claim mix: profile (or "whole") and weight.
var fragWeights = []struct {
	profile string
	weight  int
}{
	{"1g.10gb", 35}, {"1g.20gb", 10}, {"2g.20gb", 15}, {"3g.40gb", 10},
	{"4g.40gb", 5}, {"7g.80gb", 5}, {"1g.10gb+me", 5}, {"whole", 15},
}

type fragEvent struct {
	arrive  bool
	profile string
	victim  int // for a departure: index into the live claims, modulo their count
}

func fragWorkload(seed uint64, steps, arrivalPercent int) []fragEvent {
	r := rand.New(rand.NewPCG(seed, 0xf4a9))
	total := 0
	for _, w := range fragWeights {
		total += w.weight
	}
	out := make([]fragEvent, 0, steps)
	for range steps {
		if r.IntN(100) < arrivalPercent {
			n := r.IntN(total)
			for _, w := range fragWeights {
				if n < w.weight {
					out = append(out, fragEvent{arrive: true, profile: w.profile})
					break
				}
				n -= w.weight
			}
			continue
		}
		out = append(out, fragEvent{victim: r.IntN(1 << 20)})
	}
	return out
}

// FragResult is one order's outcome.
type FragResult struct {
	Order string `json:"order"`
	Seed  uint64 `json:"seed,omitempty"`
	// Steps after which one more whole GPU / 7g.80gb would have been allocated,
	// as a share of all steps.
	WholeSatisfiable  float64 `json:"wholeSatisfiable"`
	SevenGSatisfiable float64 `json:"sevenGSatisfiable"`
	// Arrivals of the workload itself refused, and admitted.
	Refused  int `json:"refused"`
	Admitted int `json:"admitted"`
	// Refused arrivals by profile ("whole" for a whole GPU).
	RefusedBy map[string]int `json:"refusedBy"`
}

// FragLoad is one workload: its arrival share and each order's outcome.
type FragLoad struct {
	ArrivalPercent int          `json:"arrivalPercent"`
	Results        []FragResult `json:"results"`
}

// FragReport is what the benchmark writes.
type FragReport struct {
	Node      string     `json:"node"`
	Allocator string     `json:"allocator"`
	Steps     int        `json:"steps"`
	Seed      uint64     `json:"workloadSeed"`
	Mix       string     `json:"mix"`
	Loads     []FragLoad `json:"loads"`
}

func fragRun(t *testing.T, base *partitionAllocator, slices []*resourceapi.ResourceSlice, events []fragEvent) FragResult {
	a := *base
	a.slices = slices
	a.allocated = base.allocated.Clone()
	var live [][]string
	whole, seven, refused, admitted := 0, 0, 0, 0
	refusedBy := map[string]int{}
	class := func(p string) string {
		if p == "whole" {
			return "gpu"
		}
		return "mig-" + p
	}
	for _, ev := range events {
		if ev.arrive {
			if got := a.allocate(class(ev.profile), 1); got != nil {
				live = append(live, got)
				admitted++
			} else {
				refused++
				refusedBy[ev.profile]++
			}
		} else if len(live) > 0 {
			i := ev.victim % len(live)
			a.release(live[i]...)
			live = append(live[:i], live[i+1:]...)
		}
		if got := a.allocate("gpu", 1); got != nil {
			whole++
			a.release(got...)
		}
		if got := a.allocate("mig-7g.80gb", 1); got != nil {
			seven++
			a.release(got...)
		}
	}
	n := float64(len(events))
	return FragResult{WholeSatisfiable: float64(whole) / n, SevenGSatisfiable: float64(seven) / n,
		Refused: refused, Admitted: admitted, RefusedBy: refusedBy}
}

// fragDevices is every device in the order the allocator walks them: slices by
// name, devices in slice order.
func fragDevices(slices []*resourceapi.ResourceSlice) []resourceapi.Device {
	sorted := append([]*resourceapi.ResourceSlice{}, slices...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var out []resourceapi.Device
	for _, s := range sorted {
		out = append(out, s.Spec.Devices...)
	}
	return out
}

// fragReslice publishes devices in this order, 64 to a slice, the counter slices
// after them, named in index order.
func fragReslice(slices []*resourceapi.ResourceSlice, devices []resourceapi.Device) []*resourceapi.ResourceSlice {
	var counters []*resourceapi.ResourceSlice
	for _, s := range slices {
		if len(s.Spec.SharedCounters) > 0 {
			counters = append(counters, s)
		}
	}
	var out []*resourceapi.ResourceSlice
	for i := 0; i < len(devices); i += 64 {
		s := slices[0].DeepCopy()
		s.Spec.Devices = append([]resourceapi.Device{}, devices[i:min(i+64, len(devices))]...)
		out = append(out, s)
	}
	for _, c := range counters {
		out = append(out, c.DeepCopy())
	}
	for i, s := range out {
		s.Name = fmt.Sprintf("sim-gpu.topodra.dev-%02d", i)
		s.Spec.Pool.ResourceSliceCount = int64(len(out))
	}
	return out
}

// fragGeneratedNames renames the slices as the API server's generateName would.
func fragGeneratedNames(slices []*resourceapi.ResourceSlice, seed uint64) []*resourceapi.ResourceSlice {
	r := rand.New(rand.NewPCG(seed, 0x6e4e))
	const alphabet = "bcdfghjklmnpqrstvwxz2456789" // what the API server's suffixes use
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i, s := range slices {
		c := s.DeepCopy()
		var b strings.Builder
		for range 5 {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		c.Name = "sim-gpu.topodra.dev-" + b.String()
		out[i] = c
	}
	return out
}

func TestFragmentationBenchmark(t *testing.T) {
	out := os.Getenv("TOPODRA_BENCH_FRAGMENTATION")
	if out == "" {
		t.Skip("a benchmark: make bench-fragmentation runs it (TOPODRA_BENCH_FRAGMENTATION=<result file>)")
	}
	base := newPartitionAllocator(t)
	const seed, steps = 20261206, 2000
	built := base.slices
	report := FragReport{
		Node: "simulated DGX H100, 8 GPUs in MIG mode, dynamic MIG (25 partitions each)", Steps: steps, Seed: seed,
		Allocator: "k8s.io/dynamic-resource-allocation v0.37.2, Kubernetes 1.37 default feature gates",
	}
	var mix []string
	for _, w := range fragWeights {
		mix = append(mix, fmt.Sprintf("%s %d%%", w.profile, w.weight))
	}
	report.Mix = "arrivals: " + strings.Join(mix, ", ") + "; the other events depart a random live claim"

	for _, arrivals := range []int{50, 55} {
		events := fragWorkload(seed, steps, arrivals)
		load := FragLoad{ArrivalPercent: arrivals}
		run := func(order string, s uint64, slices []*resourceapi.ResourceSlice) {
			r := fragRun(t, base, slices, events)
			r.Order, r.Seed = order, s
			t.Logf("arrivals %d%% %-24s seed %d: whole %.3f 7g %.3f refused %d %v admitted %d",
				arrivals, order, s, r.WholeSatisfiable, r.SevenGSatisfiable, r.Refused, r.RefusedBy, r.Admitted)
			load.Results = append(load.Results, r)
		}
		run("topodra", 0, fragReslice(built, fragDevices(built)))
		for s := uint64(1); s <= 5; s++ {
			run("topodra-generated-names", s, fragGeneratedNames(built, s))
		}
		lexical := fragDevices(built)
		sort.Slice(lexical, func(i, j int) bool { return lexical[i].Name < lexical[j].Name })
		run("lexical", 0, fragReslice(built, lexical))
		for s := uint64(1); s <= 3; s++ {
			shuffled := fragDevices(built)
			r := rand.New(rand.NewPCG(s, 0x5f))
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			run("shuffled", s, fragReslice(built, shuffled))
		}
		report.Loads = append(report.Loads, load)
	}

	js, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(js, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fragTable renders the committed report as the table docs/benchmarks.md quotes:
// per load and order, the share of steps after which a whole GPU (and a 7g.80gb)
// would still have been allocated, the arrivals refused, and of them the
// 4g.40gb ones; a range where an order ran with several seeds.
func fragTable(t testing.TB, r FragReport) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("| arrivals | device order | whole GPU or 7g.80gb still satisfiable | arrivals refused | of them 4g.40gb |\n")
	b.WriteString("|---|---|---|---|---|\n")
	labels := map[string]string{
		"topodra":                 "topodra",
		"topodra-generated-names": "topodra, server-generated slice names",
		"lexical":                 "lexical (by device name)",
		"shuffled":                "shuffled",
	}
	span := func(lo, hi string) string {
		if lo == hi {
			return lo
		}
		return lo + "–" + hi
	}
	for _, load := range r.Loads {
		for _, order := range []string{"topodra", "topodra-generated-names", "lexical", "shuffled"} {
			var sat []float64
			var refused, fourG []int
			for _, res := range load.Results {
				if res.Order != order {
					continue
				}
				if res.WholeSatisfiable != res.SevenGSatisfiable {
					t.Fatalf("%s at %d%%: a whole GPU (%.3f) and a 7g (%.3f) differ; the table shows one column for both",
						order, load.ArrivalPercent, res.WholeSatisfiable, res.SevenGSatisfiable)
				}
				sat = append(sat, res.WholeSatisfiable)
				refused = append(refused, res.Refused)
				fourG = append(fourG, res.RefusedBy["4g.40gb"])
			}
			if len(sat) == 0 {
				t.Fatalf("no %s run at %d%%", order, load.ArrivalPercent)
			}
			sort.Float64s(sat)
			sort.Ints(refused)
			sort.Ints(fourG)
			label := labels[order]
			if len(sat) > 1 {
				label += fmt.Sprintf(" (%d seeds)", len(sat))
			}
			pct := func(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }
			fmt.Fprintf(&b, "| %d %% | %s | %s | %s | %s |\n", load.ArrivalPercent, label,
				span(pct(sat[0]), pct(sat[len(sat)-1])),
				span(fmt.Sprint(refused[0]), fmt.Sprint(refused[len(refused)-1])),
				span(fmt.Sprint(fourG[0]), fmt.Sprint(fourG[len(fourG)-1])))
		}
	}
	return b.String()
}

// TestFragmentationTableMatchesItsData: the table in docs/benchmarks.md is the
// committed run's, so the text cannot drift from its data.
func TestFragmentationTableMatchesItsData(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs/benchmarks/fragmentation.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r FragReport
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs/benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := fragTable(t, r)
	if !strings.Contains(string(doc), table) {
		t.Fatalf("docs/benchmarks.md does not quote docs/benchmarks/fragmentation.json as:\n%s", table)
	}
	// The prose's cost of server-generated names: topodra's share less the worst seed's.
	var gaps []string
	for _, load := range r.Loads {
		own, worst := -1.0, 2.0
		for _, res := range load.Results {
			switch res.Order {
			case "topodra":
				own = res.WholeSatisfiable
			case "topodra-generated-names":
				worst = min(worst, res.WholeSatisfiable)
			}
		}
		gaps = append(gaps, fmt.Sprintf("%.1f", 100*(own-worst)))
	}
	claim := fmt.Sprintf("cost up to %s points at 50 %% and %s at 55 %%", gaps[0], gaps[1])
	if !strings.Contains(string(doc), claim) {
		t.Fatalf("docs/benchmarks.md should say the generated names %q", claim)
	}
}
