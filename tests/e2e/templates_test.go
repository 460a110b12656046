package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// claimSpec is a ResourceClaimTemplate with one request, "gpus", of the chart's
// DeviceClass: what most tests ask for, written once.
type claimSpec struct {
	ns, name string
	// class is the DeviceClass of the request; gpu.topodra.dev (whole GPUs) when
	// empty.
	class string
	// count GPUs; zero leaves the field out (one device).
	count int
	// selector is a CEL expression every device must meet; none when empty.
	selector string
	// match is an attribute all the devices share; none when empty.
	match string
	// firstAvailable makes "gpus" a list of alternatives, its subrequests, tried in
	// order: each with its name, count, selector and match; the fields above are
	// then unused but for ns and name.
	firstAvailable []claimSpec
	// parameters is the body of an opaque GpuConfig for "gpus" (YAML, without
	// apiVersion and kind); no config when empty.
	parameters string
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
`, c.name, c.ns)
	// requests: ["gpus"] or ["gpus/<subrequest>"] with their matchAttribute.
	var constraints [][2]string
	if len(c.firstAvailable) == 0 {
		b.WriteString("          exactly:\n")
		c.writeDevices(&b, "            ")
		if c.match != "" {
			constraints = append(constraints, [2]string{"gpus", c.match})
		}
	} else {
		b.WriteString("          firstAvailable:\n")
		for _, sub := range c.firstAvailable {
			fmt.Fprintf(&b, "            - name: %s\n", sub.name)
			sub.writeDevices(&b, "              ")
			if sub.match != "" {
				constraints = append(constraints, [2]string{"gpus/" + sub.name, sub.match})
			}
		}
	}
	if len(constraints) > 0 {
		b.WriteString("      constraints:\n")
		for _, con := range constraints {
			fmt.Fprintf(&b, "        - requests: [%q]\n          matchAttribute: %s\n", con[0], con[1])
		}
	}
	if c.parameters != "" {
		b.WriteString(`      config:
        - requests: ["gpus"]
          opaque:
            driver: gpu.topodra.dev
            parameters:
              apiVersion: gpu.topodra.dev/v1alpha1
              kind: GpuConfig
`)
		for _, line := range strings.Split(strings.TrimSuffix(c.parameters, "\n"), "\n") {
			b.WriteString("              " + line + "\n")
		}
	}
	return b.String()
}

// writeDevices writes what one request or subrequest asks for, each line indented.
func (c claimSpec) writeDevices(b *strings.Builder, indent string) {
	class := c.class
	if class == "" {
		class = driverName
	}
	fmt.Fprintf(b, "%sdeviceClassName: %s\n", indent, class)
	if c.count > 0 {
		fmt.Fprintf(b, "%scount: %d\n", indent, c.count)
	}
	if c.selector != "" {
		fmt.Fprintf(b, "%sselectors:\n%s  - cel:\n%s      expression: %q\n", indent, indent, indent, c.selector)
	}
}

// claimTemplate renders a ResourceClaimTemplate for count GPUs whose devices all
// share attribute match (none when empty).
func claimTemplate(ns, name string, count int, match string) string {
	return claimSpec{ns: ns, name: name, count: count, match: match}.yaml()
}

// The builder's YAML is a valid ResourceClaimTemplate with what each field asks for.
func TestClaimSpecYAML(t *testing.T) {
	t.Parallel()
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

	got = resourceapi.ResourceClaimTemplate{}
	y = claimSpec{ns: "ns1", name: "t", parameters: "numa:\n  requireAligned: true\n", firstAvailable: []claimSpec{
		{name: "aligned", count: 4, match: "resource.kubernetes.io/numaNode"},
		{name: "any", selector: numaSelector(0)},
	}}.yaml()
	if err := yaml.UnmarshalStrict([]byte(y), &got); err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	d = got.Spec.Spec.Devices
	subs := d.Requests[0].FirstAvailable
	if len(subs) != 2 || subs[0].Name != "aligned" || subs[0].Count != 4 || subs[1].Selectors[0].CEL.Expression != numaSelector(0) ||
		len(d.Constraints) != 1 || !slices.Equal(d.Constraints[0].Requests, []string{"gpus/aligned"}) ||
		len(d.Config) != 1 || !strings.Contains(string(d.Config[0].Opaque.Parameters.Raw), "requireAligned") {
		t.Errorf("decoded %+v from\n%s", got, y)
	}
}
