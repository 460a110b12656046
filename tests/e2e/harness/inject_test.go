package harness

import (
	"slices"
	"strings"
	"testing"
)

// InjectCDI against the CDI fixtures of tests/cdi-check (no cluster needed).
func TestInjectCDI(t *testing.T) {
	inj, err := InjectCDI("../../cdi-check/testdata/valid", []string{"k8s.gpu.topodra.dev/claim=c1-gpu-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(inj.DeviceNodes, "/dev/nvidia1") || slices.Contains(inj.DeviceNodes, "/dev/nvidia0") {
		t.Errorf("device nodes %v: want /dev/nvidia1 and not /dev/nvidia0", inj.DeviceNodes)
	}
	if len(inj.Env) == 0 || len(inj.Mounts) == 0 {
		t.Errorf("spec-level edits missing: env %v, mounts %v", inj.Env, inj.Mounts)
	}

	if _, err := InjectCDI("../../cdi-check/testdata/valid", []string{"k8s.gpu.topodra.dev/claim=nope"}); err == nil ||
		!strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown device: err %v", err)
	}
	// Any spec error in the directory fails the injection, as it must for our specs.
	if _, err := InjectCDI("../../cdi-check/testdata/invalid", []string{"k8s.gpu.topodra.dev/claim=c1-gpu-0"}); err == nil {
		t.Errorf("invalid spec directory accepted")
	} else {
		t.Logf("invalid directory: %v", err)
	}
	if inj, err := InjectCDI("/nonexistent", nil); err != nil || len(inj.DeviceNodes) != 0 {
		t.Errorf("no devices: %+v, %v", inj, err)
	}
}
