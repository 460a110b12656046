package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// Names the chart gives its aligned class and opaque config policy (release "topodra",
// as deploy/manifests is rendered), and API names the tests look for.
const (
	alignedClass       = "gpu-aligned.topodra.dev"
	migAlignedClass    = "mig-aligned.topodra.dev"
	configPolicy       = "topodra-opaque-config"
	numaNodeAttribute  = "resource.kubernetes.io/numaNode"
	extendedClaimAnnot = "resource.kubernetes.io/extended-resource-claim"
)

// configCase is one entry of tests/opaque-config/cases.yaml, the cases the plugin's
// decoder (driver/model/src/config/tests/corpus.rs) is tested against too.
type configCase struct {
	Name       string          `json:"name"`
	Valid      bool            `json:"valid"`
	Path       *string         `json:"path"`
	Parameters json.RawMessage `json:"parameters"`
	JSON       string          `json:"json"`
}

func (c configCase) raw() []byte {
	if c.JSON != "" {
		return []byte(c.JSON)
	}
	return c.Parameters
}

func loadConfigCases(t *testing.T) []configCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "tests", "opaque-config", "cases.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []configCase
	if err := yaml.Unmarshal(b, &cases); err != nil {
		t.Fatalf("tests/opaque-config/cases.yaml: %v", err)
	}
	for _, c := range cases {
		if (c.JSON == "") == (len(c.Parameters) == 0) || c.Valid == (c.Path != nil) {
			t.Fatalf("case %q: want parameters or json, and a path exactly when invalid", c.Name)
		}
	}
	return cases
}

// opaqueConfigs are the config entries of the objects under test: another driver's
// (whose parameters are none of the policy's business, and would be invalid for
// ours) first, then ours, so a refusal must name index 1.
func opaqueConfigs(raw []byte) []resourceapi.DeviceConfiguration {
	return []resourceapi.DeviceConfiguration{
		{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "nic.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion": 7, "sharingg": []}`)}}},
		{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{Raw: raw}}},
	}
}

func claimSpecWithConfig(raw []byte) resourceapi.ResourceClaimSpec {
	var cfg []resourceapi.DeviceClaimConfiguration
	for _, c := range opaqueConfigs(raw) {
		cfg = append(cfg, resourceapi.DeviceClaimConfiguration{DeviceConfiguration: c})
	}
	cfg[1].Requests = []string{"gpus"}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driverName}}},
		Config:   cfg,
	}}
}

func classWithConfig(name string, raw []byte) *resourceapi.DeviceClass {
	var cfg []resourceapi.DeviceClassConfiguration
	for _, c := range opaqueConfigs(raw) {
		cfg = append(cfg, resourceapi.DeviceClassConfiguration{DeviceConfiguration: c})
	}
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + driverName + `"`}}},
			Config:    cfg,
		},
	}
}

// TestOpaqueConfigPolicy runs every case of tests/opaque-config/cases.yaml through the
// real API server with the ValidatingAdmissionPolicy of deploy/manifests, in a
// ResourceClaim, a ResourceClaimTemplate and a DeviceClass: each is accepted or
// refused as the plugin's decoder does (driver/model/src/config/tests/corpus.rs), and a
// refusal names the field path the decoder names. Then: objects created before the
// policy can still be updated and deleted as long as their spec does not change.
func TestOpaqueConfigPolicy(t *testing.T) {
	t.Parallel()
	e := manifestsOnlyEnv(t)
	ctx := context.Background()
	const ns = "default"
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	bad := []byte(`{"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": {"requireAlignedd": true}}`)

	claim := func(name string, raw []byte) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: claimSpecWithConfig(raw)}
	}
	waitPolicy(t, true, func() error {
		_, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim("probe", bad), dryRun)
		return err
	})

	cases := loadConfigCases(t)
	kinds := []struct {
		kind, at string
		create   func(name string, raw []byte) error
	}{
		{"ResourceClaim", "spec.devices.config", func(name string, raw []byte) error {
			_, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim(name, raw), dryRun)
			return err
		}},
		{"ResourceClaimTemplate", "spec.spec.devices.config", func(name string, raw []byte) error {
			_, err := e.admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: claimSpecWithConfig(raw)},
			}, dryRun)
			return err
		}},
		{"DeviceClass", "spec.config", func(name string, raw []byte) error {
			_, err := e.admin.ResourceV1().DeviceClasses().Create(ctx, classWithConfig(name, raw), dryRun)
			return err
		}},
	}
	var accepted, refused int
	for i, c := range cases {
		for _, k := range kinds {
			err := k.create(fmt.Sprintf("case-%d", i), c.raw())
			what := fmt.Sprintf("%s, case %q", k.kind, c.Name)
			switch {
			case c.Valid && err != nil:
				t.Errorf("%s: refused, the decoder accepts it: %v", what, err)
			case c.Valid:
				accepted++
			case err == nil:
				t.Errorf("%s: accepted, the decoder refuses it at %q", what, *c.Path)
			case *c.Path == "":
				// Not an object: the API server's own validation, before any policy.
				want := k.at + "[1].opaque.parameters"
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v, want Invalid naming %s", what, err, want)
				}
				refused++
			default:
				want := k.at + "[1].opaque.parameters." + *c.Path + ": "
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+configPolicy+"'") ||
					!strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v\nwant the policy's refusal naming %q", what, err, want)
				} else if i%10 == 0 {
					t.Logf("%s: %v", what, err)
				}
				refused++
			}
		}
	}
	t.Logf("%d cases x %d kinds: %d accepted, %d refused, as the decoder does", len(cases), len(kinds), accepted, refused)

	// Configs of other drivers are not looked at; neither are entries without opaque.
	other := claim("other-driver", nil)
	other.Spec.Devices.Config = other.Spec.Devices.Config[:1]
	if _, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, other, dryRun); err != nil {
		t.Errorf("a claim with only another driver's config: %v", err)
	}

	// The policy's CEL stays within the API server's cost budget for a claim far
	// larger than any that can run: the API's 32 config entries, each with a limit for
	// 64 devices.
	limits := map[string]string{}
	for i := range 64 {
		limits[fmt.Sprintf("gpu-%d", i)] = fmt.Sprintf("%d.5Gi", i+1)
	}
	large, err := json.Marshal(map[string]any{"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig",
		"sharing": map[string]any{"strategy": "MPS", "mps": map[string]any{"defaultPinnedDeviceMemoryLimit": "1Gi", "perDevicePinnedMemoryLimit": limits}}})
	if err != nil {
		t.Fatal(err)
	}
	big := claim("large", large)
	for len(big.Spec.Devices.Config) < 32 {
		big.Spec.Devices.Config = append(big.Spec.Devices.Config, big.Spec.Devices.Config[1])
	}
	// MPS in a config is refused (the device decides it), but only as the last rule:
	// every field of all 32 configs is still checked first, and a refusal naming the
	// strategy (not a CEL cost error) shows that fits the budget.
	if _, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, big, dryRun); err == nil ||
		!strings.Contains(err.Error(), "spec.devices.config[1].opaque.parameters.sharing.strategy: MPS is chosen by the device, not the config") {
		t.Errorf("a claim with 32 configs of 64 per-device limits each: %v, want refused naming config[1]'s strategy", err)
	}
	minimal := []byte(`{"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig"}`)
	for i := 1; i < 31; i++ {
		big.Spec.Devices.Config[i].Opaque = &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{Raw: minimal}}
	}
	big.Spec.Devices.Config[31].Opaque = &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{Raw: bad}}
	if _, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, big, dryRun); err == nil ||
		!strings.Contains(err.Error(), "spec.devices.config[31].opaque.parameters.numa.requireAlignedd: unknown field") {
		t.Errorf("32 configs with a bad last one: %v, want refused naming config[31]", err)
	}

	// Objects created while the policy was not in force (installed later, or a
	// failurePolicy Ignore outage): metadata updates and deletion still work, a spec
	// change must fix the config.
	t.Run("objects from before the policy", func(t *testing.T) {
		bindings := e.admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
		binding, err := bindings.Get(ctx, configPolicy, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := bindings.Delete(ctx, configPolicy, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var old *resourceapi.ResourceClaim
		eventually(t, time.Minute, func() error {
			old, err = e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim("from-before", bad), metav1.CreateOptions{})
			return err
		})
		oldClass, err := e.admin.ResourceV1().DeviceClasses().Create(ctx, classWithConfig("from-before.example.com", bad), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		binding.ResourceVersion, binding.UID = "", ""
		if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPolicy(t, true, func() error {
			_, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim("probe", bad), dryRun)
			return err
		})

		old.Labels = map[string]string{"touched": "yes"}
		old.Finalizers = append(old.Finalizers, "example.com/keep")
		if old, err = e.admin.ResourceV1().ResourceClaims(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			t.Errorf("metadata update of a claim with an old invalid config: %v", err)
		}
		old.Finalizers = nil
		if _, err = e.admin.ResourceV1().ResourceClaims(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			t.Errorf("finalizer removal from a claim with an old invalid config: %v", err)
		}
		if err := e.admin.ResourceV1().ResourceClaims(ns).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting a claim with an old invalid config: %v", err)
		}

		oldClass.Labels = map[string]string{"touched": "yes"}
		if oldClass, err = e.admin.ResourceV1().DeviceClasses().Update(ctx, oldClass, metav1.UpdateOptions{}); err != nil {
			t.Errorf("metadata update of a class with an old invalid config: %v", err)
		}
		changed := oldClass.DeepCopy()
		changed.Spec.Selectors = append(changed.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}})
		_, err = e.admin.ResourceV1().DeviceClasses().Update(ctx, changed, metav1.UpdateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.config[1].opaque.parameters.numa.requireAlignedd: unknown field") {
			t.Errorf("spec change of a class that keeps an invalid config: %v, want refused naming the field", err)
		} else {
			t.Logf("spec change keeping the invalid config: %v", err)
		}
		fixed := oldClass.DeepCopy()
		fixed.Spec.Config[1].Opaque.Parameters.Raw = []byte(`{"apiVersion": "gpu.topodra.dev/v1alpha1", "kind": "GpuConfig", "numa": {"requireAligned": true}}`)
		if _, err := e.admin.ResourceV1().DeviceClasses().Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
			t.Errorf("spec change that fixes the config: %v", err)
		}
	})
}

// kubectlApplyErr is kubectlApply that returns the error instead of failing the test.
func (e *env) kubectlApplyErr(yaml string) error {
	f := filepath.Join(e.c.Dir, fmt.Sprintf("apply-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.c.Kubectl(ctx, "apply", "-f", f)
	return err
}

// waitPolicy waits until probe's error shows that an admission policy is (want) or is
// not in force: the API server loads new policies and bindings in the background.
func waitPolicy(t *testing.T, want bool, probe func() error) {
	t.Helper()
	eventually(t, time.Minute, func() error {
		err := probe()
		inForce := err != nil && strings.Contains(err.Error(), "AdmissionPolicy")
		if inForce != want {
			return fmt.Errorf("policy in force %t, want %t (probe: %v)", inForce, want, err)
		}
		return nil
	})
}

// alignedClaimSpec is a claim spec with the given requests ({name, class}) and constraints.
func alignedClaimSpec(constraints []resourceapi.DeviceConstraint, requests ...[2]string) resourceapi.ResourceClaimSpec {
	var reqs []resourceapi.DeviceRequest
	for _, r := range requests {
		reqs = append(reqs, resourceapi.DeviceRequest{Name: r[0], Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: r[1]}})
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Constraints: constraints}}
}

func numaConstraint(requests ...string) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{Requests: requests, MatchAttribute: ptrTo(resourceapi.FullyQualifiedName(numaNodeAttribute))}
}

func constraintsString(cs []resourceapi.DeviceConstraint) string {
	var out []string
	for _, c := range cs {
		attr := ""
		if c.MatchAttribute != nil {
			attr = string(*c.MatchAttribute)
		}
		out = append(out, fmt.Sprintf("%v:%s", c.Requests, attr))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// TestAlignedByDefault checks the MutatingAdmissionPolicy and the aligned DeviceClass of
// deploy/manifests against the real API server, then through the real scheduler and
// plugin on a simulated DGX H100: claims and templates asking for the aligned class
// without constraints get one numaNode constraint over exactly those requests, every
// other claim is left as it was, and a template without any constraint (the
// example deploy/examples/07) gets four GPUs of one NUMA node where first-fit alone
// would have spread them.
func TestAlignedByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{profile: "dgx-h100"})
	ctx := context.Background()
	const ns = "aligned"
	e.createNamespace(ns)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(name string, spec resourceapi.ResourceClaimSpec, annotations map[string]string) []resourceapi.DeviceConstraint {
		t.Helper()
		out, err := e.admin.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations}, Spec: spec}, dryRun)
		if err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		return out.Spec.Devices.Constraints
	}
	eventually(t, time.Minute, func() error {
		if got := create("probe", alignedClaimSpec(nil, [2]string{"gpus", alignedClass}), nil); len(got) == 0 {
			return fmt.Errorf("the mutating policy is not in force yet")
		}
		return nil
	})

	t.Run("admission", func(t *testing.T) {
		own := []resourceapi.DeviceConstraint{{Requests: []string{"a"}, MatchAttribute: ptrTo(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}}
		firstAvailable := alignedClaimSpec(nil)
		firstAvailable.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "big", DeviceClassName: alignedClass, Count: 4}, {Name: "small", DeviceClassName: alignedClass, Count: 2}}}}
		for _, tc := range []struct {
			what        string
			spec        resourceapi.ResourceClaimSpec
			annotations map[string]string
			want        []resourceapi.DeviceConstraint
		}{
			{"one aligned request", alignedClaimSpec(nil, [2]string{"gpus", alignedClass}), nil,
				[]resourceapi.DeviceConstraint{numaConstraint("gpus")}},
			{"aligned requests among others", alignedClaimSpec(nil, [2]string{"a", alignedClass}, [2]string{"b", driverName}, [2]string{"c", alignedClass}, [2]string{"nic", "nic.example.com"}), nil,
				[]resourceapi.DeviceConstraint{numaConstraint("a", "c")}},
			{"a constraint of its own", alignedClaimSpec(own, [2]string{"a", alignedClass}, [2]string{"b", alignedClass}), nil, own},
			{"aligned GPU and MIG requests", alignedClaimSpec(nil, [2]string{"gpu", alignedClass}, [2]string{"part", migAlignedClass}, [2]string{"other", migClass}), nil,
				[]resourceapi.DeviceConstraint{numaConstraint("gpu", "part")}},
			{"aligned MIG requests only", alignedClaimSpec(nil, [2]string{"parts", migAlignedClass}), nil,
				[]resourceapi.DeviceConstraint{numaConstraint("parts")}},
			{"aligned shares beside a GPU", alignedClaimSpec(nil, [2]string{"gpu", alignedClass}, [2]string{"mps", "mps-aligned.topodra.dev"},
				[2]string{"ts", "time-sliced-aligned.topodra.dev"}, [2]string{"plain", "mps.topodra.dev"}), nil,
				[]resourceapi.DeviceConstraint{numaConstraint("gpu", "mps", "ts")}},
			{"aligned shares only", alignedClaimSpec(nil, [2]string{"a", "mps-aligned.topodra.dev"}, [2]string{"b", "mps-aligned.topodra.dev"}), nil,
				[]resourceapi.DeviceConstraint{numaConstraint("a", "b")}},
			{"the default class only", alignedClaimSpec(nil, [2]string{"gpus", driverName}), nil, nil},
			{"a scheduler-made extended resource claim", alignedClaimSpec(nil, [2]string{"container-0-request-0", alignedClass}),
				map[string]string{extendedClaimAnnot: "true"}, nil},
			{"aligned subrequests of firstAvailable", firstAvailable, nil, nil},
		} {
			got := create("admission-test", tc.spec, tc.annotations)
			if constraintsString(got) != constraintsString(tc.want) {
				t.Errorf("%s: constraints %s, want %s", tc.what, constraintsString(got), constraintsString(tc.want))
			} else {
				t.Logf("%s: constraints %s", tc.what, constraintsString(got))
			}
		}
	})

	// The chart with the CPU half of the pair on (cpuDriver.alignedClass): the same
	// policy object, re-applied, also puts the claim's CPU requests in the GPUs'
	// constraint, on the name both drivers publish. GPU-only claims keep the standard
	// name, so the rest of this test runs under it unchanged.
	t.Run("admission with the CPU class", func(t *testing.T) {
		rendered := helmTemplate(t, t.TempDir(), "--set", "cpuDriver.alignedClass.enabled=true",
			"--set", "kubeletPlugin.numaNodeAliases={dra.net/numaNode}")
		e.kubectlApply(manifestDocs(t, rendered, func(k string) bool {
			return k == "MutatingAdmissionPolicy" || k == "DeviceClass"
		}))
		const cpuClass = "cpu-aligned.topodra.dev"
		alias := func(requests ...string) resourceapi.DeviceConstraint {
			return resourceapi.DeviceConstraint{Requests: requests, MatchAttribute: ptrTo(resourceapi.FullyQualifiedName("dra.net/numaNode"))}
		}
		mixed := alignedClaimSpec(nil, [2]string{"gpus", alignedClass}, [2]string{"cpus", cpuClass})
		eventually(t, time.Minute, func() error {
			if got := create("probe", mixed, nil); constraintsString(got) != constraintsString([]resourceapi.DeviceConstraint{alias("gpus", "cpus")}) {
				return fmt.Errorf("the re-applied policy is not in force yet: %s", constraintsString(got))
			}
			return nil
		})
		for _, tc := range []struct {
			what string
			spec resourceapi.ResourceClaimSpec
			want []resourceapi.DeviceConstraint
		}{
			{"GPUs and CPUs", mixed, []resourceapi.DeviceConstraint{alias("gpus", "cpus")}},
			{"GPUs only", alignedClaimSpec(nil, [2]string{"gpus", alignedClass}), []resourceapi.DeviceConstraint{numaConstraint("gpus")}},
			{"CPUs only: nothing to align them with", alignedClaimSpec(nil, [2]string{"cpus", cpuClass}), nil},
			{"the CPU driver's own class stays out", alignedClaimSpec(nil, [2]string{"gpus", alignedClass}, [2]string{"cpus", "dra.cpu"}),
				[]resourceapi.DeviceConstraint{numaConstraint("gpus")}},
		} {
			got := create("admission-test", tc.spec, nil)
			if constraintsString(got) != constraintsString(tc.want) {
				t.Errorf("%s: constraints %s, want %s", tc.what, constraintsString(got), constraintsString(tc.want))
			} else {
				t.Logf("%s: constraints %s", tc.what, constraintsString(got))
			}
		}
		// The example, created for real.
		example := filepath.Join(repoRoot(t), "deploy", "examples", "11-one-gpu-eight-cpus-aligned-by-default.yaml")
		e.kubectlApply(strings.Replace(manifestDoc(t, example, "ResourceClaimTemplate"), "metadata:\n", "metadata:\n  namespace: "+ns+"\n", 1))
		stored, err := e.admin.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "one-gpu-eight-cpus", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := constraintsString(stored.Spec.Spec.Devices.Constraints); got != constraintsString([]resourceapi.DeviceConstraint{alias("gpu", "cpus")}) {
			t.Errorf("stored template one-gpu-eight-cpus has constraints %s", got)
		}
		// The other GPU + CPU examples are valid objects for this API server.
		for _, f := range []string{"09-four-gpus-and-32-cpus-one-numa-node.yaml", "10-gpus-and-a-whole-numa-node.yaml", "12-gpu-cpu-and-nic-one-numa-node.yaml"} {
			out, err := e.c.Kubectl(ctx, "apply", "--dry-run=server", "-n", ns, "-f", filepath.Join(repoRoot(t), "deploy", "examples", f))
			if err != nil {
				t.Errorf("%s: %v", f, err)
			} else {
				t.Logf("%s: %s", f, strings.TrimSpace(string(out)))
			}
		}
	})

	// The example template, created for real: the stored object has the constraint.
	example := filepath.Join(repoRoot(t), "deploy", "examples", "07-aligned-by-default.yaml")
	tmpl := strings.Replace(manifestDoc(t, example, "ResourceClaimTemplate"), "metadata:\n", "metadata:\n  namespace: "+ns+"\n", 1)
	e.kubectlApply(tmpl)
	stored, err := e.admin.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "four-aligned-gpus", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := constraintsString(stored.Spec.Spec.Devices.Constraints); got != constraintsString([]resourceapi.DeviceConstraint{numaConstraint("gpus")}) {
		t.Fatalf("stored template four-aligned-gpus has constraints %s", got)
	}
	e.kubectlApply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: ` + ns + `}
spec: {spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.topodra.dev, count: 1}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: four-any-gpus, namespace: ` + ns + `}
spec: {spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.topodra.dev, count: 4}}]}}}
`)

	t.Run("scheduling", func(t *testing.T) {
		e.t = t
		e.waitRegistered(2 * time.Minute)
		devices := e.waitDevices(8, time.Minute)
		numas := func(devs []string) []int64 {
			var out []int64
			for _, d := range devs {
				if n := numaOf(t, devices[d]); !slices.Contains(out, n) {
					out = append(out, n)
				}
			}
			slices.Sort(out)
			return out
		}
		// One GPU taken first, so that the first four free GPUs in publishing order
		// span both NUMA nodes.
		e.createPod(ns, "one", "one-gpu")
		_, one := e.allocation(e.waitPodRunning(ns, "one", 2*time.Minute))
		t.Logf("pod one: %v on NUMA node %v", one, numas(one))

		// Four of the default class, no constraint: first-fit spreads them.
		e.createPod(ns, "four-any", "four-any-gpus")
		_, anyDevs := e.allocation(e.waitPodRunning(ns, "four-any", 2*time.Minute))
		t.Logf("pod four-any (gpu.topodra.dev, no constraint): %v on NUMA nodes %v", anyDevs, numas(anyDevs))
		if len(numas(anyDevs)) != 2 {
			t.Errorf("four-any: %v on NUMA nodes %v; the comparison needs it spread", anyDevs, numas(anyDevs))
		}
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "four-any", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "four-any", time.Minute)

		// The same ask through the aligned class: one NUMA node.
		e.createPod(ns, "four-aligned", "four-aligned-gpus")
		claim, alignedDevs := e.allocation(e.waitPodRunning(ns, "four-aligned", 2*time.Minute))
		t.Logf("pod four-aligned (%s, constraint added by the policy): claim %s constraints %s, got %v on NUMA node %v",
			alignedClass, claim.Name, constraintsString(claim.Spec.Devices.Constraints), alignedDevs, numas(alignedDevs))
		if len(alignedDevs) != 4 || len(numas(alignedDevs)) != 1 {
			t.Errorf("four-aligned: %v on NUMA nodes %v, want 4 GPUs on one", alignedDevs, numas(alignedDevs))
		}
		if got := constraintsString(claim.Spec.Devices.Constraints); got != constraintsString([]resourceapi.DeviceConstraint{numaConstraint("gpus")}) {
			t.Errorf("claim %s: constraints %s", claim.Name, got)
		}

		// No NUMA node has four free GPUs left: the next aligned pod waits.
		e.createPod(ns, "four-aligned-2", "four-aligned-gpus")
		msg := e.waitEvent(ns, "four-aligned-2", "FailedScheduling", regexp.MustCompile(`.`), 2*time.Minute)
		t.Logf("four-aligned-2 FailedScheduling: %s", msg)
		p, err := e.admin.CoreV1().Pods(ns).Get(ctx, "four-aligned-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			t.Errorf("four-aligned-2 scheduled to %s with no NUMA node of four free GPUs", p.Spec.NodeName)
		}
	})
}
