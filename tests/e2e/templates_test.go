package e2e

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// claimSpec is a ResourceClaimTemplate with one request, "gpus", of the chart's
// DeviceClass: what most tests ask for, written once.
type claimSpec struct {
	ns, name string
	// count GPUs; zero leaves the field out (one device).
	count int
	// selector is a CEL expression every device must meet; none when empty.
	selector string
	// match is an attribute all the devices share; none when empty.
	match string
}

func (c claimSpec) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: %s
  namespace: %s
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: gpu.topodra.dev
`, c.name, c.ns)
	if c.count > 0 {
		fmt.Fprintf(&b, "            count: %d\n", c.count)
	}
	if c.selector != "" {
		fmt.Fprintf(&b, "            selectors:\n              - cel:\n                  expression: %q\n", c.selector)
	}
	if c.match != "" {
		fmt.Fprintf(&b, "      constraints:\n        - requests: [\"gpus\"]\n          matchAttribute: %s\n", c.match)
	}
	return b.String()
}

// claimTemplate renders a ResourceClaimTemplate for count GPUs whose devices all
// share attribute match (none when empty).
func claimTemplate(ns, name string, count int, match string) string {
	return claimSpec{ns: ns, name: name, count: count, match: match}.yaml()
}

// The builder's YAML is a valid ResourceClaimTemplate with what each field asks for.
func TestClaimSpecYAML(t *testing.T) {
	var got resourceapi.ResourceClaimTemplate
	y := claimSpec{ns: "ns1", name: "t", count: 2, selector: numaSelector(1), match: "gpu.topodra.dev/socket"}.yaml()
	if err := yaml.UnmarshalStrict([]byte(y), &got); err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	d := got.Spec.Spec.Devices
	r := d.Requests[0].Exactly
	if got.Namespace != "ns1" || r.Count != 2 || r.Selectors[0].CEL.Expression != numaSelector(1) ||
		string(*d.Constraints[0].MatchAttribute) != "gpu.topodra.dev/socket" {
		t.Errorf("decoded %+v from\n%s", got, y)
	}
}
