// Package cluster runs a local Kubernetes control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler) as plain processes on loopback, built
// from the pinned upstream releases by tests/tools/build.sh. The end-to-end tests,
// `make demo` and `make bench` all use it, through Start (Go) or the
// topodra-cluster CLI (shell). See docs/e2e.md.
//
// There is no kubelet: nodes are Node objects created by the caller, by kwok, or
// by a kubelet-side harness acting as a node with a cert from NodeKubeconfig.
package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Component names, also the names of their log files (<name>.log).
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	Kwok              = "kwok"
)

// KwokNodeAnnotation marks the Node objects kwok manages (when Options.Kwok):
// create a Node with this annotation set to "fake" and kwok keeps it Ready and
// runs its pods. Other nodes (a kubelet-side harness's) are left alone.
const KwokNodeAnnotation = "kwok.x-k8s.io/node"

// KubernetesVersion is the release the tools are pinned to (tests/tools/kube/go.mod).
const KubernetesVersion = "v1.37.2"

// DefaultFeatureGates are passed to every Kubernetes component (and must be
// passed to a kubelet-side harness too: use FeatureGatesFlag). Only gates that
// are alpha, or beta ones this driver relies on, are listed; GA and locked gates
// (DynamicResourceAllocation, DRAPrioritizedList, DRADeviceTaints, DRAAdminAccess,
// DRAResourceClaimDeviceStatus, DRAExtendedResource, ...) are on by default and
// setting them only adds deprecation warnings. See docs/e2e.md for the reasons.
var DefaultFeatureGates = map[string]bool{
	// Alpha in 1.37: list-typed device attributes (ints/bools/strings/versions)
	// and list-aware matchAttribute/distinctAttribute. The list form of
	// resource.kubernetes.io/numaNode needs it.
	"DRAListTypeAttributes": true,
	// Beta (default on) in 1.37; pinned so a default flip cannot go unnoticed.
	"DRAPartitionableDevices": true,
	"DRAConsumableCapacity":   true,
}

// Options configure Start. The zero value is usable (a temporary directory,
// default gates, tools from $TOPODRA_TOOLS_BIN).
type Options struct {
	// Dir holds certs/, kubeconfigs/, etcd/, logs/, run/ and cluster.json.
	// Start clears those subdirectories (only those) first. Empty: a new
	// temporary directory, which Cleanup-on-success helpers may remove.
	Dir string
	// ToolsBin is a PATH-like list of directories with the binaries; empty
	// means $TOPODRA_TOOLS_BIN.
	ToolsBin string
	// FeatureGates are merged over DefaultFeatureGates (a false here turns a
	// default off).
	FeatureGates map[string]bool
	// RuntimeConfig entries for kube-apiserver --runtime-config, e.g.
	// "resource.k8s.io/v1beta2=true".
	RuntimeConfig []string
	// ExtraArgs are appended to a component's command line, keyed by
	// component name (Etcd, APIServer, ControllerManager, Scheduler).
	ExtraArgs map[string][]string
	// Env entries ("KEY=value") are added to a component's environment, keyed
	// like ExtraArgs: runtime knobs such as GOGC have no flag.
	Env map[string][]string
	// Skip the controller-manager or the scheduler.
	NoControllerManager bool
	NoScheduler         bool
	// Kwok also runs kwok (as system:masters), managing the nodes annotated
	// KwokNodeAnnotation=fake: fake nodes for the scale suite.
	Kwok bool
	// ClientQPS, when set, raises the API client rate of kube-scheduler and
	// kube-controller-manager (QPS, and twice that as burst) above their defaults
	// (50 and 20): the scale suite's waves would otherwise measure those limits.
	ClientQPS int
	// Verbosity is klog's -v for the Kubernetes components (default 2).
	Verbosity int
	// StartTimeout bounds each readiness wait (default 3 minutes: a cold
	// start on a contended 2-core machine is slow).
	StartTimeout time.Duration
	// StopGrace is how long a component gets after SIGTERM (default 10s).
	StopGrace time.Duration
	// Logf receives progress lines (default: discard). Tests pass t.Logf.
	Logf func(format string, args ...any)
}

// Cluster is a running control plane. Stop it with Stop.
type Cluster struct {
	Dir         string
	LogsDir     string
	Kubeconfig  string // admin: user kubernetes-admin in group system:masters
	Server      string // https://127.0.0.1:<port>
	EtcdURL     string
	PKI         *PKI
	Gates       map[string]bool
	ToolsBinDir string
	Versions    map[string]string // component -> `--version` output

	opts     Options
	procs    []*proc
	mu       sync.Mutex
	pidMu    sync.Mutex // serialises pidfile writes
	stopping bool
	stopOnce sync.Once
	stopErr  error
	done     chan struct{} // closed when a component dies unexpectedly
	doneOnce sync.Once
	err      error

	metrics     *http.Client      // admin client certificate, for Scrape
	metricsURLs map[string]string // component -> its /metrics, once ready
}

// State is what cluster.json holds, for shell scripts (make demo/bench) and for
// `topodra-cluster env`.
type State struct {
	Dir          string            `json:"dir"`
	Server       string            `json:"server"`
	Kubeconfig   string            `json:"kubeconfig"`
	EtcdURL      string            `json:"etcdURL"`
	LogsDir      string            `json:"logsDir"`
	CACert       string            `json:"caCert"`
	FeatureGates string            `json:"featureGates"`
	ToolsBin     string            `json:"toolsBin"`
	Versions     map[string]string `json:"versions"`
	Pids         map[string]int    `json:"pids"`
}

// StateFile is the path of cluster.json in dir.
func StateFile(dir string) string { return filepath.Join(dir, "cluster.json") }

// Start brings up etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler, waits until each is ready and the default ServiceAccount
// exists, and returns. ctx bounds the start only; the cluster runs until Stop.
// On error everything started is stopped again and the logs are kept in
// Dir/logs (the error names the failing component and quotes its log tail).
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Verbosity == 0 {
		opts.Verbosity = 2
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 3 * time.Minute
	}
	if opts.StopGrace == 0 {
		opts.StopGrace = 10 * time.Second
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	binDirs := ToolsBin(opts.ToolsBin)
	bins := map[string]string{}
	need := []string{Etcd, APIServer}
	if !opts.NoControllerManager {
		need = append(need, ControllerManager)
	}
	if !opts.NoScheduler {
		need = append(need, Scheduler)
	}
	if opts.Kwok {
		need = append(need, Kwok, "kwok-stages")
	}
	for _, n := range need {
		p, err := FindTool(binDirs, n)
		if err != nil {
			return nil, err
		}
		bins[n] = p
	}

	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "topodra-cluster-")
		if err != nil {
			return nil, err
		}
		opts.Dir = d
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if Running(dir) {
		return nil, fmt.Errorf("a cluster is already running in %s (run: topodra-cluster down --dir %s)", dir, dir)
	}
	if _, err := Cleanup(dir, opts.StopGrace); err != nil {
		return nil, err
	}
	for _, sub := range []string{"certs", "kubeconfigs", "etcd", "logs", "run"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return nil, err
		}
	}
	_ = os.Remove(StateFile(dir))
	for _, sub := range []string{"logs", "run", "kubeconfigs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}

	c := &Cluster{
		Dir:         dir,
		LogsDir:     filepath.Join(dir, "logs"),
		Kubeconfig:  filepath.Join(dir, "kubeconfigs", "admin.kubeconfig"),
		Gates:       mergeGates(opts.FeatureGates),
		ToolsBinDir: binDirs,
		Versions:    map[string]string{},
		opts:        opts,
		done:        make(chan struct{}),
	}
	var vwg sync.WaitGroup
	for n, p := range bins {
		if n == "kwok-stages" {
			continue
		}
		vwg.Add(1)
		go func() {
			defer vwg.Done()
			v := toolVersion(p)
			c.mu.Lock()
			c.Versions[n] = v
			c.mu.Unlock()
		}()
	}
	vwg.Wait()
	opts.Logf("cluster: dir %s, gates %s", dir, c.FeatureGatesFlag())
	if err := c.start(ctx, bins); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, bins map[string]string) error {
	t0 := time.Now()
	logf := c.opts.Logf
	var err error
	if c.PKI, err = NewPKI(filepath.Join(c.Dir, "certs")); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	servingCert, servingKey, err := c.PKI.IssueServing("kube-apiserver", []string{
		"127.0.0.1", "::1", "localhost", "10.96.0.1",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	})
	if err != nil {
		return err
	}
	proxyCert, proxyKey, err := c.PKI.IssueFrontProxyClient("front-proxy-client", "front-proxy-client")
	if err != nil {
		return err
	}
	adminCert, adminKey, err := c.PKI.IssueClient("admin", "kubernetes-admin", []string{"system:masters"})
	if err != nil {
		return err
	}
	if err := c.writePidFile(); err != nil {
		return err
	}

	// etcd
	var etcdClient, etcdPeer int
	if err := c.startWithRetry(ctx, Etcd, func() ([]string, error) {
		var err error
		if etcdClient, err = freePort(); err != nil {
			return nil, err
		}
		if etcdPeer, err = freePort(); err != nil {
			return nil, err
		}
		client := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
		peer := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
		return []string{
			"--name=topodra",
			"--data-dir=" + filepath.Join(c.Dir, "etcd"),
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=topodra=" + peer,
			"--initial-cluster-state=new",
			// A throwaway test store: no fsync (much faster on a shared
			// disk), and no periodic snapshots to slow the bench down.
			"--unsafe-no-fsync",
			"--snapshot-count=100000",
			"--quota-backend-bytes=4294967296",
			"--log-level=warn",
		}, nil
	}, bins[Etcd], func(ctx context.Context) error {
		return waitHTTP(ctx, insecureClient(), fmt.Sprintf("http://127.0.0.1:%d/health", etcdClient), `"health":"true"`)
	}); err != nil {
		return err
	}
	c.EtcdURL = fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	logf("cluster: etcd ready at %s (%s)", c.EtcdURL, since(t0))

	// kube-apiserver
	adminTLS, err := tlsClient(c.PKI.CACertFile, adminCert, adminKey)
	if err != nil {
		return err
	}
	if c.metrics, err = metricsClient(adminCert, adminKey); err != nil {
		return err
	}
	var apiPort int
	if err := c.startWithRetry(ctx, APIServer, func() ([]string, error) {
		var err error
		if apiPort, err = freePort(); err != nil {
			return nil, err
		}
		args := []string{
			"--etcd-servers=" + c.EtcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(apiPort),
			"--cert-dir=" + filepath.Join(c.Dir, "certs", "kube-apiserver"),
			"--tls-cert-file=" + servingCert,
			"--tls-private-key-file=" + servingKey,
			"--client-ca-file=" + c.PKI.CACertFile,
			"--requestheader-client-ca-file=" + c.PKI.FrontProxyCACertFile,
			"--requestheader-allowed-names=front-proxy-client",
			"--requestheader-username-headers=X-Remote-User",
			"--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + proxyCert,
			"--proxy-client-key-file=" + proxyKey,
			"--authorization-mode=Node,RBAC",
			// On top of the default-on plugins (which already include
			// ValidatingAdmissionPolicy and MutatingAdmissionPolicy, both GA),
			// listed so a reader sees they are on.
			"--enable-admission-plugins=NodeRestriction,ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + c.PKI.ServiceAccountPubFile,
			"--service-account-signing-key-file=" + c.PKI.ServiceAccountKeyFile,
			"--service-account-lookup=true",
			"--service-cluster-ip-range=10.96.0.0/16",
			// The advertise address is loopback, which Endpoints reject; nothing
			// here reaches the API server through the kubernetes Service anyway.
			"--endpoint-reconciler-type=none",
			"--allow-privileged=true",
			"--profiling=false",
			"--feature-gates=" + c.FeatureGatesFlag(),
			"--v=" + strconv.Itoa(c.opts.Verbosity),
		}
		if len(c.opts.RuntimeConfig) > 0 {
			args = append(args, "--runtime-config="+strings.Join(c.opts.RuntimeConfig, ","))
		}
		return args, nil
	}, bins[APIServer], func(ctx context.Context) error {
		return waitHTTP(ctx, adminTLS, fmt.Sprintf("https://127.0.0.1:%d/readyz", apiPort), "ok")
	}); err != nil {
		return err
	}
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	c.setMetricsURL(APIServer, c.Server+"/metrics")
	logf("cluster: kube-apiserver ready at %s (%s)", c.Server, since(t0))

	if err := c.PKI.WriteKubeconfig(c.Kubeconfig, c.Server, "admin", "kubernetes-admin", []string{"system:masters"}); err != nil {
		return err
	}
	kcmKubeconfig := filepath.Join(c.Dir, "kubeconfigs", "kube-controller-manager.kubeconfig")
	if err := c.PKI.WriteKubeconfig(kcmKubeconfig, c.Server, "kube-controller-manager", "system:kube-controller-manager", nil); err != nil {
		return err
	}
	schedKubeconfig := filepath.Join(c.Dir, "kubeconfigs", "kube-scheduler.kubeconfig")
	if err := c.PKI.WriteKubeconfig(schedKubeconfig, c.Server, "kube-scheduler", "system:kube-scheduler", nil); err != nil {
		return err
	}

	// kube-controller-manager, kube-scheduler (and kwok) start side by side.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	if !c.opts.NoControllerManager {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var port int
			errs[0] = c.startWithRetry(ctx, ControllerManager, func() ([]string, error) {
				var err error
				if port, err = freePort(); err != nil {
					return nil, err
				}
				return append([]string{
					"--kubeconfig=" + kcmKubeconfig,
					"--authentication-kubeconfig=" + kcmKubeconfig,
					"--authorization-kubeconfig=" + kcmKubeconfig,
					"--bind-address=127.0.0.1",
					"--secure-port=" + strconv.Itoa(port),
					"--cert-dir=" + filepath.Join(c.Dir, "certs", "kube-controller-manager"),
					// Every default-on controller, resourceclaim-controller
					// (templates -> claims) and device-taint-eviction-controller
					// among them.
					"--controllers=*",
					"--use-service-account-credentials=true",
					"--service-account-private-key-file=" + c.PKI.ServiceAccountKeyFile,
					"--root-ca-file=" + c.PKI.CACertFile,
					"--cluster-signing-cert-file=" + c.PKI.CACertFile,
					"--cluster-signing-key-file=" + c.PKI.CAKeyFile,
					"--service-cluster-ip-range=10.96.0.0/16",
					"--leader-elect=false",
					"--profiling=false",
					"--feature-gates=" + c.FeatureGatesFlag(),
					"--v=" + strconv.Itoa(c.opts.Verbosity),
				}, c.clientQPSArgs()...), nil
			}, bins[ControllerManager], func(ctx context.Context) error {
				return waitHTTP(ctx, insecureClient(), fmt.Sprintf("https://127.0.0.1:%d/healthz", port), "ok")
			})
			if errs[0] == nil {
				c.setMetricsURL(ControllerManager, fmt.Sprintf("https://127.0.0.1:%d/metrics", port))
				logf("cluster: kube-controller-manager healthy (%s)", since(t0))
			}
		}()
	}
	if !c.opts.NoScheduler {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := filepath.Join(c.Dir, "run", "kube-scheduler.yaml")
			errs[1] = os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q%s
leaderElection:
  leaderElect: false
`, schedKubeconfig, c.clientQPSConfig())), 0o644)
			if errs[1] != nil {
				return
			}
			var port int
			errs[1] = c.startWithRetry(ctx, Scheduler, func() ([]string, error) {
				var err error
				if port, err = freePort(); err != nil {
					return nil, err
				}
				return []string{
					"--config=" + cfg,
					"--authentication-kubeconfig=" + schedKubeconfig,
					"--authorization-kubeconfig=" + schedKubeconfig,
					"--bind-address=127.0.0.1",
					"--secure-port=" + strconv.Itoa(port),
					"--cert-dir=" + filepath.Join(c.Dir, "certs", "kube-scheduler"),
					"--profiling=false",
					"--feature-gates=" + c.FeatureGatesFlag(),
					"--v=" + strconv.Itoa(c.opts.Verbosity),
				}, nil
			}, bins[Scheduler], func(ctx context.Context) error {
				return waitHTTP(ctx, insecureClient(), fmt.Sprintf("https://127.0.0.1:%d/healthz", port), "ok")
			})
			if errs[1] == nil {
				c.setMetricsURL(Scheduler, fmt.Sprintf("https://127.0.0.1:%d/metrics", port))
				logf("cluster: kube-scheduler healthy (%s)", since(t0))
			}
		}()
	}
	if c.opts.Kwok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kc := filepath.Join(c.Dir, "kubeconfigs", "kwok.kubeconfig")
			if errs[2] = c.PKI.WriteKubeconfig(kc, c.Server, "kwok", "kwok", []string{"system:masters"}); errs[2] != nil {
				return
			}
			stagesFile := filepath.Join(c.Dir, "run", "kwok.yaml")
			if errs[2] = writeKwokStages(bins["kwok-stages"], stagesFile); errs[2] != nil {
				return
			}
			var port int
			errs[2] = c.startWithRetry(ctx, Kwok, func() ([]string, error) {
				var err error
				if port, err = freePort(); err != nil {
					return nil, err
				}
				return []string{
					"--kubeconfig=" + kc,
					// kwokctl's default stages, never ~/.kwok/kwok.yaml.
					"--config=" + stagesFile,
					"--manage-all-nodes=false",
					"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
					"--node-lease-duration-seconds=40",
					"--server-address=127.0.0.1:" + strconv.Itoa(port),
				}, nil
			}, bins[Kwok], func(ctx context.Context) error {
				return waitHTTP(ctx, insecureClient(), fmt.Sprintf("http://127.0.0.1:%d/healthz", port), "ok")
			})
			if errs[2] == nil {
				c.setMetricsURL(Kwok, fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
				logf("cluster: kwok healthy (%s)", since(t0))
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	if !c.opts.NoControllerManager {
		// Pods are rejected until the serviceaccount controller made "default".
		if err := c.waitDefaultServiceAccount(ctx); err != nil {
			return err
		}
	}
	if err := c.writeState(); err != nil {
		return err
	}
	logf("cluster: ready in %s; export KUBECONFIG=%s", since(t0), c.Kubeconfig)
	return nil
}

// writeKwokStages writes the output of the kwok-stages tool (built next to
// kwok by tests/tools/build.sh) to path.
func writeKwokStages(bin, path string) error {
	out, err := exec.Command(bin).Output()
	if err != nil {
		return fmt.Errorf("kwok-stages: %w", err)
	}
	return os.WriteFile(path, out, 0o644)
}

// startWithRetry starts a component and waits for ready; when the process exits
// before it is ready (typically a port taken between freePort and bind), it tries
// again with fresh arguments, three times at most.
func (c *Cluster) startWithRetry(ctx context.Context, name string, argsFn func() ([]string, error), bin string,
	ready func(ctx context.Context) error) error {
	logPath := filepath.Join(c.LogsDir, name+".log")
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		args, err := argsFn()
		if err != nil {
			return err
		}
		args = append(args, c.opts.ExtraArgs[name]...)
		p, err := startProc(name, bin, args, c.opts.Env[name], logPath)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.procs = append(c.procs, p)
		c.mu.Unlock()
		if err := c.writePidFile(); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
		rctx, cancelExit := contextUntilExit(rctx, p)
		err = ready(rctx)
		cancelExit()
		cancel()
		if err == nil && !p.exited() {
			go c.watch(p)
			return nil
		}
		// Exited: either it failed, or another process on the same port
		// answered the readiness check while this one could not bind.
		if p.exited() {
			lastErr = fmt.Errorf("%s exited before it was ready (%v); log %s:\n%s", name, p.exitErr(), logPath, tail(logPath, 25))
			if strings.Contains(tail(logPath, 40), "address already in use") && ctx.Err() == nil {
				c.opts.Logf("cluster: %s: port taken, retrying (attempt %d)", name, attempt+1)
				continue
			}
			return lastErr
		}
		p.stop(c.opts.StopGrace)
		return fmt.Errorf("%s not ready: %w; log %s:\n%s", name, err, logPath, tail(logPath, 25))
	}
	return lastErr
}

// watch turns an unexpected exit of a running component into cluster failure.
func (c *Cluster) watch(p *proc) {
	<-p.done
	c.mu.Lock()
	stopping := c.stopping
	c.mu.Unlock()
	if stopping {
		return
	}
	c.fail(fmt.Errorf("%s (pid %d) exited unexpectedly: %v; log %s:\n%s", p.name, p.pid(), p.exitErr(), p.logPath, tail(p.logPath, 25)))
}

func (c *Cluster) fail(err error) {
	c.doneOnce.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	})
}

// clientQPSArgs are kube-controller-manager's flags for Options.ClientQPS.
func (c *Cluster) clientQPSArgs() []string {
	if c.opts.ClientQPS <= 0 {
		return nil
	}
	return []string{fmt.Sprintf("--kube-api-qps=%d", c.opts.ClientQPS), fmt.Sprintf("--kube-api-burst=%d", 2*c.opts.ClientQPS)}
}

// clientQPSConfig is the same for kube-scheduler's clientConnection.
func (c *Cluster) clientQPSConfig() string {
	if c.opts.ClientQPS <= 0 {
		return ""
	}
	return fmt.Sprintf("\n  qps: %d\n  burst: %d", c.opts.ClientQPS, 2*c.opts.ClientQPS)
}

// Done is closed when a component exits on its own (not through Stop); Err
// then says which and why.
func (c *Cluster) Done() <-chan struct{} { return c.done }

// Err is the reason Done was closed, or nil.
func (c *Cluster) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stop stops every component (scheduler and controller-manager, then the API
// server, then etcd: SIGTERM to the process group, SIGKILL after StopGrace),
// waits for them, and removes the pidfile. Logs and state stay in Dir. Safe to
// call more than once and from several goroutines.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		c.stopping = true
		procs := slices.Clone(c.procs)
		c.mu.Unlock()
		// Controllers first, in parallel, then the API server, then etcd.
		var clients, servers []*proc
		for _, p := range procs {
			if p.name == ControllerManager || p.name == Scheduler || p.name == Kwok {
				clients = append(clients, p)
			} else {
				servers = append(servers, p)
			}
		}
		var wg sync.WaitGroup
		for _, p := range clients {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(c.opts.StopGrace) }()
		}
		wg.Wait()
		for i := len(servers) - 1; i >= 0; i-- {
			servers[i].stop(c.opts.StopGrace)
		}
		var left []string
		for _, p := range procs {
			if alive(p.pid(), p.start) || groupAlive(p.pid()) {
				left = append(left, fmt.Sprintf("%s (pid %d)", p.name, p.pid()))
			}
		}
		if len(left) > 0 {
			c.stopErr = fmt.Errorf("still running after stop: %s", strings.Join(left, ", "))
			return
		}
		_ = os.Remove(pidFilePath(c.Dir))
		_ = os.Remove(StateFile(c.Dir))
	})
	return c.stopErr
}

// Pids returns the pid of every component process started (including failed
// attempts), for leak checks.
func (c *Cluster) Pids() map[string][]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string][]int{}
	for _, p := range c.procs {
		m[p.name] = append(m[p.name], p.pid())
	}
	return m
}

// LogFile is the path of a component's log.
func (c *Cluster) LogFile(component string) string {
	return filepath.Join(c.LogsDir, component+".log")
}

// FeatureGatesFlag renders the gates as a --feature-gates value, sorted.
func (c *Cluster) FeatureGatesFlag() string { return FeatureGatesFlag(c.Gates) }

// FeatureGatesFlag renders gates as a --feature-gates value, sorted.
func FeatureGatesFlag(gates map[string]bool) string {
	keys := make([]string, 0, len(gates))
	for k := range gates {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%t", k, gates[k])
	}
	return strings.Join(parts, ",")
}

// ParseFeatureGates parses "A=true,B=false" (the --feature-gates syntax).
func ParseFeatureGates(s string) (map[string]bool, error) {
	m := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("feature gate %q: want Name=true|false", kv)
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("feature gate %q: %w", kv, err)
		}
		m[strings.TrimSpace(k)] = b
	}
	return m, nil
}

func mergeGates(extra map[string]bool) map[string]bool {
	m := make(map[string]bool, len(DefaultFeatureGates)+len(extra))
	for k, v := range DefaultFeatureGates {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// RESTConfig is the admin client configuration.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg, nil
}

// Client is an admin clientset.
func (c *Cluster) Client() (kubernetes.Interface, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// NodeKubeconfig mints a client cert for system:node:<node> in group
// system:nodes and writes a kubeconfig for it, so a kubelet-side harness acts
// as that node under the Node authorizer and NodeRestriction.
func (c *Cluster) NodeKubeconfig(node string) (string, error) {
	return NodeKubeconfig(c.Dir, c.Server, node)
}

// NodeKubeconfig does Cluster.NodeKubeconfig for a cluster started by another
// process (the CLI): dir is its directory, server its API server URL.
func NodeKubeconfig(dir, server, node string) (string, error) {
	pki, err := LoadPKI(filepath.Join(dir, "certs"))
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfigs", "node-"+node+".kubeconfig")
	return path, pki.WriteKubeconfig(path, server, "node-"+node, "system:node:"+node, []string{"system:nodes"})
}

// UserKubeconfig mints a client cert for any user and groups (say, a service
// identity under test with only its RBAC) and writes a kubeconfig named name.
func (c *Cluster) UserKubeconfig(name, user string, groups []string) (string, error) {
	path := filepath.Join(c.Dir, "kubeconfigs", name+".kubeconfig")
	return path, c.PKI.WriteKubeconfig(path, c.Server, name, user, groups)
}

// Kubectl runs the pinned kubectl against the cluster as admin and returns its
// combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	bin, err := FindTool(c.ToolsBinDir, "kubectl")
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// State returns what cluster.json holds.
func (c *Cluster) State() State {
	pids := map[string]int{}
	c.mu.Lock()
	for _, p := range c.procs {
		if !p.exited() {
			pids[p.name] = p.pid()
		}
	}
	c.mu.Unlock()
	return State{
		Dir: c.Dir, Server: c.Server, Kubeconfig: c.Kubeconfig, EtcdURL: c.EtcdURL, LogsDir: c.LogsDir,
		CACert: c.PKI.CACertFile, FeatureGates: c.FeatureGatesFlag(), ToolsBin: c.ToolsBinDir,
		Versions: c.Versions, Pids: pids,
	}
}

func (c *Cluster) writeState() error { return writeJSONAtomic(StateFile(c.Dir), c.State()) }

// ReadState loads cluster.json from dir.
func ReadState(dir string) (*State, error) {
	b, err := os.ReadFile(StateFile(dir))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

func (c *Cluster) writePidFile() error {
	c.pidMu.Lock()
	defer c.pidMu.Unlock()
	pf := pidFile{Supervisor: pidRecord{Name: "launcher", Pid: os.Getpid()}}
	pf.Supervisor.Start, _ = procStartTime(os.Getpid())
	c.mu.Lock()
	for _, p := range c.procs {
		if !p.exited() {
			pf.Processes = append(pf.Processes, pidRecord{Name: p.name, Pid: p.pid(), Start: p.start, Bin: p.bin})
		}
	}
	c.mu.Unlock()
	return writeJSONAtomic(pidFilePath(c.Dir), pf)
}

func (c *Cluster) waitDefaultServiceAccount(ctx context.Context) error {
	cs, err := c.Client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	for {
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			c.opts.Logf("cluster: waiting for the default ServiceAccount: %v", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("default ServiceAccount never appeared (is the controller-manager working? log %s): %w",
				c.LogFile(ControllerManager), ctx.Err())
		case <-c.done:
			return c.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// contextUntilExit returns a context that is also cancelled when p exits.
func contextUntilExit(ctx context.Context, p *proc) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// waitHTTP polls url until it answers 200 with a body containing want.
func waitHTTP(ctx context.Context, client *http.Client, url, want string) error {
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
				return nil
			}
			last = fmt.Sprintf("%s: HTTP %d: %s", url, resp.StatusCode, firstLines(string(body), 12))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %s)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, "\n")
}

func tlsClient(caFile, certFile, keyFile string) (*http.Client, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}, nil
}

// insecureClient is for health checks of loopback components whose serving
// certs are self-signed at start (controller-manager, scheduler) or plain HTTP.
func insecureClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check
	}}
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }
