// Command topodra-kubelet-harness runs the kubelet's own plugin-manager and DRA-manager
// code as one node of a local cluster (see package harness): it registers the Node,
// registers the DRA plugins that appear in --registry-dir, prepares the claims of the
// pods bound to the node, injects their CDI devices with the CDI library and marks
// them Running, and unprepares and finalises them on deletion. Used by `make demo`.
//
//	topodra-kubelet-harness --kubeconfig node.kubeconfig --node-name node-a \
//	    --registry-dir DIR/registry --plugins-dir DIR/plugins --cdi-dir DIR/cdi --state-dir DIR/kubelet
//
// With --cluster-dir (a topodra-cluster directory) and no --kubeconfig, a node
// kubeconfig (system:node:<name>) is minted from the cluster's CA. It runs until
// SIGINT/SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"topodra.dev/tests/cluster"
	"topodra.dev/tests/e2e/harness"
)

func main() {
	var (
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig of the node identity (system:node:<node>)")
		clusterDir  = flag.String("cluster-dir", "", "a topodra-cluster directory: mint a node kubeconfig from it when --kubeconfig is empty")
		nodeName    = flag.String("node-name", "", "the Node this harness is (registered if missing)")
		registryDir = flag.String("registry-dir", "", "plugin registry directory the plugin watcher watches")
		pluginsDir  = flag.String("plugins-dir", "", "the kubelet's plugins directory (created; the plugin puts its DRA socket under it)")
		cdiDir      = flag.String("cdi-dir", "", "CDI spec directory the runtime loads")
		stateDir    = flag.String("state-dir", "", "DRA manager checkpoint and per-pod injection records")
		gates       = flag.String("feature-gates", "", "feature gates (default: the cluster's, tests/cluster DefaultFeatureGates)")
		pluginKC    = flag.String("write-plugin-kubeconfig", "", "with --cluster-dir: write a kubeconfig for the plugin's production identity "+
			"(ServiceAccount topodra-system/topodra-kubelet-plugin, token bound to a pod on this node; apply deploy/manifests first) to this path, once the node is up")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *clusterDir, *nodeName, *registryDir, *pluginsDir, *cdiDir, *stateDir, *gates, *pluginKC); err != nil {
		fmt.Fprintln(os.Stderr, "topodra-kubelet-harness:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, clusterDir, nodeName, registryDir, pluginsDir, cdiDir, stateDir, gates, pluginKC string) error {
	if nodeName == "" || registryDir == "" || cdiDir == "" || stateDir == "" {
		return fmt.Errorf("--node-name, --registry-dir, --cdi-dir and --state-dir are required")
	}
	if pluginKC != "" && clusterDir == "" {
		return fmt.Errorf("--write-plugin-kubeconfig needs --cluster-dir")
	}
	if kubeconfig == "" {
		if clusterDir == "" {
			return fmt.Errorf("--kubeconfig or --cluster-dir is required")
		}
		st, err := cluster.ReadState(clusterDir)
		if err != nil {
			return err
		}
		if kubeconfig, err = cluster.NodeKubeconfig(clusterDir, st.Server, nodeName); err != nil {
			return err
		}
	}
	fg := cluster.DefaultFeatureGates
	if gates != "" {
		var err error
		if fg, err = cluster.ParseFeatureGates(gates); err != nil {
			return err
		}
	}
	if pluginsDir != "" {
		if err := os.MkdirAll(pluginsDir, 0o755); err != nil {
			return err
		}
	}
	h, err := harness.New(harness.Config{
		Kubeconfig: kubeconfig, NodeName: nodeName, RegistryDir: registryDir, CDIDir: cdiDir,
		StateDir: stateDir, FeatureGates: fg,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := h.Start(ctx); err != nil {
		return err
	}
	if pluginKC != "" {
		if err := writePluginKubeconfig(ctx, clusterDir, nodeName, pluginKC); err != nil {
			h.Stop()
			return err
		}
		fmt.Fprintf(os.Stderr, "topodra-kubelet-harness: plugin kubeconfig written to %s\n", pluginKC)
	}
	<-ctx.Done()
	h.Stop()
	return nil
}

func writePluginKubeconfig(ctx context.Context, clusterDir, node, path string) error {
	st, err := cluster.ReadState(clusterDir)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err != nil {
		return err
	}
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(st.CACert)
	if err != nil {
		return err
	}
	return harness.PluginIdentity(ctx, admin, st.Server, ca, node, path, 24*time.Hour)
}
