package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"topodra.dev/tests/e2e/harness"
)

// guidePage is the install guide TestDeploymentGuide follows.
const guidePage = "docs/deployment.md"

// guideSteps are the blocks of the guide marked `run TestDeploymentGuide <step>`, in
// the order the page has them: the test runs them top to bottom, and a step added to
// the page or moved on it without the test knowing fails the test.
var guideSteps = []string{
	"label-node", "push", "install", "rbac-controller", "rbac-plugin", "own-node-policy", "apf",
	"rollout", "slices", "nodes", "example-claim", "upgrade", "delete-workloads", "uninstall",
}

// TestDeploymentGuide is a cluster operator reading docs/deployment.md from the top
// and typing what it says, against the real API server, controller-manager and
// scheduler of the local control plane, a registry served in the test and one
// simulated DGX H100 node: the page's own command blocks, as written, in bash.
//
// What the test does that an operator would not type is the node's part, done where
// a real node would do it: after the install, the node's runtime pulls the image the
// DaemonSet names from the registry and runs it (the kubelet's plugin-manager and DRA
// code are the harness's); after the uninstall it stops that container. The page's
// commands differ from what runs only by the substitutions below, each of which must
// apply somewhere.
func TestDeploymentGuide(t *testing.T) {
	t.Parallel()
	_, tool := releaseArtifacts(t)
	_ = imageRootfs(t) // the same prerequisites as the image tests: runc, an unpacked image
	steps := docSteps(t, guidePage, "TestDeploymentGuide")
	var onPage []string
	for id := range steps {
		onPage = append(onPage, id)
	}
	sort.Slice(onPage, func(i, j int) bool { return steps[onPage[i]].line < steps[onPage[j]].line })
	if strings.Join(onPage, " ") != strings.Join(guideSteps, " ") {
		t.Fatalf("%s marks the steps\n  %v\nthe test follows\n  %v", guidePage, onPage, guideSteps)
	}
	chartVersion := chartVersionOf(t)
	if want := "--version " + chartVersion + " "; !strings.Contains(steps["install"].text, want) {
		t.Errorf("%s: the install step does not name the chart's version (%q):\n%s", guidePage, want, steps["install"].text)
	}

	// The page's example node is dgx-h100-a; so is the simulated one.
	e := newEnv(t, envOptions{profile: "dgx-h100", node: "dgx-h100-a", fromChart: true})
	d := newChartDeployment(t, e, "")
	reg := serveRegistry(t) + "/gpu"
	sh := newGuideShell(t, e)
	sh.substitute("registry.example.com/gpu", reg,
		"the page's example registry is the one served in the test")
	sh.substitute("--values target/push/values.yaml", "--values target/push/values.yaml --values "+d.values+" --plain-http --set nodeResourceTopology.installCRD=true",
		"the simulated node keeps its kubelet, driver and /dev under the test's directory, "+
			"the test registry speaks plain HTTP on loopback, and the cluster has no NFD to bring the NodeResourceTopology CRD")

	sh.run("label-node", steps["label-node"], "")
	// make push runs make release, which writes target/'s release artifacts anew
	// while other tests read them (releaseBuild).
	var out string
	rewritesReleaseBuild(t, func() { out = sh.run("push", steps["push"], "") })
	if !strings.Contains(out, "helm install topodra oci://"+reg+"/topodra --version "+chartVersion) {
		t.Errorf("make push did not print the install command of the guide's next step:\n%s", out)
	}
	sh.run("install", steps["install"], "")

	// The node: its runtime pulls what the DaemonSet names and runs it.
	ref := d.daemonSet().Spec.Template.Spec.Containers[0].Image
	if !strings.HasPrefix(ref, reg+"/topodra-kubelet-plugin:") || !strings.Contains(ref, "@sha256:") {
		t.Fatalf("the DaemonSet runs %s, not the pushed image by digest", ref)
	}
	d.rootfs = filepath.Join(e.c.Dir, "pulled-rootfs")
	if out, err := exec.Command(tool, "unpack", "-pull", ref, "-dest", d.rootfs).CombinedOutput(); err != nil {
		t.Fatalf("topodra-image unpack -pull %s: %v\n%s", ref, err, out)
	}
	e.plugin = d.startPod("plugin")
	d.waitServing(e.plugin, fmt.Sprintf("%012d", d.runs), 2*time.Minute)
	e.waitDevices(8, time.Minute)

	sh.run("rbac-controller", steps["rbac-controller"], "")
	sh.run("rbac-plugin", steps["rbac-plugin"], "")
	out = sh.run("own-node-policy", steps["own-node-policy"], "may only write ResourceSlices of its own node")
	if !strings.Contains(out, "not those of node node-b") {
		t.Errorf("the policy refused the slice for another reason than the page gives:\n%s", out)
	}
	out = sh.run("apf", steps["apf"], "")
	if !strings.Contains(out, "topodra-kubelet-plugin") {
		t.Errorf("no topodra-kubelet-plugin priority level in:\n%s", out)
	}

	sh.run("rollout", steps["rollout"], "")
	sh.dynamic("dgx-h100-a-gpu.topodra.dev-x7k2p", func() string {
		s := e.slices(context.Background())
		if len(s) != 1 {
			t.Fatalf("%d slices of the node, the page shows one", len(s))
		}
		return s[0].Name
	})
	out = sh.run("slices", steps["slices"], "")
	if !strings.Contains(out, "resource.kubernetes.io/numaNode") {
		t.Errorf("kubectl describe resourceslice shows no numaNode attribute:\n%s", out)
	}
	out = sh.run("nodes", steps["nodes"], "")
	if !strings.Contains(out, "dgx-h100-a") {
		t.Errorf("kubectl topodra nodes does not list the node:\n%s", out)
	}

	sh.dynamic("four-gpus-one-numa-node-gpus-abcde", func() string {
		claims, err := e.admin.ResourceV1().ResourceClaims("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims.Items {
			if strings.HasPrefix(c.Name, "four-gpus-one-numa-node-gpus-") {
				return c.Name
			}
		}
		t.Fatal("no claim made from the example's template")
		return ""
	})
	out = sh.run("example-claim", steps["example-claim"], "")
	if n := len(regexp.MustCompile(`(?m)^gpu-\d+$`).FindAllString(out, -1)); n != 4 {
		t.Errorf("the claim lists %d devices, the page shows 4:\n%s", n, out)
	}
	specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_*.json"))
	if len(specs) != 1 {
		t.Errorf("%d CDI specs of claims on the node with the example running, want 1", len(specs))
	}

	sh.run("upgrade", steps["upgrade"], "")
	if !e.h.Registered(driverName) {
		t.Error("the plugin is not registered after helm upgrade")
	}

	sh.run("delete-workloads", steps["delete-workloads"], "")
	eventually(t, time.Minute, func() error {
		if specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", "k8s.gpu.topodra.dev-claim_*.json")); len(specs) > 0 {
			return fmt.Errorf("CDI specs left after the workloads went: %v", specs)
		}
		return nil
	})

	sh.run("uninstall", steps["uninstall"], "")
	eventually(t, time.Minute, func() error {
		if _, err := e.admin.AppsV1().DaemonSets(harness.PluginNamespace).Get(context.Background(), "topodra-kubelet-plugin", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("the DaemonSet is still there")
		}
		return nil
	})
	// The node: the pod is gone, so its container is stopped. Step 3 of the page:
	// the kubelet removes the driver's slices once no plugin comes back.
	e.plugin.stop(t)
	eventually(t, 2*time.Minute, func() error {
		if s := e.slices(context.Background()); len(s) > 0 {
			return fmt.Errorf("%d slices of the node left after the uninstall", len(s))
		}
		return nil
	})
	sh.checkSubstitutionsUsed()
}

// chartVersionOf is the chart's version, from Chart.yaml.
func chartVersionOf(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "helm", "topodra", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version:\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Chart.yaml has no version")
	}
	return string(m[1])
}

// guideShell runs the guide's blocks in bash as an operator's shell would: in the
// repository root, with the admin kubeconfig, kubectl, helm and kubectl-topodra on
// PATH.
type guideShell struct {
	t      *testing.T
	env    []string
	subs   []*guideSub
	lookup map[string]func() string
}

type guideSub struct {
	old, new, why string
	used          bool
}

func newGuideShell(t *testing.T, e *env) *guideShell {
	kubectlTopodra := binary(t, "TOPODRA_KUBECTL_PLUGIN_BIN", "kubectl-topodra")
	path := strings.Join([]string{e.c.ToolsBinDir, filepath.Dir(kubectlTopodra), os.Getenv("PATH")}, string(os.PathListSeparator))
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH", "KUBECONFIG", "REGISTRY", "PUSH_DIR", "INSECURE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL":
			// Ours, or an enclosing make's: the guide's make runs as if typed.
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PATH="+path, "KUBECONFIG="+e.c.Kubeconfig)
	return &guideShell{t: t, env: env, lookup: map[string]func() string{}}
}

// substitute replaces old by new in every command, for the reason why; it must be
// used at least once.
func (s *guideShell) substitute(old, new, why string) {
	s.subs = append(s.subs, &guideSub{old: old, new: new, why: why})
}

// dynamic replaces a name the page made up (a generated suffix) by the real one,
// looked up when a command names it.
func (s *guideShell) dynamic(old string, f func() string) { s.lookup[old] = f }

func (s *guideShell) checkSubstitutionsUsed() {
	for _, sub := range s.subs {
		if !sub.used {
			s.t.Errorf("the substitution of %q (%s) applied to no command of %s: the page changed", sub.old, sub.why, guidePage)
		}
	}
}

func (s *guideShell) apply(cmd string) string {
	for _, sub := range s.subs {
		if strings.Contains(cmd, sub.old) {
			sub.used = true
			cmd = strings.ReplaceAll(cmd, sub.old, sub.new)
		}
	}
	for old, f := range s.lookup {
		if strings.Contains(cmd, old) {
			cmd = strings.ReplaceAll(cmd, old, f())
		}
	}
	return cmd
}

// run runs one step: an sh block as one script, a console block command by command
// (the lines after `$ `; the rest is the page's sample output). A command whose
// comment is `# yes` or `# no` is an answer the page promises (kubectl auth can-i),
// and is checked. With wantErr, the step must fail with that text in its output.
func (s *guideShell) run(step string, b docBlock, wantErr string) string {
	s.t.Helper()
	var scripts []string
	if b.lang == "console" {
		scripts = consoleCommands(b.text)
	} else {
		scripts = []string{b.text}
	}
	var all strings.Builder
	for _, script := range scripts {
		script = s.apply(answersChecked(script))
		// make push runs make release, which rebuilds what changed since make e2e's
		// own release build: nothing in make test, minutes after an edit by hand.
		timeout := 5 * time.Minute
		if step == "push" {
			timeout = 20 * time.Minute
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+guidePrelude+script)
		cmd.Dir = repoRoot(s.t)
		cmd.Env = s.env
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		cancel()
		s.t.Logf("%s:%d [%s] (%s)\n%s\n--- output:\n%s", b.page, b.line, step, time.Since(t0).Round(time.Second), script, out)
		all.Write(out)
		switch {
		case wantErr == "" && err != nil:
			s.t.Fatalf("%s:%d: step %s failed: %v", b.page, b.line, step, err)
		case wantErr != "" && err == nil:
			s.t.Fatalf("%s:%d: step %s succeeded; the page says it is refused", b.page, b.line, step)
		case wantErr != "" && !strings.Contains(string(out), wantErr):
			s.t.Fatalf("%s:%d: step %s failed without %q", b.page, b.line, step, wantErr)
		}
	}
	return all.String()
}

// guidePrelude defines what answersChecked rewrites to.
const guidePrelude = `docs_answer() {
  local want=$1; shift
  local got
  got=$("$@" 2>/dev/null) || true
  if [[ "$got" != "$want" ]]; then
    echo "the page says '$*' answers '$want'; it answered '$got'" >&2
    return 1
  fi
  echo "$* -> $got"
}
`

var answerRe = regexp.MustCompile(`^(\s*)(\S.*?)\s+#\s*(yes|no)\s*$`)

// answersChecked turns `cmd   # yes` into a check that cmd prints yes.
func answersChecked(script string) string {
	lines := strings.Split(script, "\n")
	for i, l := range lines {
		if m := answerRe.FindStringSubmatch(l); m != nil && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines[i] = m[1] + "docs_answer " + m[3] + " " + m[2]
		}
	}
	return strings.Join(lines, "\n")
}

// consoleCommands are the commands of a console block: each line after `$ `, with
// the lines a trailing backslash continues.
func consoleCommands(text string) []string {
	var cmds []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		c, ok := strings.CutPrefix(lines[i], "$ ")
		if !ok {
			continue
		}
		for strings.HasSuffix(c, "\\") && i+1 < len(lines) {
			i++
			c += "\n" + lines[i]
		}
		cmds = append(cmds, c)
	}
	return cmds
}

func TestGuideShellHelpers(t *testing.T) {
	t.Parallel()
	got := consoleCommands("$ kubectl get a \\\n    -o wide\nNAME\nx\n$ kubectl logs p\nout")
	if len(got) != 2 || got[0] != "kubectl get a \\\n    -o wide" || got[1] != "kubectl logs p" {
		t.Errorf("consoleCommands: %q", got)
	}
	s := answersChecked("SA=x\nkubectl auth can-i get pods --as=$SA   # yes\n# a comment # no\nkubectl auth can-i x  # no")
	want := "SA=x\ndocs_answer yes kubectl auth can-i get pods --as=$SA\n# a comment # no\ndocs_answer no kubectl auth can-i x"
	if s != want {
		t.Errorf("answersChecked:\n%s\nwant\n%s", s, want)
	}
}
