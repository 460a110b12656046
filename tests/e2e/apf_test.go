package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"topodra.dev/tests/e2e/harness"
)

// identityClient is an HTTP client that authenticates as the plugin of node (a token
// bound to a pod on that node, as the DaemonSet's pods get), with no retries of its
// own, so every answer of the API server, 429s included, reaches the test.
func identityClient(t *testing.T, e *env, node string) (*http.Client, string) {
	t.Helper()
	kubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "plugin-"+node+".kubeconfig")
	if err := harness.PluginIdentity(context.Background(), e.admin, e.c.Server, e.c.PKI.CAPEM(), node, kubeconfig, time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: rt, Timeout: 30 * time.Second}, cfg.Host
}

// priorityLevels maps the UIDs of the plugin's two priority levels to their names.
func priorityLevels(t *testing.T, admin kubernetes.Interface) map[string]string {
	t.Helper()
	levels := map[string]string{}
	for _, name := range []string{"topodra-kubelet-plugin", "topodra-kubelet-plugin-prepare"} {
		pl, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		levels[string(pl.UID)] = name
	}
	return levels
}

// TestAPFSeparatesThePreparePath sends requests with the plugin's real identity (a
// token bound to a pod on node-b) to the real API server with the APF objects of
// deploy/manifests, and reads the priority level the server classified each into
// from its X-Kubernetes-PF-PriorityLevel-UID response header: claim reads (what a pod
// waits on to start) go to the plugin's prepare level, everything else (slices, the
// Node) to its publishing level, so no amount of publishing delays a claim read.
func TestAPFSeparatesThePreparePath(t *testing.T) {
	t.Parallel()
	e := manifestsOnlyEnv(t)
	levels := priorityLevels(t, e.admin)
	client, host := identityClient(t, e, "node-b")
	levelOf := func(path string) (string, error) {
		resp, err := client.Get(host + path)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		uid := resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")
		if name, ok := levels[uid]; ok {
			return name, nil
		}
		return "", fmt.Errorf("GET %s: status %d, priority level %q is not one of ours", path, resp.StatusCode, uid)
	}
	for path, want := range map[string]string{
		"/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-1":            "topodra-kubelet-plugin-prepare",
		"/apis/resource.k8s.io/v1/namespaces/team-b/resourceclaims/claim-2":            "topodra-kubelet-plugin-prepare",
		"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-b": "topodra-kubelet-plugin",
		"/api/v1/nodes/node-b": "topodra-kubelet-plugin",
	} {
		// The API server picks up new APF objects in the background.
		eventually(t, time.Minute, func() error {
			got, err := levelOf(path)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("GET %s went to %s, want %s", path, got, want)
			}
			return nil
		})
		t.Logf("GET %s -> %s", path, want)
	}
}

// floodTally counts the answers one client got, by status code.
type floodTally struct {
	mu     sync.Mutex
	status map[int]int
	errors int
	slow   []time.Duration
}

func (f *floodTally) add(code int, took time.Duration, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status == nil {
		f.status = map[int]int{}
	}
	if err != nil {
		f.errors++
		return
	}
	f.status[code]++
	f.slow = append(f.slow, took)
}

func (f *floodTally) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	sort.Slice(f.slow, func(i, j int) bool { return f.slow[i] < f.slow[j] })
	p := func(q float64) time.Duration {
		if len(f.slow) == 0 {
			return 0
		}
		return f.slow[int(q*float64(len(f.slow)-1))].Round(time.Millisecond)
	}
	return fmt.Sprintf("status %v, transport errors %d, latency p50 %v p99 %v", f.status, f.errors, p(0.5), p(0.99))
}

// TestAPFFloodingPlugin is the case APF is there for: one node's plugin (a bug, a
// compromised node) floods the API server with its real identity while the server's
// concurrency is small enough (--max-requests-inflight=10, one seat per level) that
// the flood overflows its priority level. The server must turn the flood away with
// 429s inside the plugins' publishing level only: another node's claim reads (the
// prepare level) and an ordinary workload client still get every answer. What the
// test also shows, and docs/deployment.md says, is the limit: another node's
// publishing requests share the flooded level and its one flow, because every plugin
// is the same ServiceAccount and APF tells flows apart only by user or namespace.
func TestAPFFloodingPlugin(t *testing.T) {
	t.Parallel()
	e := manifestsOnlyEnvWith(t, "--max-requests-inflight=10", "--max-mutating-requests-inflight=5")
	ctx := context.Background()
	levels := priorityLevels(t, e.admin)
	flooder, host := identityClient(t, e, "node-b")
	victim, _ := identityClient(t, e, "node-a")

	// Slices make each LIST cost the server real work, so the flood holds seats.
	for i := range 200 {
		slice := policySlice(fmt.Sprintf("flood-node-%03d", i), fmt.Sprintf("flood-node-%03d", i), func(s *resourcev1.ResourceSlice) {
			s.Spec.Devices = nil
			for d := range 32 {
				s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{
					Name: fmt.Sprintf("gpu-%d", d),
					Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
						"numaNode": {IntValue: ptr.To(int64(d / 4))},
						"uuid":     {StringValue: ptr.To(fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i*32+d))},
					},
				})
			}
		})
		if _, err := e.admin.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// An ordinary workload identity (the default service-accounts schema).
	bystander := bystanderClient(t, e)

	claimPath := "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/claim-1"
	eventually(t, time.Minute, func() error {
		resp, err := victim.Get(host + claimPath)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if got := levels[resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")]; got != "topodra-kubelet-plugin-prepare" {
			return fmt.Errorf("claim GET classified into %q, the APF objects are not in force yet", got)
		}
		return nil
	})

	get := func(c *http.Client, path string, tally *floodTally) {
		start := time.Now()
		resp, err := c.Get(host + path)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			tally.add(resp.StatusCode, time.Since(start), nil)
			return
		}
		tally.add(0, 0, err)
	}

	const floodFor = 15 * time.Second
	var flood, claims, publishing, others floodTally
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				get(flooder, "/apis/resource.k8s.io/v1/resourceslices", &flood)
			}
		}()
	}
	time.Sleep(2 * time.Second) // let the flood fill its queues
	deadline := time.Now().Add(floodFor)
	for time.Now().Before(deadline) {
		get(victim, claimPath, &claims)
		get(victim, "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a", &publishing)
		get(bystander, "/apis/resource.k8s.io/v1", &others)
		time.Sleep(100 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()

	t.Logf("flooding plugin (node-b, LIST slices x300): %v", &flood)
	t.Logf("node-a claim GETs (prepare level):           %v", &claims)
	t.Logf("node-a slice LISTs (publishing level):       %v", &publishing)
	t.Logf("bystander workload (service-accounts):       %v", &others)

	if flood.status[http.StatusTooManyRequests] == 0 {
		t.Fatalf("the flood was never turned away (%v): it did not overflow the level, the test proves nothing", &flood)
	}
	for name, tally := range map[string]*floodTally{"node-a's claim reads": &claims, "the bystander's reads": &others} {
		bad := tally.errors
		for code, n := range tally.status {
			if code >= 400 && code != http.StatusNotFound {
				bad += n
			}
		}
		if bad > 0 || len(tally.slow) == 0 {
			t.Errorf("%s suffered from another node's flood: %v", name, tally)
		}
	}
	rejected := apfRejections(t, e)
	t.Logf("apiserver_flowcontrol_rejected_requests_total by priority level: %v", rejected)
	if rejected["topodra-kubelet-plugin"] == 0 {
		t.Errorf("no rejection counted in the publishing level: %v", rejected)
	}
	for level, n := range rejected {
		if level != "topodra-kubelet-plugin" && n > 0 {
			t.Errorf("%v requests rejected in level %s: the flood spilled out of the plugins' publishing level", n, level)
		}
	}
}

// apfRejections reads apiserver_flowcontrol_rejected_requests_total from the API
// server's /metrics, summed per priority level.
func apfRejections(t *testing.T, e *env) map[string]float64 {
	t.Helper()
	raw, err := e.admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_flowcontrol_rejected_requests_total{") {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, "apiserver_flowcontrol_rejected_requests_total{"), "} ")
		if !ok {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(value, &v); err != nil {
			continue
		}
		for _, kv := range strings.Split(labels, ",") {
			if name, ok := strings.CutPrefix(kv, `priority_level="`); ok {
				out[strings.TrimSuffix(name, `"`)] += v
			}
		}
	}
	return out
}

// bystanderClient is an ordinary workload's identity: a ServiceAccount of its own,
// which the default "service-accounts" FlowSchema puts in workload-low.
func bystanderClient(t *testing.T, e *env) *http.Client {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bystander"}}
	if _, err := e.admin.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "bystander", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(&rest.Config{Host: e.c.Server, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.c.PKI.CAPEM()}})
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: rt, Timeout: 30 * time.Second}
}
