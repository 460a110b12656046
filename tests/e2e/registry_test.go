package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

// releaseArtifacts are what make e2e hands the release tests: the directory of make
// release and the image tool of make image. Missing, the tests skip (fail with tools
// required). The test reads them under releaseBuild until it ends.
func releaseArtifacts(t *testing.T) (dir, tool string) {
	t.Helper()
	dir, tool = os.Getenv("TOPODRA_RELEASE_DIR"), os.Getenv("TOPODRA_IMAGE_TOOL")
	if dir == "" || tool == "" {
		why := "TOPODRA_RELEASE_DIR and TOPODRA_IMAGE_TOOL are not set (make e2e runs make release first)"
		if cluster.RequireTools() {
			t.Fatal(why)
		}
		t.Skip("skipping: " + why)
	}
	readsReleaseBuild(t)
	return dir, tool
}

// releaseBuild guards what make release and make image leave in target/ (the
// release directory, the image layout and tool, the unpacked image): the deployment
// guide's `make push` runs make release again, which writes them anew, so it holds
// releaseBuild for writing meanwhile, and each test that reads them holds it for
// reading until it ends. The guide then runs beside the other tests instead of
// alone before them. A test takes its read hold once (releaseReaders), never
// again from a subtest: a second read while a writer waits would never be granted.
var (
	releaseBuild   sync.RWMutex
	releaseReaders sync.Map // *testing.T holding releaseBuild for reading
)

// readsReleaseBuild holds releaseBuild for reading until t ends.
func readsReleaseBuild(t *testing.T) {
	if _, held := releaseReaders.LoadOrStore(t, struct{}{}); held {
		return
	}
	releaseBuild.RLock()
	t.Cleanup(func() {
		if _, held := releaseReaders.LoadAndDelete(t); held {
			releaseBuild.RUnlock()
		}
	})
}

// rewritesReleaseBuild runs rewrite with releaseBuild held for writing, t's own
// read hold given up meanwhile and taken again after.
func rewritesReleaseBuild(t *testing.T, rewrite func()) {
	if _, held := releaseReaders.LoadAndDelete(t); held {
		releaseBuild.RUnlock()
	}
	func() {
		releaseBuild.Lock()
		defer releaseBuild.Unlock()
		rewrite()
	}()
	readsReleaseBuild(t)
}

// serveRegistry serves go-containerregistry's in-process registry (the OCI
// distribution API, in memory) on a free loopback port, plain HTTP as tools allow
// for 127.0.0.1.
func serveRegistry(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// TestRegistryInstall is the operator's route from a release to a node: make push
// (deploy/image/push.sh, the script the make target runs) puts both images and the
// chart into a registry; helm installs the chart from the registry by its digest with
// the values file push wrote, into the real API server; the DaemonSet names the
// pushed plugin image by digest; that image, pulled back from the registry by the
// DaemonSet's own reference, runs as the DaemonSet's pod against the kubelet's
// plugin code, registers and publishes the node's GPUs.
func TestRegistryInstall(t *testing.T) {
	t.Parallel()
	relDir, tool := releaseArtifacts(t)
	_ = imageRootfs(t) // the same prerequisites: an unpacked image, and runc
	e := newEnv(t, envOptions{profile: "dgx-h100", fromChart: true})
	reg := serveRegistry(t) + "/topodra"

	pushDir := filepath.Join(e.c.Dir, "push")
	cmd := exec.Command("bash", filepath.Join(repoRoot(t), "deploy", "image", "push.sh"))
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "REGISTRY="+reg, "PUSH_DIR="+pushDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("push.sh: %v\n%s", err, out)
	}
	t.Logf("push.sh:\n%s", out)
	var pushed []struct {
		Kind, Name, Repository, Tag, Digest string
	}
	raw, err := os.ReadFile(filepath.Join(pushDir, "pushed.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &pushed); err != nil {
		t.Fatal(err)
	}
	digest, tag := map[string]string{}, map[string]string{}
	for _, p := range pushed {
		digest[p.Name], tag[p.Name] = p.Digest, p.Tag
	}
	// The digests pushed are those make image recorded.
	digests, err := os.ReadFile(filepath.Join(relDir, "digests.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range []string{"topodra-kubelet-plugin", "topodra-controller"} {
		if digest[im] == "" || !strings.Contains(string(digests), digest[im]) {
			t.Fatalf("%s pushed with digest %q, not one of digests.txt:\n%s", im, digest[im], digests)
		}
	}
	if digest["topodra"] == "" {
		t.Fatalf("no chart in pushed.json:\n%s", raw)
	}

	d := newChartDeployment(t, e, "")
	d.run("install", "topodra", "oci://"+reg+"/topodra@"+digest["topodra"], "--plain-http",
		"--values", filepath.Join(pushDir, "values.yaml"), "--values", d.values, "--wait=false", "--create-namespace")

	ds := d.daemonSet()
	ref := ds.Spec.Template.Spec.Containers[0].Image
	want := reg + "/topodra-kubelet-plugin:" + tag["topodra-kubelet-plugin"] + "@" + digest["topodra-kubelet-plugin"]
	if ref != want {
		t.Fatalf("the DaemonSet runs %s, want the pushed image %s", ref, want)
	}
	deps, err := e.admin.AppsV1().Deployments(harness.PluginNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantController := reg + "/topodra-controller:" + tag["topodra-controller"] + "@" + digest["topodra-controller"]
	found := false
	for _, dep := range deps.Items {
		for _, c := range dep.Spec.Template.Spec.Containers {
			found = found || c.Image == wantController
		}
	}
	if !found {
		t.Errorf("no Deployment runs the pushed controller image %s", wantController)
	}

	// The pod runs what the registry serves for that reference.
	d.rootfs = filepath.Join(e.c.Dir, "pulled-rootfs")
	if out, err := exec.Command(tool, "unpack", "-pull", ref, "-dest", d.rootfs).CombinedOutput(); err != nil {
		t.Fatalf("topodra-image unpack -pull %s: %v\n%s", ref, err, out)
	}
	e.plugin = d.startPod("plugin-pulled")
	d.waitServing(e.plugin, "000000000001", 2*time.Minute)
	e.waitDevices(8, time.Minute)
}

// TestReleaseKrewManifest installs kubectl-topodra as a user of krew would, from the
// manifest and archive that make release wrote (krew's --archive stands in for the
// download of the manifest's uri): krew checks the manifest and the archive's sha256,
// and the plugin it links runs.
func TestReleaseKrewManifest(t *testing.T) {
	t.Parallel()
	relDir, _ := releaseArtifacts(t)
	krew, err := exec.LookPath("krew")
	if err != nil {
		if cluster.RequireTools() {
			t.Fatal("no krew on PATH (tests/tools/build.sh krew)")
		}
		t.Skip("skipping: no krew on PATH (tests/tools/build.sh krew)")
	}
	archives, _ := filepath.Glob(filepath.Join(relDir, "kubectl-topodra-*.tar.gz"))
	if len(archives) != 1 {
		t.Fatalf("want one kubectl-topodra archive in %s, found %v", relDir, archives)
	}
	manifest := filepath.Join(relDir, "topodra.krew.yaml")
	sums, err := os.ReadFile(filepath.Join(relDir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Base(archives[0]), filepath.Base(manifest)} {
		if !strings.Contains(string(sums), "  "+f+"\n") {
			t.Errorf("SHA256SUMS does not list %s:\n%s", f, sums)
		}
	}

	root := t.TempDir()
	cmd := exec.Command(krew, "install", "--manifest="+manifest, "--archive="+archives[0])
	cmd.Env = append(os.Environ(), "KREW_ROOT="+root, "KREW_NO_UPGRADE_CHECK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("krew install: %v\n%s", err, out)
	}
	t.Logf("krew install:\n%s", out)
	v, err := exec.Command(filepath.Join(root, "bin", "kubectl-topodra"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl-topodra installed by krew: %v\n%s", err, v)
	}
	if !strings.HasPrefix(string(v), "kubectl-topodra ") {
		t.Errorf("kubectl-topodra --version: %q", v)
	}
	// The licence travels with the binary: krew keeps the manifest's files in its
	// store, under the plugin's version.
	want, err := os.ReadFile(filepath.Join(repoRoot(t), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	installed, _ := filepath.Glob(filepath.Join(root, "store", "topodra", "*", "LICENSE"))
	if len(installed) != 1 {
		t.Fatalf("krew's store holds no single LICENSE of kubectl-topodra: %v", installed)
	}
	if got, err := os.ReadFile(installed[0]); err != nil || string(got) != string(want) {
		t.Errorf("%s is not the repository's LICENSE (err %v)", installed[0], err)
	}
}
