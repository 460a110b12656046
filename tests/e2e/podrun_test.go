package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// A container as the kubelet and a runtime would start it, close enough for the plugin
// to notice any mismatch between the chart and the image: the image's unpacked root
// filesystem as its root (chroot), each hostPath volume bind-mounted at its mountPath
// (read-only where the template says so), fresh /proc, /dev and /tmp, the template's
// command, args and environment (downward-API fields resolved), and the
// ServiceAccount token projected where in-cluster clients read it. What it leaves out
// (cgroups, capabilities, seccomp, network namespaces) the plugin does not depend on.
// Needs root for the mount namespace; tests skip without it unless tools are required.

// podIdentity is what the API server and the kubelet would fill into a pod.
type podIdentity struct {
	node, uid, ip string
	kubeconfig    string // a plugin identity kubeconfig (token + CA), see harness.PluginIdentity
}

// containerRun is one container to start from a pod template.
type containerRun struct {
	rootfs   string
	spec     v1.PodSpec
	id       podIdentity
	hostPath func(string) string // maps a hostPath volume's path to this machine's path
	dir      string              // scratch directory for the token and the log
}

// canRunContainers says why this process cannot make mount namespaces, or "".
func canRunContainers() string {
	if os.Geteuid() != 0 {
		return "needs root (a mount namespace with bind mounts and chroot)"
	}
	for _, tool := range []string{"unshare", "mount", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " is not on PATH (util-linux, coreutils)"
		}
	}
	return ""
}

// start runs the template's first container and returns it as a proc.
func (r containerRun) start(t testing.TB, what, httpAddr string) *proc {
	t.Helper()
	if len(r.spec.Containers) == 0 {
		t.Fatal("pod template without containers")
	}
	c := r.spec.Containers[0]
	sa := filepath.Join(r.dir, "serviceaccount")
	if err := os.MkdirAll(sa, 0o755); err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(r.id.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	cl, auth := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
	for name, data := range map[string][]byte{"token": []byte(auth.Token), "ca.crt": cl.CertificateAuthorityData, "namespace": []byte("topodra-system")} {
		if err := os.WriteFile(filepath.Join(sa, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	host, port, ok := strings.Cut(strings.TrimPrefix(cl.Server, "https://"), ":")
	if !ok {
		t.Fatalf("server %q has no port", cl.Server)
	}

	volumes := map[string]v1.Volume{}
	for _, v := range r.spec.Volumes {
		volumes[v.Name] = v
	}
	// The script runs in the new mount namespace; arguments after the script name
	// are the root, then the command line, so nothing from the template is parsed
	// by the shell.
	var script strings.Builder
	script.WriteString("set -eu\nR=\"$1\"; shift\nmkdir -p \"$R/proc\" \"$R/dev\" \"$R/tmp\"\n")
	script.WriteString("mount -t proc proc \"$R/proc\"\nmount -t tmpfs -o mode=755 tmpfs \"$R/dev\"\n")
	script.WriteString("for n in null zero full random urandom tty; do touch \"$R/dev/$n\"; mount --bind \"/dev/$n\" \"$R/dev/$n\"; done\n")
	script.WriteString("mount -t tmpfs tmpfs \"$R/tmp\"\n")
	bind := func(src, dst string, ro bool) {
		st, err := os.Stat(src)
		if err != nil {
			t.Fatalf("volume source %s: %v", src, err)
		}
		d := strconv.Quote(dst)
		if st.IsDir() {
			fmt.Fprintf(&script, "mkdir -p \"$R\"%s\n", d)
		} else {
			fmt.Fprintf(&script, "mkdir -p \"$(dirname \"$R\"%s)\"; touch \"$R\"%s\n", d, d)
		}
		fmt.Fprintf(&script, "mount --rbind %s \"$R\"%s\n", strconv.Quote(src), d)
		if ro {
			fmt.Fprintf(&script, "mount -o remount,bind,ro \"$R\"%s\n", d)
		}
	}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok || v.HostPath == nil {
			t.Fatalf("volume %q of mount %s is not a hostPath volume; this runner knows only those", m.Name, m.MountPath)
		}
		src := r.hostPath(v.HostPath.Path)
		if v.HostPath.Type != nil && *v.HostPath.Type == v1.HostPathDirectoryOrCreate {
			if err := os.MkdirAll(src, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		bind(src, m.MountPath, m.ReadOnly)
	}
	bind(sa, "/var/run/secrets/kubernetes.io/serviceaccount", true)
	script.WriteString("exec chroot \"$R\" \"$@\"\n")

	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOSTNAME=" + r.id.node, "KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port}
	for _, e := range c.Env {
		val := e.Value
		if f := e.ValueFrom; f != nil {
			if f.FieldRef == nil {
				t.Fatalf("env %s: only fieldRef is supported", e.Name)
			}
			switch f.FieldRef.FieldPath {
			case "spec.nodeName":
				val = r.id.node
			case "metadata.uid":
				val = r.id.uid
			case "status.podIP", "status.hostIP":
				val = r.id.ip
			case "metadata.namespace":
				val = "topodra-system"
			default:
				t.Fatalf("env %s: fieldRef %s is not supported", e.Name, f.FieldRef.FieldPath)
			}
		}
		env = append(env, e.Name+"="+val)
	}

	argv := append([]string{"--mount", "--propagation", "private", "bash", "-c", script.String(), "container", r.rootfs}, c.Command...)
	argv = append(argv, c.Args...)
	logPath := filepath.Join(r.dir, fmt.Sprintf("%s.log", what))
	if err := os.WriteFile(filepath.Join(r.dir, what+".sh"), []byte(script.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProcEnv(t, what, "unshare", argv, env, logPath, httpAddr)
	t.Logf("%s: started %v in %s (script %s.sh, log %s)", what, append(c.Command, c.Args...), r.rootfs, filepath.Join(r.dir, what), logPath)
	return p
}

// startProcEnv is startProc with exactly env as the environment.
func startProcEnv(t testing.TB, what, bin string, args, env []string, logPath, httpAddr string) *proc {
	t.Helper()
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{what: what, cmd: cmd, log: logPath, http: httpAddr, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); lf.Close(); close(p.done) }()
	return p
}
