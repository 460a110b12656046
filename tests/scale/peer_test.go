package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The committed bench-node slices of NVIDIA's plugin replicate over the fleet:
// each node's copy names that node and a pool of its own, devices unchanged.
func TestNvidiaFleetFromTheCommittedSlices(t *testing.T) {
	specs, err := loadNvidiaSpecs(filepath.Join("..", "..", "docs", "benchmarks", "node-path.slices.json"))
	if err != nil {
		t.Fatal(err)
	}
	fleet := nvidiaFleet(specs, 3)
	if len(fleet) != 3 || len(fleet[2]) != len(specs) {
		t.Fatalf("fleet %d nodes, node 2 has %d slices", len(fleet), len(fleet[2]))
	}
	s := fleet[2][0]
	if *s.Spec.NodeName != nodeName(2) || s.Spec.Pool.Name != nodeName(2) || s.Spec.Driver != nvidiaDriverName {
		t.Fatalf("slice %+v", s.Spec)
	}
	if len(s.Spec.Devices) != 8 || s.Spec.Devices[0].Name != specs[0].Devices[0].Name {
		t.Fatalf("devices %v", s.Spec.Devices)
	}
	if specs[0].NodeName != nil && *specs[0].NodeName == nodeName(2) {
		t.Fatal("the template was changed in place")
	}
	if b := sliceBytesPerGPU(fleet[0]); b < 300 || b > 700 {
		t.Fatalf("%.0f bytes per GPU", b)
	}
}

func TestNvidiaSlicesRefuseOtherDrivers(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"other-driver.json": `{"nvidia": [{"driver": "gpu.topodra.dev", "devices": [{"name": "gpu-0"}]}]}`,
		"none.json":         `{"topodra": []}`,
		"garbage.json":      `{`,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := loadNvidiaSpecs(p)
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: want an error naming the file, got %v", name, err)
		}
	}
}
