package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	gpu0 = "k8s.gpu.topodra.dev/claim=c1-gpu-0"
	gpu1 = "k8s.gpu.topodra.dev/claim=c1-gpu-1"
)

// runCLI runs the command in-process and returns its exit status and output.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func decode(t *testing.T, out string) Result {
	t.Helper()
	var res Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	return res
}

func devicePaths(res Result) []string {
	var paths []string
	if res.Linux != nil {
		for _, d := range res.Linux.Devices {
			paths = append(paths, d.Path)
		}
	}
	return paths
}

func TestInjectsOneDeviceWithTheSpecWideEdits(t *testing.T) {
	code, out, errOut := runCLI(t, "--spec-dir", "testdata/valid", gpu0)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	res := decode(t, out)

	if got, want := devicePaths(res), []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"}; !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v", got, want)
	}
	for _, d := range res.Linux.Devices {
		if d.Type != "c" {
			t.Errorf("%s: type %q, want c", d.Path, d.Type)
		}
		if d.Path == "/dev/nvidia0" && (d.Major != 195 || d.Minor != 0) {
			t.Errorf("/dev/nvidia0 is %d:%d, want 195:0", d.Major, d.Minor)
		}
	}
	if res.Linux.Resources == nil || len(res.Linux.Resources.Devices) != 3 {
		t.Fatalf("cgroup rules: %+v", res.Linux.Resources)
	}
	for _, r := range res.Linux.Resources.Devices {
		if !r.Allow || r.Access != "rw" {
			t.Errorf("cgroup rule %+v: want allow rw", r)
		}
	}

	if len(res.Mounts) != 1 || res.Mounts[0].Destination != "/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07" ||
		!strings.HasPrefix(res.Mounts[0].Source, "/run/nvidia/driver/") || !slices.Contains(res.Mounts[0].Options, "ro") {
		t.Errorf("mounts: %+v", res.Mounts)
	}
	if res.Process == nil || !slices.Contains(res.Process.Env, "TOPODRA_NUMA_NODES=0") {
		t.Errorf("env: %+v", res.Process)
	}
	if res.Hooks == nil || len(res.Hooks.CreateContainer) != 1 || res.Hooks.CreateContainer[0].Path != "/usr/bin/nvidia-cdi-hook" {
		t.Errorf("hooks: %+v", res.Hooks)
	}
	if len(res.Specs) != 2 {
		t.Errorf("specs loaded: %+v", res.Specs)
	}
	if !strings.HasPrefix(res.Library, cdiModule+" v") {
		t.Errorf("library %q", res.Library)
	}
}

func TestTwoDevicesOfOneClaimGetTheSpecWideEditsOnce(t *testing.T) {
	code, out, errOut := runCLI(t, "--spec-dir", "testdata/valid", gpu0, gpu1)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	res := decode(t, out)
	got := devicePaths(res)
	slices.Sort(got)
	if want := []string{"/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v", got, want)
	}
	if n := len(res.Process.Env); n != 3 {
		t.Errorf("env applied %d entries, want 3: %v", n, res.Process.Env)
	}
}

func TestInjectsIntoAGivenOCISpec(t *testing.T) {
	in := filepath.Join(t.TempDir(), "config.json")
	config := `{"ociVersion": "1.2.0", "process": {"cwd": "/", "args": ["sh"], "env": ["PATH=/usr/bin", "TOPODRA_NUMA_NODES=7"],
		"user": {"uid": 1000, "gid": 1000}}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}], "linux": {}}`
	if err := os.WriteFile(in, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "--spec-dir", "testdata/valid", "--oci-spec", in, gpu0)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	res := decode(t, out)
	// CDI env replaces a key the container already has and keeps the rest.
	if !slices.Contains(res.Process.Env, "PATH=/usr/bin") || !slices.Contains(res.Process.Env, "TOPODRA_NUMA_NODES=0") ||
		slices.Contains(res.Process.Env, "TOPODRA_NUMA_NODES=7") {
		t.Errorf("env: %v", res.Process.Env)
	}
	if len(res.Mounts) != 2 {
		t.Errorf("mounts: %+v", res.Mounts)
	}
	// Device nodes are owned by the container's user.
	for _, d := range res.Linux.Devices {
		if d.UID == nil || *d.UID != 1000 {
			t.Errorf("%s: uid %v, want 1000", d.Path, d.UID)
		}
	}
}

func TestWritesTheWholeEditedOCISpec(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "base.json")
	outPath := filepath.Join(dir, "config.json")
	config := `{"ociVersion": "1.0.2-dev", "hostname": "box", "root": {"path": "rootfs", "readonly": true},
		"process": {"cwd": "/", "args": ["sh", "-c", "env"], "env": ["PATH=/bin"]},
		"mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
		"linux": {"namespaces": [{"type": "mount"}], "resources": {"devices": [{"allow": false, "access": "rwm"}]}}}`
	if err := os.WriteFile(in, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "--spec-dir", "testdata/valid", "--oci-spec", in, "--oci-spec-out", outPath, gpu0)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	res := decode(t, out)
	data, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("written spec is not JSON: %v\n%s", err, data)
	}

	// What the base spec had is still there, for the runtime to run.
	if spec.Hostname != "box" || spec.Root == nil || spec.Root.Path != "rootfs" || !spec.Root.Readonly ||
		!slices.Equal(spec.Process.Args, []string{"sh", "-c", "env"}) || len(spec.Linux.Namespaces) != 1 {
		t.Errorf("base spec lost: %s", data)
	}
	// The deny-all rule stays first, so the CDI allow rules after it decide.
	rules := spec.Linux.Resources.Devices
	if len(rules) != 4 || rules[0].Allow || !rules[1].Allow {
		t.Errorf("cgroup rules: %+v", rules)
	}
	// And the edits are those the summary on stdout reports.
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	if !slices.Equal(paths, devicePaths(res)) || !slices.Equal(spec.Process.Env, res.Process.Env) ||
		len(spec.Mounts) != len(res.Mounts) || len(spec.Hooks.CreateContainer) != 1 {
		t.Errorf("written spec differs from the result:\n%s\nresult: %s", data, out)
	}
	if _, err := os.Stat(outPath + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}

func TestNoOCISpecIsWrittenOnFailure(t *testing.T) {
	outPath := filepath.Join(t.TempDir(), "config.json")
	code, _, errOut := runCLI(t, "--spec-dir", "testdata/valid", "--oci-spec-out", outPath, "k8s.gpu.topodra.dev/claim=gone-gpu-3")
	if code != exitFail {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if _, err := os.Stat(outPath); !os.IsNotExist(err) {
		t.Errorf("spec written for a failed injection: %v", err)
	}
	code, _, errOut = runCLI(t, "--spec-dir", "testdata/valid", "--oci-spec-out", filepath.Join(t.TempDir(), "none", "config.json"), gpu0)
	if code != exitFail || !strings.Contains(errOut, "OCI spec out: ") {
		t.Errorf("unwritable path: exit %d: %s", code, errOut)
	}
}

func TestAnInvalidSpecInTheDirIsFatalWithTheLibrarysError(t *testing.T) {
	// gpu0's own spec is fine; another spec in the directory is not.
	code, out, errOut := runCLI(t, "--spec-dir", "testdata/invalid", gpu0)
	if code != exitFail {
		t.Fatalf("exit %d, want %d; stdout: %s", code, exitFail, out)
	}
	if out != "" {
		t.Errorf("printed a result on failure: %s", out)
	}
	for _, want := range []string{
		"2 CDI spec error(s)",
		"k8s.gpu.topodra.dev-claim_bad.json: ",
		`invalid character ' ' in device name "bad name!"`,
		"unknown-field.json: ",
		"field envs not found",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}

	code, _, errOut = runCLI(t, "--spec-dir", "testdata/invalid", "--validate-only")
	if code != exitFail || !strings.Contains(errOut, "bad name!") {
		t.Errorf("validate-only: exit %d: %s", code, errOut)
	}
}

func TestAnUnresolvableDeviceIsNamed(t *testing.T) {
	missing := "k8s.gpu.topodra.dev/claim=gone-gpu-3"
	code, _, errOut := runCLI(t, "--spec-dir", "testdata/valid", gpu0, missing)
	if code != exitFail || !strings.Contains(errOut, "unresolvable CDI devices "+missing) {
		t.Errorf("exit %d: %s", code, errOut)
	}
	code, _, errOut = runCLI(t, "--spec-dir", "testdata/valid", "--validate-only", missing)
	if code != exitFail || !strings.Contains(errOut, "unresolvable CDI devices "+missing) {
		t.Errorf("validate-only: exit %d: %s", code, errOut)
	}
}

func TestValidateOnlyListsTheSpecs(t *testing.T) {
	code, out, errOut := runCLI(t, "--spec-dir", "testdata/valid", "--validate-only", gpu1)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	res := decode(t, out)
	if res.Linux != nil || res.Process != nil || res.Mounts != nil {
		t.Errorf("validate-only injected: %s", out)
	}
	var all []string
	for _, s := range res.Specs {
		all = append(all, s.Devices...)
	}
	slices.Sort(all)
	if want := []string{"example.com/net=eth0", gpu0, gpu1}; !slices.Equal(all, want) {
		t.Errorf("devices %v, want %v", all, want)
	}
}

func TestUsageErrors(t *testing.T) {
	for name, args := range map[string][]string{
		"no spec dir":                 {gpu0},
		"no devices":                  {"--spec-dir", "testdata/valid"},
		"unqualified id":              {"--spec-dir", "testdata/valid", "c1-gpu-0"},
		"validate-only with spec out": {"--spec-dir", "testdata/valid", "--validate-only", "--oci-spec-out", "x.json", gpu0},
	} {
		if code, _, _ := runCLI(t, args...); code != exitUsage {
			t.Errorf("%s: exit %d, want %d", name, code, exitUsage)
		}
	}
	code, _, errOut := runCLI(t, "--spec-dir", filepath.Join(t.TempDir(), "nope"), gpu0)
	if code != exitFail || !strings.Contains(errOut, "no such file or directory") {
		t.Errorf("missing dir: exit %d: %s", code, errOut)
	}
}
