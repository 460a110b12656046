package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoProfiles runs `make demo`'s script on every machine it offers
// (tests/scripts/demo.sh --list), side by side. Each demo checks what it tells the
// reader (N-1 pods run on GPUs that share the attribute asked for, the last waits,
// the controller says why, and it runs once the first pod is deleted) and exits
// non-zero otherwise, so a profile whose topology no longer fits its demo fails
// here, not in front of a new user. The demos use the debug binaries as they are
// (TOPODRA_DEMO_PREBUILT=1): the other tests run the same ones.
func TestDemoProfiles(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	binary(t, "TOPODRA_PLUGIN_BIN", "topodra-kubelet-plugin") // skip early when absent
	demo := filepath.Join(root, "tests", "scripts", "demo.sh")
	out, err := exec.Command("bash", demo, "--list").Output()
	if err != nil {
		t.Fatalf("demo.sh --list: %v", err)
	}
	profiles := strings.Fields(string(out))
	if len(profiles) < 5 {
		t.Fatalf("demo.sh --list: %q; want the five machines the README names", out)
	}
	for _, profile := range profiles {
		t.Run(profile, func(t *testing.T) {
			t.Parallel()
			// A failed demo keeps its directory with every log (it says where); the
			// test's own temporary directories would be removed.
			tmp, err := os.MkdirTemp("", "topodra-demo-test-")
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", demo, profile)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "TOPODRA_DEMO_PREBUILT=1", "TMPDIR="+tmp)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("make demo SIM_PROFILE=%s: %v\n%s", profile, err, tail(string(out), 60))
			}
			if !strings.Contains(string(out), "== done: ") {
				t.Fatalf("make demo SIM_PROFILE=%s exited 0 without its closing line:\n%s", profile, tail(string(out), 60))
			}
			os.RemoveAll(tmp)
			t.Logf("make demo SIM_PROFILE=%s:\n%s", profile, tail(string(out), 25))
		})
	}
}
