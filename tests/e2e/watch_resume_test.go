package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"topodra.dev/tests/e2e/harness"
)

// cuttingProxy forwards TCP connections to target and closes each one a random
// time between minLife and maxLife after it was opened, whatever is in flight:
// a load balancer's idle cut or an API server restart, as the client sees it. TLS
// passes through untouched, so the clients still verify the API server's
// certificate (it names 127.0.0.1, whatever the port).
type cuttingProxy struct {
	l                net.Listener
	cuts             atomic.Int64
	wg               sync.WaitGroup
	minLife, maxLife time.Duration
	target           string
	closing          atomic.Bool
	connsMu          sync.Mutex
	conns            map[net.Conn]struct{}
}

func startCuttingProxy(t *testing.T, target string, minLife, maxLife time.Duration) *cuttingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{l: l, target: target, minLife: minLife, maxLife: maxLife, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *cuttingProxy) url() string { return "https://" + p.l.Addr().String() }

func (p *cuttingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *cuttingProxy) track(c net.Conn, add bool) {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *cuttingProxy) forward(c net.Conn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.track(c, true)
	defer p.track(c, false)
	life := p.minLife + time.Duration(rand.Int64N(int64(p.maxLife-p.minLife)+1))
	cut := time.AfterFunc(life, func() {
		if !p.closing.Load() {
			p.cuts.Add(1)
		}
		c.Close()
		s.Close()
	})
	defer cut.Stop()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done
	<-done
}

func (p *cuttingProxy) close() {
	p.closing.Store(true)
	p.l.Close()
	p.connsMu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.connsMu.Unlock()
	p.wg.Wait()
}

// TestWatchResume runs the plugin and the controller through a proxy that cuts
// every connection within seconds, against an API server with the talk's
// --goaway-chance, and changes what each one watches meanwhile: every watch is
// re-opened from the resourceVersion it had reached (the audit log's requestURI),
// neither component LISTs or restarts a streaming list, and each reacts to every
// change (the plugin restores the slices deleted under it; the controller's GPU
// gauge follows every allocation).
//
// --goaway-chance alone would not test this: the API server only asks an HTTP/2
// client to open a new connection for its next request, in-flight watches stay
// open, and topodra's clients speak HTTP/1.1 anyway. --min-request-timeout does
// not end their watches either, since kube-rs asks for timeoutSeconds=290 and the
// server honours a client's timeout. Both are set here for the rest of the
// control plane (scheduler, controller-manager, the kubelet harness); the proxy
// is what ends topodra's watches.
func TestWatchResume(t *testing.T) {
	t.Parallel()
	auditArgs, auditLog := auditLogArgs(t)
	binary(t, "TOPODRA_CONTROLLER_BIN", "topodra-controller")
	e := newEnv(t, envOptions{profile: "dgx-h100", apiServerArgs: append(auditArgs,
		"--goaway-chance=0.02", "--min-request-timeout=5",
	)})
	ctx := context.Background()
	e.waitRegistered(2 * time.Minute)
	devices := e.waitDevices(8, time.Minute)

	server, err := url.Parse(e.c.Server)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCuttingProxy(t, server.Host, 3*time.Second, 8*time.Second)

	// The plugin again, now through the proxy.
	pluginKubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "plugin-"+e.node+"-proxied.kubeconfig")
	if err := harness.PluginIdentity(ctx, e.admin, proxy.url(), e.c.PKI.CAPEM(), e.node, pluginKubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	e.plugin.stop(t)
	e.plugin = e.startPlugin(pluginKubeconfig)
	e.waitRegistered(2 * time.Minute)

	ctrlKubeconfig := filepath.Join(e.c.Dir, "kubeconfigs", "controller-proxied.kubeconfig")
	if err := harness.ControllerIdentity(ctx, e.admin, proxy.url(), e.c.PKI.CAPEM(), ctrlKubeconfig, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	ctrl := e.startController("ctrl-resume", ctrlKubeconfig)
	eventually(t, time.Minute, ctrl.ready)
	gauge := func(state string, want float64) func() error {
		return func() error {
			if got := ctrl.metric(`topodra_controller_gpus{state="` + state + `"}`); got != want {
				return fmt.Errorf("controller: %s GPUs %v, want %v", state, got, want)
			}
			return nil
		}
	}
	eventually(t, time.Minute, gauge("total", 8))
	// Both have started (their streaming lists are done); from here on, any LIST
	// or new initial list is a re-list.
	time.Sleep(3 * time.Second)
	from := time.Now()
	cutsBefore := proxy.cuts.Load()

	names := make([]string, 0, len(devices))
	for n := range devices {
		names = append(names, n)
	}
	sort.Strings(names)
	const ns = "default"
	claims := e.admin.ResourceV1().ResourceClaims(ns)
	for i, dev := range names {
		// An allocation written straight into a claim's status, as the scheduler
		// would: the controller learns of it only through its claim watch.
		name := fmt.Sprintf("resume-%d", i)
		c, err := claims.Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driverName},
			}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driverName, Pool: e.node, Device: dev}},
		}}
		if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, gauge("allocated", float64(i+1)))
		if i == 2 || i == 5 {
			// The plugin's slice watch must see its slices go and put them back.
			old := map[string]bool{}
			for _, s := range e.slices(ctx) {
				old[string(s.UID)] = true
			}
			if err := e.admin.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
				metav1.ListOptions{FieldSelector: "spec.nodeName=" + e.node + ",spec.driver=" + driverName}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, func() error {
				ss := e.slices(ctx)
				if len(ss) == 0 {
					return fmt.Errorf("the plugin has not republished its deleted slices")
				}
				for _, s := range ss {
					if old[string(s.UID)] {
						return fmt.Errorf("slice %s is still the deleted one", s.Name)
					}
				}
				return nil
			})
			e.waitDevices(8, 30*time.Second)
		}
		time.Sleep(4 * time.Second)
	}
	if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, gauge("allocated", 0))
	eventually(t, 30*time.Second, gauge("total", 8))
	to := time.Now()
	// A watch's record is written when it ends: wait for the proxy to cut the
	// ones open now.
	time.Sleep(10 * time.Second)
	cuts := proxy.cuts.Load() - cutsBefore
	t.Logf("window %s: the proxy cut %d connections", to.Sub(from).Round(time.Second), cuts)

	type key struct{ agent, resource string }
	watches := map[key]int{}
	var lists, relists, noRV []string
	for _, ev := range auditEvents(t, auditLog, from, to) {
		agent, _, _ := strings.Cut(ev.UserAgent, "/")
		if agent != "topodra-kubelet-plugin" && agent != "topodra-controller" {
			continue
		}
		u, err := url.ParseRequestURI(ev.RequestURI)
		if err != nil {
			t.Fatalf("audit requestURI %q: %v", ev.RequestURI, err)
		}
		q := u.Query()
		switch ev.Verb {
		case "list":
			lists = append(lists, agent+" "+ev.RequestURI)
		case "watch":
			watches[key{agent, ev.Resource()}]++
			if q.Get("sendInitialEvents") == "true" {
				relists = append(relists, agent+" "+ev.RequestURI)
			}
			if rv := q.Get("resourceVersion"); rv == "" || rv == "0" {
				noRV = append(noRV, agent+" "+ev.RequestURI)
			}
		}
	}
	// The same query finds the start-ups' initial lists, so the checks above can
	// see a re-list when there is one.
	started := 0
	for _, ev := range auditEvents(t, auditLog, time.Time{}, from) {
		if strings.HasPrefix(ev.UserAgent, "topodra-") && ev.Verb == "watch" && strings.Contains(ev.RequestURI, "sendInitialEvents=true") {
			started++
		}
	}
	if started == 0 {
		t.Error("no streaming initial list from topodra's components in the audit log before the window")
	}
	perAgent := map[string]int{}
	for k, n := range watches {
		t.Logf("%s re-opened its %s watch %d times", k.agent, k.resource, n)
		perAgent[k.agent] += n
	}
	if w := watches[key{"topodra-kubelet-plugin", "resourceslices"}]; w < 5 {
		t.Errorf("the plugin's slice watch was re-opened %d times in the window, want at least 5 (did the proxy cut it?)", w)
	}
	for _, res := range []string{"resourceslices", "resourceclaims", "deviceclasses", "nodes", "pods"} {
		if w := watches[key{"topodra-controller", res}]; w < 5 {
			t.Errorf("the controller's %s watch was re-opened %d times in the window, want at least 5", res, w)
		}
	}
	if len(lists) > 0 {
		t.Errorf("%d LISTs after start-up (a re-list): %v", len(lists), lists)
	}
	if len(relists) > 0 {
		t.Errorf("%d watches started a new initial list instead of resuming: %v", len(relists), relists)
	}
	if len(noRV) > 0 {
		t.Errorf("%d re-opened watches without a resourceVersion to resume from: %v", len(noRV), noRV)
	}
	t.Logf("re-opened watches: plugin %d, controller %d; LISTs %d; initial lists %d (%d at start-up); without resourceVersion %d",
		perAgent["topodra-kubelet-plugin"], perAgent["topodra-controller"], len(lists), len(relists), started, len(noRV))
}
