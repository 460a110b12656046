// Command topodra-cluster runs the local test control plane of package
// topodra.dev/tests/cluster from a shell (make demo, make bench, by hand).
//
//	topodra-cluster up   --dir DIR [--wait] [--feature-gates A=true,...] [...]
//	topodra-cluster down --dir DIR
//	topodra-cluster env  --dir DIR
//	topodra-cluster status --dir DIR
//	topodra-cluster node-kubeconfig --dir DIR --node NAME
//
// `up` prints shell exports on stdout (eval "$(topodra-cluster up --dir d)")
// and progress on stderr. Without --wait it starts a background launcher
// (logs in DIR/launcher.log) and returns once the cluster is ready; with --wait
// it stays in the foreground until SIGINT/SIGTERM and then stops everything.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"topodra.dev/tests/cluster"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "up":
		err = up(args)
	case "down":
		err = down(args)
	case "env":
		err = env(args)
	case "status":
		err = status(args)
	case "node-kubeconfig":
		err = nodeKubeconfig(args)
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "topodra-cluster: unknown command %q\n", cmd)
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "topodra-cluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: topodra-cluster <command> [flags]

commands:
  up --dir DIR [--wait] [--feature-gates A=true,...] [--runtime-config G/V=true,...]
     [--tools-bin DIRS] [--v N] [--timeout D] [--no-scheduler] [--no-controller-manager] [--kwok]
        start etcd, kube-apiserver, kube-controller-manager, kube-scheduler (and kwok); print
        shell exports (KUBECONFIG, TOPODRA_TOOLS_BIN, PATH) on stdout
  down --dir DIR          stop what "up" started in DIR (also after a crash)
  env --dir DIR           print the shell exports again
  status --dir DIR        say whether a cluster runs in DIR (exit 1 if not)
  node-kubeconfig --dir DIR --node NAME
                          mint a system:node:NAME client cert, print its kubeconfig path

Tools come from --tools-bin or $TOPODRA_TOOLS_BIN: eval "$(tests/tools/build.sh --env)".
`)
}

func dirFlag(fs *flag.FlagSet) *string {
	return fs.String("dir", "", "cluster directory (required)")
}

func parse(fs *flag.FlagSet, args []string, dir *string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	*dir = abs
	return nil
}

func launcherLog(dir string) string { return filepath.Join(dir, "launcher.log") }

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	dir := dirFlag(fs)
	wait := fs.Bool("wait", false, "stay in the foreground until interrupted")
	gates := fs.String("feature-gates", "", "extra feature gates, merged over the defaults ("+cluster.FeatureGatesFlag(cluster.DefaultFeatureGates)+")")
	runtimeConfig := fs.String("runtime-config", "", "kube-apiserver --runtime-config entries")
	toolsBin := fs.String("tools-bin", "", "directories with the binaries (default $"+cluster.ToolsEnv+")")
	verbosity := fs.Int("v", 2, "klog verbosity of the Kubernetes components")
	timeout := fs.Duration("timeout", 3*time.Minute, "readiness timeout per component")
	noSched := fs.Bool("no-scheduler", false, "do not run kube-scheduler")
	noKCM := fs.Bool("no-controller-manager", false, "do not run kube-controller-manager")
	kwok := fs.Bool("kwok", false, "also run kwok for nodes annotated "+cluster.KwokNodeAnnotation+"=fake")
	if err := parse(fs, args, dir); err != nil {
		return err
	}
	extraGates, err := cluster.ParseFeatureGates(*gates)
	if err != nil {
		return err
	}
	if _, err := cluster.FindTool(cluster.ToolsBin(*toolsBin), cluster.APIServer); err != nil {
		return err
	}
	if cluster.Running(*dir) {
		return fmt.Errorf("a cluster is already running in %s (topodra-cluster down --dir %s)", *dir, *dir)
	}
	if !*wait {
		return upBackground(*dir, args)
	}

	opts := cluster.Options{
		Dir:                 *dir,
		ToolsBin:            *toolsBin,
		FeatureGates:        extraGates,
		Verbosity:           *verbosity,
		StartTimeout:        *timeout,
		NoScheduler:         *noSched,
		NoControllerManager: *noKCM,
		Kwok:                *kwok,
		Logf: func(format string, a ...any) {
			fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
		},
	}
	if *runtimeConfig != "" {
		opts.RuntimeConfig = strings.Split(*runtimeConfig, ",")
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-sigs:
			cancel() // interrupts a start in progress
		case <-ctx.Done():
		}
	}()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	printEnv(c.State())
	fmt.Fprintf(os.Stderr, "cluster up: %s (logs %s); Ctrl-C or `topodra-cluster down --dir %s` stops it\n", c.Server, c.LogsDir, c.Dir)
	// Signals from here on are handled below, not by the start canceller.
	signal.Stop(sigs)
	sigs2 := make(chan os.Signal, 2)
	signal.Notify(sigs2, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var runErr error
	select {
	case sig := <-sigs2:
		fmt.Fprintf(os.Stderr, "%v: stopping the cluster\n", sig)
	case <-c.Done():
		runErr = c.Err()
		fmt.Fprintf(os.Stderr, "a component died, stopping the cluster: %v\n", runErr)
	}
	if err := c.Stop(); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(os.Stderr, "cluster stopped; logs kept in %s\n", c.LogsDir)
	return runErr
}

// upBackground re-runs `up --wait` as a session leader with its output in
// DIR/launcher.log, waits for cluster.json (ready) or its death, and returns.
func upBackground(dir string, args []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(cluster.StateFile(dir))
	self, err := os.Executable()
	if err != nil {
		return err
	}
	lf, err := os.Create(launcherLog(dir))
	if err != nil {
		return err
	}
	defer lf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	cmd := exec.Command(self, append([]string{"up", "--wait"}, args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Fprintf(os.Stderr, "starting the cluster in the background (launcher pid %d, log %s)\n", cmd.Process.Pid, launcherLog(dir))
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	t0 := time.Now()
	lastNote := t0
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(launcherLog(dir))
			return fmt.Errorf("the launcher exited (%v) before the cluster was ready:\n%s", err, b)
		case <-tick.C:
		}
		if st, err := cluster.ReadState(dir); err == nil {
			printEnv(*st)
			fmt.Fprintf(os.Stderr, "cluster up in %s: %s (logs %s); stop it with: topodra-cluster down --dir %s\n",
				time.Since(t0).Round(time.Second), st.Server, st.LogsDir, dir)
			_ = cmd.Process.Release()
			return nil
		}
		if time.Since(lastNote) > 15*time.Second {
			lastNote = time.Now()
			fmt.Fprintf(os.Stderr, "... still starting (%s)\n", time.Since(t0).Round(time.Second))
		}
	}
}

func printEnv(st cluster.State) {
	fmt.Printf("export KUBECONFIG=%s\n", shellQuote(st.Kubeconfig))
	if st.ToolsBin != "" {
		fmt.Printf("export %s=%s\n", cluster.ToolsEnv, shellQuote(st.ToolsBin))
		fmt.Printf("export PATH=%s:\"$PATH\"\n", shellQuote(st.ToolsBin))
	}
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`!*?[]{}()<>|&;#~") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func down(args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	dir := dirFlag(fs)
	grace := fs.Duration("grace", 10*time.Second, "time each process gets after SIGTERM")
	if err := parse(fs, args, dir); err != nil {
		return err
	}
	killed, err := cluster.Cleanup(*dir, *grace)
	if len(killed) > 0 {
		fmt.Fprintf(os.Stderr, "stopped: %s\n", strings.Join(killed, ", "))
	} else if err == nil {
		fmt.Fprintf(os.Stderr, "nothing running in %s\n", *dir)
	}
	if err == nil {
		_ = os.Remove(cluster.StateFile(*dir))
	}
	return err
}

func env(args []string) error {
	fs := flag.NewFlagSet("env", flag.ExitOnError)
	dir := dirFlag(fs)
	if err := parse(fs, args, dir); err != nil {
		return err
	}
	st, err := cluster.ReadState(*dir)
	if err != nil {
		return fmt.Errorf("no running cluster in %s: %w", *dir, err)
	}
	printEnv(*st)
	return nil
}

func status(args []string) error {
	fs := flag.NewFlagSet("status", flag.ExitOnError)
	dir := dirFlag(fs)
	if err := parse(fs, args, dir); err != nil {
		return err
	}
	st, err := cluster.ReadState(*dir)
	if !cluster.Running(*dir) || err != nil {
		fmt.Printf("not running in %s\n", *dir)
		os.Exit(1)
	}
	fmt.Printf("running: %s\nkubeconfig: %s\nlogs: %s\nfeature gates: %s\n", st.Server, st.Kubeconfig, st.LogsDir, st.FeatureGates)
	names := make([]string, 0, len(st.Pids))
	for n := range st.Pids {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("  %-24s pid %d\n", n, st.Pids[n])
	}
	return nil
}

func nodeKubeconfig(args []string) error {
	fs := flag.NewFlagSet("node-kubeconfig", flag.ExitOnError)
	dir := dirFlag(fs)
	node := fs.String("node", "", "node name (required)")
	if err := parse(fs, args, dir); err != nil {
		return err
	}
	if *node == "" {
		return errors.New("--node is required")
	}
	st, err := cluster.ReadState(*dir)
	if err != nil {
		return fmt.Errorf("no running cluster in %s: %w", *dir, err)
	}
	path, err := cluster.NodeKubeconfig(*dir, st.Server, *node)
	if err != nil {
		return err
	}
	fmt.Println(path)
	return nil
}
