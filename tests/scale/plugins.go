package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"topodra.dev/tests/cluster"
)

// pluginFleet is one real topodra-kubelet-plugin process per kwok node, each on the
// simulated DGX H100, publishing its own slices: what the idle period measures
// (no kubelet is there to register them; publishing does not wait for it).
type pluginFleet struct {
	procs []*exec.Cmd
	done  []chan struct{}
}

// pids are the fleet's processes.
func (f *pluginFleet) pids() []int {
	var out []int
	for _, p := range f.procs {
		out = append(out, p.Process.Pid)
	}
	return out
}

func startPlugins(ctx context.Context, cl *cluster.Cluster, c config, simFlagsAll []string, n int) (*pluginFleet, error) {
	nodes := make([]int, n)
	for i := range nodes {
		nodes[i] = i
	}
	return startPluginsOn(cl, c, simFlagsAll, filepath.Join(cl.Dir, "plugins"), "plugin-", nodes)
}

// startPluginsOn starts a plugin for each of the nodes, in a directory of its own
// under root (its kubelet's registry and plugins directories, its CDI
// directory; the checkpoint goes in its plugin directory), logging to
// logPrefix<node>.log.
func startPluginsOn(cl *cluster.Cluster, c config, simFlagsAll []string, root, logPrefix string, nodes []int) (*pluginFleet, error) {
	f := &pluginFleet{}
	for _, i := range nodes {
		dir := filepath.Join(root, nodeName(i))
		for _, d := range []string{"registry", "plugins", "cdi"} {
			if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
				return f, err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte("scale-boot\n"), 0o644); err != nil {
			return f, err
		}
		args := append([]string{"serve", "--node-name=" + nodeName(i),
			"--kubelet-registry-dir=" + filepath.Join(dir, "registry"),
			"--kubelet-plugins-dir=" + filepath.Join(dir, "plugins"),
			"--cdi-dir=" + filepath.Join(dir, "cdi"),
			"--boot-id-file=" + filepath.Join(dir, "boot_id"),
			// Port 0: the kernel picks a free one at bind. A port picked here
			// beforehand can be taken by another process before the plugin
			// binds it (one of 100 plugins lost that race in a run).
			"--http-addr=127.0.0.1:0",
			"--log-format=json",
		}, simFlagsAll...)
		logf, err := os.Create(filepath.Join(cl.LogsDir, logPrefix+nodeName(i)+".log"))
		if err != nil {
			return f, err
		}
		cmd := exec.Command(c.bins.plugin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig, "TOPODRA_LOG=warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return f, err
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
		f.procs = append(f.procs, cmd)
		f.done = append(f.done, done)
	}
	return f, nil
}

// waitSlices waits until n nodes have their slices published.
func waitSlices(ctx context.Context, cs kubernetes.Interface, n, perNode int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
		if err != nil {
			return err
		}
		if len(l.Items) >= n*perNode {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d slices published after %s", len(l.Items), n*perNode, timeout)
		}
		time.Sleep(time.Second)
	}
}

// rss is the plugins' resident memory: total and largest.
func (f *pluginFleet) rss() (total, largest int64) {
	for _, p := range f.procs {
		if r, err := rssBytes(p.Process.Pid); err == nil {
			total += r
			if r > largest {
				largest = r
			}
		}
	}
	return total, largest
}

func (f *pluginFleet) stop() {
	for _, p := range f.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for i, d := range f.done {
		select {
		case <-d:
		case <-time.After(30 * time.Second):
			_ = f.procs[i].Process.Kill()
			<-d
		}
	}
}
