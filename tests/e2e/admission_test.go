package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"topodra.dev/tests/e2e/harness"
)

// policySlice is a ResourceSlice as the plugin on node would publish it, changed by
// edit.
func policySlice(name, node string, edit func(*resourceapi.ResourceSlice)) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
	if edit != nil {
		edit(s)
	}
	return s
}

// TestResourceSlicePolicy writes ResourceSlices with the plugin's real identity on
// node-b (the ServiceAccount of deploy/manifests, a token bound to a pod on node-b)
// against the real API server and the admission policy of deploy/manifests: every
// way of publishing devices for another node is refused, by the rule that names it,
// on create, server-side apply, update and delete, and the plugin's own slices still
// go through. No plugin process is needed.
func TestResourceSlicePolicy(t *testing.T) {
	t.Parallel()
	e := manifestsOnlyEnv(t)
	c, admin := e.c, e.admin

	const own, other = "node-b", "node-a"
	kubeconfig := filepath.Join(c.Dir, "kubeconfigs", "plugin-"+own+".kubeconfig")
	ctx := context.Background()
	if err := harness.PluginIdentity(ctx, admin, c.Server, c.PKI.CAPEM(), own, kubeconfig, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	plugin := kubernetes.NewForConfigOrDie(cfg).ResourceV1().ResourceSlices()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	// The API server compiles a new policy and binding in the background.
	eventually(t, 60*time.Second, func() error {
		_, err := plugin.Create(ctx, policySlice("probe", other, nil), dryRun)
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			return nil
		}
		return fmt.Errorf("policy not in force yet: creating node-a's slice gave %v", err)
	})

	// want is "" for an accepted request, else a part of the policy's message.
	check := func(what string, err error, want string) {
		t.Helper()
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: refused: %v", what, err)
		case want == "":
			t.Logf("%s: accepted", what)
		case !apierrors.IsForbidden(err):
			t.Errorf("%s: got %v, want Forbidden by the admission policy", what, err)
		case !strings.Contains(err.Error(), want):
			t.Errorf("%s: refused, but not by the rule about %q: %v", what, want, err)
		default:
			t.Logf("%s: refused: %v", what, err)
		}
	}

	creates := []struct {
		what string
		edit func(*resourceapi.ResourceSlice)
		want string
	}{
		{"its own slice", nil, ""},
		{"spec.nodeName of another node", func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = ptr.To(other)
			s.Spec.Pool.Name = other
		}, "not those of node node-a"},
		{"spec.pool.name of another node", func(s *resourceapi.ResourceSlice) {
			s.Spec.Pool.Name = other
		}, "not of pool node-a"},
		{"spec.pool.name not named after any node", func(s *resourceapi.ResourceSlice) {
			s.Spec.Pool.Name = "shared"
		}, "not of pool shared"},
		{"spec.allNodes", func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = nil
			s.Spec.AllNodes = ptr.To(true)
		}, "spec.allNodes"},
		{"spec.nodeSelector for another node", func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = nil
			s.Spec.NodeSelector = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{other}}},
			}}}
		}, "spec.nodeSelector"},
		{"spec.nodeSelector for its own node", func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = nil
			s.Spec.NodeSelector = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{own}}},
			}}}
		}, "spec.nodeSelector"},
		{"spec.perDeviceNodeSelection with a device on another node", func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = nil
			s.Spec.PerDeviceNodeSelection = ptr.To(true)
			s.Spec.Devices[0].NodeName = ptr.To(other)
		}, "spec.perDeviceNodeSelection"},
		{"spec.perDeviceNodeSelection with a device on its own node", func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = nil
			s.Spec.PerDeviceNodeSelection = ptr.To(true)
			s.Spec.Devices[0].NodeName = ptr.To(own)
		}, "spec.perDeviceNodeSelection"},
		{"another driver", func(s *resourceapi.ResourceSlice) {
			s.Spec.Driver = "other.example.com"
		}, "only write ResourceSlices of driver"},
	}
	for _, tc := range creates {
		_, err := plugin.Create(ctx, policySlice("create-test", own, tc.edit), dryRun)
		check("create, "+tc.what, err, tc.want)
	}
	// Dynamic MIG's slices (devices that consume counters, and slices of counter
	// sets alone) pass the API server's validation and the policy as they are built.
	partitions := partitionSlicesFor(t, own)
	for _, s := range partitions {
		_, err := plugin.Create(ctx, s, dryRun)
		what := fmt.Sprintf("create, dynamic MIG slice %s (%d devices, %d counter sets)", s.Name, len(s.Spec.Devices), len(s.Spec.SharedCounters))
		check(what, err, "")
	}
	// They were at the API's limits (64 devices that consume counters, 8 counter
	// sets): one more of either is invalid, as the model's limits say.
	over := partitions[0].DeepCopy()
	over.Spec.Devices = append(over.Spec.Devices, partitions[3].Spec.Devices[0])
	if _, err := plugin.Create(ctx, over, dryRun); !apierrors.IsInvalid(err) {
		t.Errorf("65 devices that consume counters in one slice: got %v, want Invalid", err)
	}
	over = partitions[4].DeepCopy()
	extra := over.Spec.SharedCounters[0].DeepCopy()
	extra.Name = "gpu-8"
	over.Spec.SharedCounters = append(over.Spec.SharedCounters, *extra)
	if _, err := plugin.Create(ctx, over, dryRun); !apierrors.IsInvalid(err) {
		t.Errorf("9 counter sets in one slice: got %v, want Invalid", err)
	}

	// Server-side apply, the plugin's own way of writing: a create for a new slice.
	apply := func(name, pool string) error {
		_, err := plugin.Apply(ctx, resourceac.ResourceSlice(name).WithSpec(resourceac.ResourceSliceSpec().
			WithDriver(driverName).WithNodeName(own).
			WithPool(resourceac.ResourcePool().WithName(pool).WithGeneration(1).WithResourceSliceCount(1)).
			WithDevices(resourceac.Device().WithName("gpu-0"))),
			metav1.ApplyOptions{FieldManager: "topodra-kubelet-plugin", Force: true, DryRun: []string{metav1.DryRunAll}})
		return err
	}
	check("apply, its own slice", apply("apply-own", own), "")
	check("apply, spec.pool.name of another node", apply("apply-foreign-pool", other), "not of pool node-a")

	// Updates and deletes of slices someone else (an administrator, a stale
	// installation) already wrote.
	existing := map[string]*resourceapi.ResourceSlice{
		"own": policySlice("existing-own", own, nil),
		"foreign-pool": policySlice("existing-foreign-pool", own, func(s *resourceapi.ResourceSlice) {
			s.Spec.Pool.Name = other
		}),
		"other-node": policySlice("existing-other-node", other, nil),
		"all-nodes": policySlice("existing-all-nodes", own, func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeName = nil
			s.Spec.AllNodes = ptr.To(true)
		}),
	}
	for k, s := range existing {
		created, err := admin.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("admin creating %s: %v", s.Name, err)
		}
		existing[k] = created
	}
	update := func(k string) error {
		s := existing[k].DeepCopy()
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: "gpu-1"})
		_, err := plugin.Update(ctx, s, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	del := func(k string) error {
		return plugin.Delete(ctx, existing[k].Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	check("update, its own slice", update("own"), "")
	check("update, a slice of its node in another node's pool", update("foreign-pool"), "not of pool node-a")
	check("update, another node's slice", update("other-node"), "not those of node node-a")
	check("update, a slice for all nodes", update("all-nodes"), "spec.allNodes")
	check("delete, its own slice", del("own"), "")
	// A delete only looks at the node: the plugin may clean up a malformed slice of
	// its own node, never touch another node's.
	check("delete, a slice of its node in another node's pool", del("foreign-pool"), "")
	check("delete, another node's slice", del("other-node"), "not those of node node-a")
	check("delete, a slice for all nodes", del("all-nodes"), "not slices without spec.nodeName")
}
