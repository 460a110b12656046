package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// The dynamic MIG slices of a simulated DGX H100 (every GPU in MIG mode, no MIG
// devices yet), as `discover --preview-dynamic-mig` prints them, put through the
// scheduler's own allocator (k8s.io/dynamic-resource-allocation v0.37.2 with the
// features the 1.37 default feature gates give the scheduler, partitionable devices
// among them). The plugin does not publish these slices yet; this pins what the
// counters make the real allocator do before anything is built on them.

const partitionDriver = "gpu.topodra.dev"

// partitionSlices lays out the simulated node and returns its slices with partitions.
func partitionSlices(t *testing.T) []*resourceapi.ResourceSlice {
	t.Helper()
	return partitionSlicesFor(t, "sim")
}

// partitionSlicesFor is partitionSlices for a node of that name.
func partitionSlicesFor(t *testing.T, node string) []*resourceapi.ResourceSlice {
	t.Helper()
	simNode := binary(t, "TOPODRA_SIM_NODE_BIN", "topodra-sim-node")
	plugin := binary(t, "TOPODRA_PLUGIN_BIN", "topodra-kubelet-plugin")
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "tests/fake-nvml/profiles/dgx-h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.ReplaceAll(string(raw), "    mig: {current: false, pending: false}", "    mig: {current: true, pending: true}")
	if yaml == string(raw) {
		t.Fatal("dgx-h100.yaml no longer spells its MIG mode as this test expects")
	}
	profile := filepath.Join(dir, "dgx-h100-mig-dynamic.yaml")
	if err := os.WriteFile(profile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(simNode, profile, filepath.Join(dir, "sim")).Output()
	if err != nil {
		t.Fatalf("topodra-sim-node: %v", err)
	}
	args := []string{"discover", "-o", "json", "--preview-dynamic-mig", "--require-nvml", "--node-name", node}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "--nvml-lib=") || strings.HasPrefix(f, "--hwloc-xml=") {
			args = append(args, f)
		}
	}
	cmd := exec.Command(plugin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOPODRA_DISCOVER_STRICT=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	js, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("discover %v: %v\n%s", args, err, stderr)
	}
	var list struct {
		Items []*resourceapi.ResourceSlice `json:"items"`
	}
	if err := json.Unmarshal(js, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 5 {
		t.Fatalf("want 4 device slices and 1 of counters, got %d slices", len(list.Items))
	}
	return list.Items
}

// partitionAllocator is the allocator over those slices, with what is allocated.
type partitionAllocator struct {
	t         *testing.T
	slices    []*resourceapi.ResourceSlice
	classes   classes
	features  structured.Features
	cache     *cel.Cache
	allocated sets.Set[structured.DeviceID]
	n         int
}

func newPartitionAllocator(t *testing.T) *partitionAllocator {
	if !utilfeature.DefaultFeatureGate.Enabled("DRAPartitionableDevices") {
		t.Fatal("DRAPartitionableDevices is off by default; the 1.37 default was on")
	}
	features, cache := schedulerAllocator()
	class := func(name, expr string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: expr},
			}}},
		}
	}
	cs := classes{class("gpu", `device.driver == "gpu.topodra.dev" && device.attributes["gpu.topodra.dev"].type == "gpu"`)}
	for _, p := range []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"} {
		cs = append(cs, class("mig-"+p, fmt.Sprintf(
			`device.driver == "gpu.topodra.dev" && device.attributes["gpu.topodra.dev"].type == "mig" && device.attributes["gpu.topodra.dev"].profile == %q`, p)))
	}
	return &partitionAllocator{
		t: t, slices: partitionSlices(t), classes: cs, features: features,
		cache:     cache,
		allocated: sets.New[structured.DeviceID](),
	}
}

// allocate asks for count devices of the class in one claim; it returns the
// devices, or nil when the allocator finds no fit.
func (a *partitionAllocator) allocate(class string, count int) []string {
	a.t.Helper()
	ctx := context.Background()
	alloc, err := structured.NewAllocator(ctx, a.features, structured.AllocatedState{
		AllocatedDevices:         a.allocated.Clone(),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}, a.classes, a.slices, a.cache)
	if err != nil {
		a.t.Fatal(err)
	}
	a.n++
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", a.n), Namespace: "sim", UID: types.UID(fmt.Sprintf("uid-%d", a.n))},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "r",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class,
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(count)},
		}}}},
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sim"}}
	results, err := alloc.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		a.t.Fatalf("allocating %d of %s: %v", count, class, err)
	}
	if len(results) == 0 {
		return nil
	}
	var devs []string
	for _, r := range results[0].Devices.Results {
		devs = append(devs, r.Device)
		a.allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
	}
	return devs
}

func (a *partitionAllocator) release(devs ...string) {
	for _, d := range devs {
		a.allocated.Delete(structured.MakeDeviceID(partitionDriver, "sim", d))
	}
}

func TestPartitionsWholeGPUsAndPartitionsExcludeEachOther(t *testing.T) {
	t.Parallel()
	a := newPartitionAllocator(t)

	whole := a.allocate("gpu", 8)
	if len(whole) != 8 {
		t.Fatalf("8 whole GPUs: %v", whole)
	}
	for _, p := range []string{"1g.10gb", "7g.80gb"} {
		if got := a.allocate("mig-"+p, 1); got != nil {
			t.Fatalf("a %s partition of a GPU that is allocated whole: %v", p, got)
		}
	}
	a.release("gpu-7")
	if got := a.allocate("mig-1g.10gb", 1); len(got) != 1 || got[0] != "gpu-7-mig-1g-10gb-6" {
		t.Fatalf("the freed GPU's last 1g placement, got %v", got)
	}
	a.release(whole...)
	if got := a.allocate("gpu", 8); got != nil {
		t.Fatalf("a whole GPU that holds a partition: %v", got)
	}
	if got := a.allocate("gpu", 7); len(got) != 7 {
		t.Fatalf("the seven uncarved GPUs: %v", got)
	}
}

func TestPartitionsPackFromTheLastGPUAndKeepBigPlacementsFree(t *testing.T) {
	t.Parallel()
	a := newPartitionAllocator(t)

	// Seven 1g.10gb fill GPU 7 from its highest placement down; the eighth opens GPU 6.
	var ones []string
	for range 8 {
		got := a.allocate("mig-1g.10gb", 1)
		if len(got) != 1 {
			t.Fatalf("1g.10gb after %v: %v", ones, got)
		}
		ones = append(ones, got[0])
	}
	want := []string{
		"gpu-7-mig-1g-10gb-6", "gpu-7-mig-1g-10gb-5", "gpu-7-mig-1g-10gb-4", "gpu-7-mig-1g-10gb-3",
		"gpu-7-mig-1g-10gb-2", "gpu-7-mig-1g-10gb-1", "gpu-7-mig-1g-10gb-0", "gpu-6-mig-1g-10gb-6",
	}
	if strings.Join(ones, " ") != strings.Join(want, " ") {
		t.Fatalf("1g.10gb placements:\n got %v\nwant %v", ones, want)
	}
	// GPU 6 holds one 1g at placement 6: its 4g.40gb placement (0-3) is still free,
	// and the allocator takes it there rather than carving an untouched GPU.
	if got := a.allocate("mig-4g.40gb", 1); len(got) != 1 || got[0] != "gpu-6-mig-4g-40gb-0" {
		t.Fatalf("4g.40gb beside the 1g on GPU 6: %v", got)
	}
	// A 7g still fits after the burst: GPU 5 is untouched.
	if got := a.allocate("mig-7g.80gb", 1); len(got) != 1 || got[0] != "gpu-5-mig-7g-80gb-0" {
		t.Fatalf("7g.80gb after a burst of 1g: %v", got)
	}
	// Whole GPUs come from the other end.
	if got := a.allocate("gpu", 1); len(got) != 1 || got[0] != "gpu-0" {
		t.Fatalf("a whole GPU: %v", got)
	}
	// One +me per GPU: the OFA engine counter sends the second to another GPU.
	me1, me2 := a.allocate("mig-1g.10gb+me", 1), a.allocate("mig-1g.10gb+me", 1)
	if len(me1) != 1 || len(me2) != 1 || gpuOf(me1[0]) == gpuOf(me2[0]) {
		t.Fatalf("two 1g.10gb+me on one GPU: %v %v", me1, me2)
	}
}

// TestPartitionsRandomClaimsStayWithinNVMLsRules churns random single-partition
// claims through the allocator and checks every admitted set against NVML's
// placement rules (the MIG User Guide's: placements of one GPU never overlap in
// memory slices, a profile never exceeds its instance count, a whole GPU excludes
// every partition of it), and every refusal against them too: a claim is refused
// only when no placement of its profile is free under those rules.
func TestPartitionsRandomClaimsStayWithinNVMLsRules(t *testing.T) {
	t.Parallel()
	a := newPartitionAllocator(t)
	geom := placementsOf(a.slices)
	profiles := []string{"1g.10gb", "1g.10gb", "1g.10gb", "1g.20gb", "2g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "whole"}
	instances := map[string]int{"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
	r := rand.New(rand.NewPCG(20261206, 43))
	var live []string
	admitted, refused := 0, 0
	for step := range 3000 {
		if len(live) > 0 && r.IntN(10) < 4 {
			i := r.IntN(len(live))
			a.release(live[i])
			live = append(live[:i], live[i+1:]...)
			continue
		}
		p := profiles[r.IntN(len(profiles))]
		class := "mig-" + p
		if p == "whole" {
			class = "gpu"
		}
		got := a.allocate(class, 1)
		if got == nil {
			refused++
			if dev, ok := legalPlacement(geom, live, p, instances); ok {
				t.Fatalf("step %d: %s refused while %s is free under NVML's rules (held: %v)", step, p, dev, live)
			}
			continue
		}
		admitted++
		live = append(live, got[0])
		if err := checkNVMLRules(geom, live, instances); err != nil {
			t.Fatalf("step %d: admitting %s: %v (held: %v)", step, got[0], err, live)
		}
	}
	t.Logf("%d claims admitted, %d refused, every one as NVML's placement rules say", admitted, refused)
	if admitted < 500 || refused < 100 {
		t.Fatalf("the churn did not exercise both answers: %d admitted, %d refused", admitted, refused)
	}
}

// placement is what a published device stands for.
type placement struct {
	gpu, profile string // profile "whole" for a whole GPU
	start, size  int
}

// placementsOf reads every device's GPU, profile and memory slices from the
// slices: the name carries the GPU and start, the consumed memory-slice counters
// the extent.
func placementsOf(slices []*resourceapi.ResourceSlice) map[string]placement {
	out := map[string]placement{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			p := placement{gpu: gpuOf(d.Name), profile: "whole", start: 0, size: 8}
			if a, ok := d.Attributes["profile"]; ok && a.StringValue != nil {
				p.profile = *a.StringValue
				var slots []int
				for _, c := range d.ConsumesCounters {
					for name := range c.Counters {
						if n, ok := strings.CutPrefix(name, "memory-slice-"); ok {
							i, _ := strconv.Atoi(n)
							slots = append(slots, i)
						}
					}
				}
				sort.Ints(slots)
				p.start, p.size = slots[0], len(slots)
			}
			out[d.Name] = p
		}
	}
	return out
}

func gpuOf(device string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(device, "gpu-"), "-")
	return "gpu-" + name
}

// checkNVMLRules: the held devices, per GPU, as NVML would let them coexist.
func checkNVMLRules(geom map[string]placement, held []string, instances map[string]int) error {
	byGPU := map[string][]placement{}
	for _, d := range held {
		p := geom[d]
		byGPU[p.gpu] = append(byGPU[p.gpu], p)
	}
	for gpu, ps := range byGPU {
		used := make([]bool, 8)
		count := map[string]int{}
		for _, p := range ps {
			if p.profile == "whole" && len(ps) > 1 {
				return fmt.Errorf("%s is held whole and as %d other devices", gpu, len(ps)-1)
			}
			count[p.profile]++
			if p.profile != "whole" && count[p.profile] > instances[p.profile] {
				return fmt.Errorf("%s holds %d %s, NVML allows %d", gpu, count[p.profile], p.profile, instances[p.profile])
			}
			for i := p.start; i < p.start+p.size; i++ {
				if used[i] {
					return fmt.Errorf("%s: memory slice %d taken twice", gpu, i)
				}
				used[i] = true
			}
		}
	}
	return nil
}

// legalPlacement finds a device of the profile that NVML's rules would allow
// beside the held ones, if there is one.
func legalPlacement(geom map[string]placement, held []string, profile string, instances map[string]int) (string, bool) {
	names := make([]string, 0, len(geom))
	for name := range geom {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if geom[name].profile != profile || slices.Contains(held, name) {
			continue
		}
		if checkNVMLRules(geom, append(append([]string{}, held...), name), instances) == nil {
			return name, true
		}
	}
	return "", false
}
