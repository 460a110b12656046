package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	nrtv1alpha2 "github.com/k8stopologyawareschedwg/noderesourcetopology-api/pkg/apis/topology/v1alpha2"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

// startController runs a controller replica named name (its pod name, hence its
// identity in the leader Lease) under the controller ServiceAccount's kubeconfig.
func (e *env) startController(name, kubeconfig string, args ...string) *proc {
	t := e.t
	t.Helper()
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	logPath := filepath.Join(e.c.LogsDir, fmt.Sprintf("controller-%s-%d.log", name, time.Now().UnixNano()))
	argv := append([]string{"--http-bind-address=" + host, "--http-port=" + port, "--log-format=text"}, args...)
	// A node's object is written at most every 10 s here instead of 60: the tests
	// wait a minute for an object to follow a change (the spacing itself is tested
	// in controller/src/budget.rs).
	env := []string{"KUBECONFIG=" + kubeconfig, "POD_NAME=" + name, "POD_NAMESPACE=" + harness.PluginNamespace, "TOPODRA_LOG=info",
		"TOPODRA_NRT_NODE_INTERVAL_SECONDS=10"}
	p := startProc(t, name, binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller"), argv, env, logPath, addr)
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("--- tail of %s:\n%s", p.log, tailFile(p.log, 30))
		}
	})
	return p
}

// metrics returns the controller's samples by their full name with labels, e.g.
// `topodra_controller_gpus{state="free"}`.
func (p *proc) metrics() (map[string]float64, error) {
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

func (p *proc) metric(name string) float64 {
	m, err := p.metrics()
	if err != nil {
		return -1
	}
	return m[name]
}

func (p *proc) ready() error {
	resp, err := http.Get("http://" + p.http + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("controller %s not ready: %s", p.what, strings.TrimSpace(string(body)))
	}
	return nil
}

var nrtResource = schema.GroupVersionResource{Group: "topology.node.k8s.io", Version: "v1alpha2", Resource: "noderesourcetopologies"}

// installNRTCRD applies the NodeResourceTopology CRD as the chart installs it when
// asked, waits until it is served, and returns a client for its objects.
func (e *env) installNRTCRD() dynamic.Interface {
	t := e.t
	t.Helper()
	rest, err := e.c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rest)
	if err != nil {
		t.Fatal(err)
	}
	crd := helmTemplate(t, t.TempDir(), "--set", "nodeResourceTopology.installCRD=true", "--show-only", "templates/nrt-crd.yaml")
	crdYAML, err := os.ReadFile(crd)
	if err != nil {
		t.Fatal(err)
	}
	e.kubectlApply(string(crdYAML))
	eventually(t, time.Minute, func() error {
		_, err := dyn.Resource(nrtResource).List(context.Background(), metav1.ListOptions{Limit: 1})
		return err
	})
	return dyn
}

// nrtOf reads a node's NodeResourceTopology and decodes it with the NRT API's own Go
// types.
func (e *env) nrtOf(ctx context.Context, dyn dynamic.Interface, node string) (*nrtv1alpha2.NodeResourceTopology, error) {
	u, err := dyn.Resource(nrtResource).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var obj nrtv1alpha2.NodeResourceTopology
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &obj, true); err != nil {
		return nil, fmt.Errorf("decoding NodeResourceTopology %s with the NRT API types: %w", node, err)
	}
	return &obj, nil
}

// expectedZones is, per NUMA node ("node-<n>"), the GPUs there and how many are
// free, from the published devices and the claims allocated now.
func (e *env) expectedZones(ctx context.Context, devices map[string]resourceapi.Device) map[string][2]int64 {
	e.t.Helper()
	claims, err := e.admin.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	used := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == driverName && r.Pool == e.node {
				used[r.Device] = true
			}
		}
	}
	zones := map[string][2]int64{}
	for name, d := range devices {
		z := fmt.Sprintf("node-%d", numaOf(e.t, d))
		v := zones[z]
		v[0]++
		if !used[name] {
			v[1]++
		}
		zones[z] = v
	}
	return zones
}

// nrtMatches compares a node's NodeResourceTopology with the allocations.
func (e *env) nrtMatches(ctx context.Context, dyn dynamic.Interface, devices map[string]resourceapi.Device) error {
	obj, err := e.nrtOf(ctx, dyn, e.node)
	if err != nil {
		return err
	}
	want := e.expectedZones(ctx, devices)
	got := map[string][2]int64{}
	for _, z := range obj.Zones {
		if z.Type != "Node" {
			return fmt.Errorf("zone %s has type %q, want Node", z.Name, z.Type)
		}
		for _, r := range z.Resources {
			if r.Name != "nvidia.com/gpu" {
				return fmt.Errorf("zone %s: resource %q, want nvidia.com/gpu", z.Name, r.Name)
			}
			if r.Allocatable.Cmp(r.Capacity) != 0 {
				return fmt.Errorf("zone %s: allocatable %s, capacity %s (no GPU is unhealthy)", z.Name, r.Allocatable.String(), r.Capacity.String())
			}
			got[z.Name] = [2]int64{r.Capacity.Value(), r.Available.Value()}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("NodeResourceTopology zones (capacity, available) %v, allocations say %v", got, want)
	}
	policy := ""
	for _, a := range obj.Attributes {
		if a.Name == "topologyManagerPolicy" {
			policy = a.Value
		}
	}
	if policy != "single-numa-node" {
		return fmt.Errorf("attribute topologyManagerPolicy %q, want single-numa-node", policy)
	}
	return nil
}

// auditEvents reads the API server's audit records received between from and to.
func auditEvents(t *testing.T, path string, from, to time.Time) []cluster.AuditEvent {
	t.Helper()
	evs, err := cluster.ReadAuditLog(path, from, to)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// auditRequests counts the API server's audit records of user between from and to,
// by "verb resource".
func auditRequests(t *testing.T, path, user string, from, to time.Time) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, ev := range auditEvents(t, path, from, to) {
		if ev.User.Username == user {
			counts[ev.Verb+" "+ev.Resource()]++
		}
	}
	return counts
}

// auditLogArgs are the kube-apiserver flags that write the audit log of
// cluster.AuditPolicy as JSON to the returned file.
func auditLogArgs(t *testing.T) ([]string, string) {
	t.Helper()
	args, log, err := cluster.AuditLogArgs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return args, log
}

// TestController runs two controller replicas with the chart's ServiceAccount and
// RBAC next to one simulated DGX H100 node: their NodeResourceTopology object
// matches the allocations as pods come and go, across a leader change and a restart,
// and decodes with the NRT API's Go types; the third 4-GPU pod gets the Event that
// explains it, and `kubectl topodra explain` prints the same reason; idle, the
// controller writes nothing (the API server's audit log, by user).
func TestController(t *testing.T) {
	t.Parallel()
	auditArgs, auditLog := auditLogArgs(t)
	binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller")
	kubectlTopodra := binary(t, "TOPODRA_KUBECTL_PLUGIN_BIN", "kubectl-topodra")
	e := newEnv(t, envOptions{profile: "dgx-h100", apiServerArgs: auditArgs})
	ctx := context.Background()
	dyn := e.installNRTCRD()

	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "controller.kubeconfig")
	if err := harness.ControllerIdentity(ctx, e.admin, e.c.Server, e.c.PKI.CAPEM(), kubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + harness.PluginNamespace + ":" + harness.ControllerServiceAccount
	replicas := map[string]*proc{}
	for _, name := range []string{"ctrl-a", "ctrl-b"} {
		replicas[name] = e.startController(name, kubeconfig)
	}
	leader := func() *proc {
		var l *proc
		eventually(t, time.Minute, func() error {
			l = nil
			for _, p := range replicas {
				if p.metric("topodra_controller_leader") == 1 {
					if l != nil {
						return fmt.Errorf("two leaders: %s and %s", l.what, p.what)
					}
					l = p
				}
			}
			if l == nil {
				return fmt.Errorf("no leader yet")
			}
			return nil
		})
		return l
	}

	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8, time.Minute)
	for _, p := range replicas {
		eventually(t, time.Minute, p.ready)
	}
	eventually(t, time.Minute, func() error { return e.nrtMatches(ctx, dyn, devices) })
	first := leader()
	t.Logf("leader: %s", first.what)

	const ns = "numa"
	e.createNamespace(ns)
	tmpl := strings.Replace(manifestDoc(t, filepath.Join(repoRoot(t), "deploy", "examples", "01-four-gpus-one-numa-node.yaml"), "ResourceClaimTemplate"),
		"metadata:\n", "metadata:\n  namespace: "+ns+"\n", 1)
	e.kubectlApply(tmpl)

	t.Run("pods come and go", func(t *testing.T) {
		e.t = t
		for _, name := range []string{"four-a", "four-b"} {
			e.createPod(ns, name, "four-gpus-one-numa-node")
		}
		for _, name := range []string{"four-a", "four-b"} {
			e.waitPodRunning(ns, name, 2*time.Minute)
		}
		eventually(t, time.Minute, func() error { return e.nrtMatches(ctx, dyn, devices) })
		for _, p := range replicas {
			eventually(t, 30*time.Second, func() error {
				m, err := p.metrics()
				if err != nil {
					return err
				}
				for k, want := range map[string]float64{
					`topodra_controller_gpus{state="allocated"}`:                  8,
					`topodra_controller_gpus{state="free"}`:                       0,
					`topodra_controller_nodes_fitting{size="4",level="numaNode"}`: 0,
				} {
					if m[k] != want {
						return fmt.Errorf("%s: %s = %v, want %v", p.what, k, m[k], want)
					}
				}
				return nil
			})
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("the third 4-GPU pod is explained", func(t *testing.T) {
		e.t = t
		e.createPod(ns, "four-c", "four-gpus-one-numa-node")
		const reason = "needs 4 GPUs on one NUMA node; no node has 4 free GPUs; no GPU is free"
		msg := e.waitEvent(ns, "four-c", "WaitingForGPUs", regexp.MustCompile(regexp.QuoteMeta(reason)), 2*time.Minute)
		t.Logf("four-c WaitingForGPUs: %s", msg)

		cmd := exec.Command(kubectlTopodra, "explain", "pod/four-c", "-n", ns)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+e.c.Kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl topodra explain: %v\n%s", err, out)
		}
		t.Logf("kubectl topodra explain pod/four-c:\n%s", out)
		if !strings.Contains(string(out), reason) {
			t.Errorf("kubectl topodra explain does not give the Event's reason %q", reason)
		}
		cmd = exec.Command(kubectlTopodra, "nodes")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+e.c.Kubeconfig)
		out, err = cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl topodra nodes: %v\n%s", err, out)
		}
		t.Logf("kubectl topodra nodes:\n%s", out)

		// Freeing a NUMA node lets four-c in; the object follows.
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "four-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "four-a", 2*time.Minute)
		e.waitPodRunning(ns, "four-c", 2*time.Minute)
		eventually(t, time.Minute, func() error { return e.nrtMatches(ctx, dyn, devices) })
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("leader change and restart", func(t *testing.T) {
		e.t = t
		old := leader()
		old.stop(t)
		delete(replicas, old.what)
		next := leader()
		if next == old {
			t.Fatal("the stopped replica is still the leader")
		}
		writesBefore := next.metric(`topodra_controller_writes_total{operation="apply",outcome="ok"}`)
		if err := e.admin.CoreV1().Pods(ns).Delete(ctx, "four-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitPodGone(ns, "four-b", 2*time.Minute)
		eventually(t, time.Minute, func() error { return e.nrtMatches(ctx, dyn, devices) })
		if w := next.metric(`topodra_controller_writes_total{operation="apply",outcome="ok"}`); w <= writesBefore {
			t.Errorf("new leader %s: apply writes %v, before %v: it did not write the change", next.what, w, writesBefore)
		}
		// The stopped replica comes back as the standby, with the same view.
		replicas[old.what] = e.startController(old.what, kubeconfig)
		eventually(t, time.Minute, replicas[old.what].ready)
		if l := leader(); l != next {
			t.Errorf("leadership moved to %s on a standby's restart", l.what)
		}
		eventually(t, 30*time.Second, func() error {
			for _, p := range replicas {
				if a := p.metric(`topodra_controller_gpus{state="allocated"}`); a != 4 {
					return fmt.Errorf("%s: %v GPUs allocated, want 4", p.what, a)
				}
			}
			return nil
		})
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("idle means no writes", func(t *testing.T) {
		e.t = t
		idle := 3 * time.Minute
		if s := os.Getenv("TOPODRA_E2E_IDLE_SECONDS"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				t.Fatal(err)
			}
			idle = time.Duration(n) * time.Second
		}
		from := time.Now()
		time.Sleep(idle)
		to := time.Now()
		// Records are written when requests complete; give the last ones a moment.
		time.Sleep(2 * time.Second)
		counts := auditRequests(t, auditLog, user, from, to)
		t.Logf("controller requests in %s idle (audit log, user %s): %v", idle, user, counts)
		var writes []string
		for k, n := range counts {
			verb, res, _ := strings.Cut(k, " ")
			if cluster.WriteVerbs[verb] && res != "leases" {
				writes = append(writes, fmt.Sprintf("%s x%d", k, n))
			}
			if verb == "list" {
				t.Errorf("a LIST while idle: %s x%d", k, n)
			}
		}
		if len(writes) > 0 {
			t.Errorf("writes while nothing changed: %v", writes)
		}
		// Leader election renews its Lease: one write every
		// (lease duration - renew-before) seconds is the price of a warm standby.
		renewals := counts["patch leases"] + counts["update leases"]
		if max := int(idle/(10*time.Second)) + 2; renewals > max {
			t.Errorf("%d Lease writes in %s, more than the %d the renewal period allows", renewals, idle, max)
		}
		// And the object still matches, with no node left waiting for a write.
		if err := e.nrtMatches(ctx, dyn, devices); err != nil {
			t.Error(err)
		}
		if l := leader(); l.metric("topodra_controller_nrt_nodes_waiting") != 0 {
			t.Errorf("leader %s: %v nodes waiting for a NodeResourceTopology write while idle", l.what, l.metric("topodra_controller_nrt_nodes_waiting"))
		}
	})
}
