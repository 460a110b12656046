package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

// kubernetes-sigs' CPU DRA driver (dra-driver-cpu v0.2.0, binary dracpu, built by
// tests/tools/build.sh dra-driver-cpu), run beside our plugin on the simulated node.

const (
	cpuDriverName = "dra.cpu"
	// Where its ServiceAccount lives; the test makes both.
	cpuDriverNamespace = "dra-driver-cpu"
	cpuDriverSA        = "dracpu"
)

// cpuDriverPluginPaths is dracpu's mount namespace as the harness sees it: the
// kubelet directories it is given are this node's (see startCPUDriver).
func cpuDriverPluginPaths(kubeletRoot string) map[string]string {
	return map[string]string{
		"/var/lib/kubelet/plugins":          filepath.Join(kubeletRoot, "plugins"),
		"/var/lib/kubelet/plugins_registry": filepath.Join(kubeletRoot, "plugins_registry"),
	}
}

// cpuDriverObjects: its ServiceAccount, the least RBAC v0.2.0 works with (read from
// its source: the kubeletplugin helper publishes the node's ResourceSlices (list,
// watch, create, update, delete) owned by the Node (get), and prepare reads the
// claim (get)), and the DeviceClass its claims name (device.driver == "dra.cpu",
// the class its chart installs). Its chart grants more (pods, claim status,
// DeviceClasses) for features this test does not use.
const cpuDriverObjects = `apiVersion: v1
kind: Namespace
metadata:
  name: ` + cpuDriverNamespace + `
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: ` + cpuDriverSA + `
  namespace: ` + cpuDriverNamespace + `
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: e2e-dracpu
rules:
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get]
  - apiGroups: [resource.k8s.io]
    resources: [resourceslices]
    verbs: [list, watch, create, update, delete]
  - apiGroups: [resource.k8s.io]
    resources: [resourceclaims]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-dracpu
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: e2e-dracpu
subjects:
  - kind: ServiceAccount
    name: ` + cpuDriverSA + `
    namespace: ` + cpuDriverNamespace + `
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: ` + cpuDriverName + `
spec:
  selectors:
    - cel:
        expression: device.driver == "` + cpuDriverName + `"
`

// cpuDriverBinary is $TOPODRA_DRACPU (tests/tools/build.sh --env dra-driver-cpu
// exports it); the test skips without it, or fails with TOPODRA_REQUIRE_TOOLS=1.
func cpuDriverBinary(t testing.TB) string {
	t.Helper()
	p := os.Getenv("TOPODRA_DRACPU")
	if p == "" {
		msg := "TOPODRA_DRACPU is not set (eval \"$(tests/tools/build.sh --env kube etcd helm dra-driver-cpu)\")"
		if cluster.RequireTools() {
			t.Fatal(msg)
		}
		t.Skip("skipping: " + msg)
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		t.Fatalf("TOPODRA_DRACPU=%s: not a file (%v)", p, err)
	}
	return p
}

// needCPUDriver skips (or fails, with TOPODRA_REQUIRE_TOOLS=1) where dracpu cannot
// run: it needs its binary and a mount namespace (root).
func needCPUDriver(t testing.TB) string {
	t.Helper()
	bin := cpuDriverBinary(t)
	if why := canRunContainers(); why != "" {
		msg := "the CPU driver runs in its own mount namespace: " + why
		if cluster.RequireTools() {
			t.Fatal(msg)
		}
		t.Skip("skipping: " + msg)
	}
	return bin
}

// startCPUDriver runs dracpu for the node (made with envOptions.cpuDriver) as its
// DaemonSet would run it, in a private mount namespace with its own root
// (chroot), where it finds everything at the fixed paths it uses:
//
//   - /var/lib/kubelet/plugins and /var/lib/kubelet/plugins_registry: the node's
//     kubelet directories, as the upstream DaemonSet mounts the host's (the
//     kubeletplugin defaults: the registration socket dra.cpu-reg.sock and the
//     DRA socket plugins/dra.cpu/dra.sock, which it registers by that path; the
//     harness maps it back with cpuDriverPluginPaths);
//   - /var/run/cdi: the node's CDI directory (its specs, kind dra.k8s.io/cpu,
//     go where the runtime, here the harness, loads ours from);
//   - /var/run/nri: the harness's NRI socket directory (nri.sock, the stub's
//     default);
//   - /sys: the simulated node's CPU sysfs (read-only). v0.2.0 reads its topology
//     under $HOST_ROOT/sys (HOST_ROOT defaults to /), but the online CPU list in
//     pkg/driver through os.DirFS("/sys") whatever HOST_ROOT says, so the fake
//     must be /sys itself; HOST_ROOT is left unset, as its DaemonSet leaves it.
//
// Its HTTP endpoint (/healthz turns 200 once it is registered with the kubelet)
// is on a free loopback port. It runs under its own ServiceAccount with the RBAC
// of cpuDriverObjects.
func (e *env) startCPUDriver(bin string, args ...string) *proc {
	t := e.t
	t.Helper()
	if e.cpuHostRoot == "" || e.nriDir == "" {
		t.Fatal("startCPUDriver needs an env made with envOptions.cpuDriver")
	}
	ctx := context.Background()
	root := filepath.Join(e.c.Dir, "dracpu-root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().ServiceAccounts(cpuDriverNamespace).Get(ctx, cpuDriverSA, metav1.GetOptions{}); err != nil {
		e.kubectlApply(cpuDriverObjects)
	}
	if err := harness.ServiceAccountKubeconfig(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), cpuDriverNamespace, cpuDriverSA,
		filepath.Join(root, "kubeconfig"), 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	// Arguments after the script name: the root, the binary and the sources of
	// the mounts, then dracpu's arguments, so nothing is parsed by the shell.
	const script = `set -eu
R="$1" BIN="$2" SYS="$3" PLUGINS="$4" REGISTRY="$5" CDI="$6" NRI="$7"; shift 7
for d in proc dev tmp sys var/lib/kubelet/plugins var/lib/kubelet/plugins_registry var/run/cdi var/run/nri; do mkdir -p "$R/$d"; done
mount -t proc proc "$R/proc"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
for n in null zero urandom; do touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
mount -t tmpfs tmpfs "$R/tmp"
mount --bind "$SYS" "$R/sys"; mount -o remount,bind,ro "$R/sys"
mount --bind "$PLUGINS" "$R/var/lib/kubelet/plugins"
mount --bind "$REGISTRY" "$R/var/lib/kubelet/plugins_registry"
mount --bind "$CDI" "$R/var/run/cdi"
mount --bind "$NRI" "$R/var/run/nri"
touch "$R/dracpu"; mount --bind "$BIN" "$R/dracpu"
exec chroot "$R" /dracpu "$@"
`
	argv := []string{"--mount", "--propagation", "private", "bash", "-c", script, "dracpu", root, bin,
		filepath.Join(e.cpuHostRoot, "sys"), filepath.Join(e.kubeletRoot, "plugins"), filepath.Join(e.kubeletRoot, "plugins_registry"),
		filepath.Join(e.dir, "cdi"), e.nriDir,
		"--kubeconfig=/kubeconfig", "--hostname-override=" + e.node, "--bind-address=" + addr, "--v=4"}
	argv = append(argv, args...)
	logPath := filepath.Join(e.c.LogsDir, fmt.Sprintf("dracpu-%s-%d.log", e.node, time.Now().UnixNano()))
	if err := os.WriteFile(filepath.Join(e.c.Dir, "dracpu.sh"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	p := startProcEnv(t, "dracpu", "unshare", argv, env, logPath, addr)
	t.Logf("dracpu: started (log %s)", logPath)
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", p.log, tailFile(p.log, 40))
		}
	})
	return p
}

// cpuDevices waits until the node's dra.cpu slices (a complete pool) publish n
// devices.
func (e *env) cpuDevices(n int, timeout time.Duration) map[string]resourceapi.Device {
	e.t.Helper()
	var got map[string]resourceapi.Device
	eventually(e.t, timeout, func() error {
		l, err := e.admin.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", e.node),
				fields.OneTermEqualSelector("spec.driver", cpuDriverName)).String(),
		})
		if err != nil {
			return err
		}
		got = map[string]resourceapi.Device{}
		for _, s := range l.Items {
			for _, d := range s.Spec.Devices {
				got[d.Name] = d
			}
		}
		if len(got) != n {
			var names []string
			for name := range got {
				names = append(names, name)
			}
			return fmt.Errorf("%d %s devices published (%s), want %d", len(got), cpuDriverName, strings.Join(names, ","), n)
		}
		return nil
	})
	return got
}

// cpuDriverBeside starts dra-driver-cpu (`dracpu`) beside our plugin, waits until
// both are registered and our pool has `devices` devices, and returns those with
// each CPU device's NUMA node as the CPU driver publishes it under numaAlias.
func (e *env) cpuDriverBeside(dracpu string, devices int) (map[string]resourceapi.Device, map[string]int64) {
	e.t.Helper()
	e.startCPUDriver(dracpu)
	e.waitRegistered(2 * time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	_, err := e.h.WaitRegistered(ctx, cpuDriverName)
	cancel()
	if err != nil {
		e.t.Fatal(err)
	}
	ours := e.waitDevices(devices, 2*time.Minute)
	cpuNUMA := map[string]int64{}
	for name, d := range e.cpuDevices(2, time.Minute) {
		if n, ok := d.Attributes[numaAlias]; ok && n.IntValue != nil {
			cpuNUMA[name] = *n.IntValue
		}
	}
	return ours, cpuNUMA
}

// hogNUMA1CPUs runs a pod in `ns` holding every CPU of NUMA node 1 (112 on the
// simulated DGX H100), so what needs CPUs beside its GPUs must go to NUMA node 0.
func (e *env) hogNUMA1CPUs(ns string) {
	e.t.Helper()
	e.kubectlApply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: numa1-cpus
  namespace: ` + ns + `
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly:
            deviceClassName: ` + cpuDriverName + `
            selectors:
              - cel:
                  expression: device.attributes["dra.net"].numaNode == 1
            capacity:
              requests:
                ` + cpuDriverName + `/cpu: "112"
`)
	e.createPod(ns, "cpu-hog", "numa1-cpus")
	e.waitPodRunning(ns, "cpu-hog", 2*time.Minute)
}
