package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/adaptation"
	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The runtime end of NRI (the Node Resource Interface of containerd and CRI-O), for
// plugins such as kubernetes-sigs' dra-driver-cpu that set a container's cpuset when
// the runtime creates it. It is containerd's own library (pkg/adaptation), driven
// the way containerd's CRI plugin drives it:
//
//   - a plugin that connects is synchronized with every pod sandbox and container
//     the runtime has (SyncFn, called by the adaptation with its sync lock held);
//   - pod and container lifecycle calls happen with BlockPluginSync held, so a
//     plugin that connects meanwhile sees either the state before or after one,
//     never half of it;
//   - RunPodSandbox, then per container CreateContainer (the plugins' adjustment
//     of the container is the result), PostCreateContainer, StartContainer,
//     PostStartContainer; at the end StopContainer, RemoveContainer, StopPodSandbox,
//     RemovePodSandbox;
//   - updates of other containers (the CreateContainer and StopContainer replies,
//     and unsolicited ones through UpdateFn) are applied to the containers the
//     harness keeps and to their pods' records.
//
// Nothing is run: the "containers" are the injection records.

// nriRuntime is the harness's NRI state: the adaptation and the pods and
// containers it has told it about.
type nriRuntime struct {
	a      *adaptation.Adaptation
	logger logr.Logger
	// onUpdate rewrites the record of a pod whose container got an update.
	onUpdate func(podUID types.UID)

	mu   sync.Mutex
	pods map[types.UID]*adaptation.PodSandbox
	ctrs map[string]*adaptation.Container // by container id
}

// nriLogger sends the NRI library's log lines to the harness logger (its default
// goes to logrus on stderr, that is, into the test's output).
type nriLogger struct{ l logr.Logger }

func (n nriLogger) Debugf(_ context.Context, f string, a ...any) { n.l.V(4).Info(fmt.Sprintf(f, a...)) }
func (n nriLogger) Infof(_ context.Context, f string, a ...any)  { n.l.Info(fmt.Sprintf(f, a...)) }
func (n nriLogger) Warnf(_ context.Context, f string, a ...any) {
	n.l.Info("WARNING: " + fmt.Sprintf(f, a...))
}
func (n nriLogger) Errorf(_ context.Context, f string, a ...any) {
	n.l.Info("ERROR: " + fmt.Sprintf(f, a...))
}

// startNRI listens on socket for NRI plugins. No plugin is launched: the plugin
// directory is a path under stateDir that does not exist, so only plugins that
// connect to the socket take part (a DaemonSet's, as in a cluster).
func startNRI(socket, stateDir string, logger logr.Logger, onUpdate func(types.UID)) (*nriRuntime, error) {
	r := &nriRuntime{logger: logger, onUpdate: onUpdate, pods: map[types.UID]*adaptation.PodSandbox{}, ctrs: map[string]*adaptation.Container{}}
	nrilog.Set(nriLogger{logger})
	a, err := adaptation.New("topodra-kubelet-harness", "v0", r.synchronize, r.updateFromPlugin,
		adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(stateDir, "nri", "no-plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(stateDir, "nri", "no-plugin-config")))
	if err != nil {
		return nil, fmt.Errorf("harness: NRI: %w", err)
	}
	if err := a.Start(); err != nil {
		return nil, fmt.Errorf("harness: NRI start on %s: %w", socket, err)
	}
	r.a = a
	logger.Info("NRI runtime listening", "socket", socket)
	return r, nil
}

func (r *nriRuntime) stop() { r.a.Stop() }

// synchronize hands a newly connected plugin everything the runtime has.
func (r *nriRuntime) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	r.mu.Lock()
	pods := make([]*adaptation.PodSandbox, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	ctrs := make([]*adaptation.Container, 0, len(r.ctrs))
	for _, c := range r.ctrs {
		ctrs = append(ctrs, c)
	}
	updates, err := cb(ctx, pods, ctrs)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	touched := r.applyLocked(updates, "synchronize")
	r.mu.Unlock()
	r.notify(touched)
	return nil
}

// updateFromPlugin applies the updates a plugin asks for on its own; none fails.
func (r *nriRuntime) updateFromPlugin(_ context.Context, updates []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
	r.mu.Lock()
	touched := r.applyLocked(updates, "unsolicited")
	r.mu.Unlock()
	r.notify(touched)
	return nil, nil
}

// applyLocked sets the cpuset of each updated container (the only resources the
// records show) and returns the pods it touched, whose records the caller has
// rewritten (notify) once it has let go of r.mu.
func (r *nriRuntime) applyLocked(updates []*adaptation.ContainerUpdate, why string) map[types.UID]bool {
	touched := map[types.UID]bool{}
	for _, u := range updates {
		c, ok := r.ctrs[u.GetContainerId()]
		if !ok {
			r.logger.Info("NRI update for an unknown container", "why", why, "container", u.GetContainerId())
			continue
		}
		cpu := u.GetLinux().GetResources().GetCpu()
		if cpu == nil {
			continue
		}
		cur := containerCPU(c)
		if cpu.GetCpus() != "" {
			cur.Cpus = cpu.GetCpus()
		}
		if cpu.GetMems() != "" {
			cur.Mems = cpu.GetMems()
		}
		r.logger.Info("NRI container update", "why", why, "container", c.Id, "cpus", cur.Cpus, "mems", cur.Mems)
		touched[types.UID(c.PodSandboxId)] = true
	}
	return touched
}

func (r *nriRuntime) notify(touched map[types.UID]bool) {
	for uid := range touched {
		r.onUpdate(uid)
	}
}

// containerCPU is the container's CPU resources, created when missing.
func containerCPU(c *adaptation.Container) *adaptation.LinuxCPU {
	if c.Linux == nil {
		c.Linux = &adaptation.LinuxContainer{}
	}
	if c.Linux.Resources == nil {
		c.Linux.Resources = &adaptation.LinuxResources{}
	}
	if c.Linux.Resources.Cpu == nil {
		c.Linux.Resources.Cpu = &adaptation.LinuxCPU{}
	}
	return c.Linux.Resources.Cpu
}

func containerID(pod *v1.Pod, name string) string { return string(pod.UID) + "-" + name }

// startPod runs the pod's sandbox and creates and starts its containers, each with
// the environment it would have (its spec's literal values and what CDI injected);
// cpusets reads what the plugins gave them. Containers already created (a retried
// start) are kept as they are.
func (r *nriRuntime) startPod(ctx context.Context, pod *v1.Pod, rec *PodRecord) error {
	block := r.a.BlockPluginSync()
	defer block.Unblock()
	r.mu.Lock()
	sb, known := r.pods[pod.UID]
	r.mu.Unlock()
	if !known {
		sb = &adaptation.PodSandbox{Id: string(pod.UID), Name: pod.Name, Uid: string(pod.UID), Namespace: pod.Namespace,
			Labels: pod.Labels, Annotations: pod.Annotations}
		if err := r.a.RunPodSandbox(ctx, &adaptation.StateChangeEvent{Pod: sb}); err != nil {
			return fmt.Errorf("NRI RunPodSandbox: %w", err)
		}
		r.mu.Lock()
		r.pods[pod.UID] = sb
		r.mu.Unlock()
	}
	for i := range rec.Containers {
		inj := &rec.Containers[i]
		id := containerID(pod, inj.Container)
		r.mu.Lock()
		_, done := r.ctrs[id]
		r.mu.Unlock()
		if !done {
			if err := r.createContainer(ctx, pod, sb, id, inj); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *nriRuntime) createContainer(ctx context.Context, pod *v1.Pod, sb *adaptation.PodSandbox, id string, inj *Injection) error {
	var env []string
	for _, sc := range pod.Spec.Containers {
		if sc.Name != inj.Container {
			continue
		}
		for _, e := range sc.Env {
			if e.ValueFrom == nil {
				env = append(env, e.Name+"="+e.Value)
			}
		}
	}
	env = append(env, inj.Env...)
	c := &adaptation.Container{Id: id, PodSandboxId: sb.Id, Name: inj.Container, State: adaptation.ContainerState_CONTAINER_CREATED, Env: env}
	resp, err := r.a.CreateContainer(ctx, &adaptation.CreateContainerRequest{Pod: sb, Container: c})
	if err != nil {
		return fmt.Errorf("NRI CreateContainer %s: %w", inj.Container, err)
	}
	adj := resp.GetAdjust().GetLinux().GetResources().GetCpu()
	r.logger.Info("NRI container created", "pod", pod.Namespace+"/"+pod.Name, "container", inj.Container,
		"cpus", adj.GetCpus(), "mems", adj.GetMems(), "otherUpdates", len(resp.GetUpdate()))
	r.mu.Lock()
	cpu := containerCPU(c)
	cpu.Cpus, cpu.Mems = adj.GetCpus(), adj.GetMems()
	r.ctrs[id] = c
	touched := r.applyLocked(resp.GetUpdate(), "CreateContainer "+id)
	r.mu.Unlock()
	r.notify(touched)
	if err := r.a.PostCreateContainer(ctx, &adaptation.StateChangeEvent{Pod: sb, Container: c}); err != nil {
		return fmt.Errorf("NRI PostCreateContainer %s: %w", inj.Container, err)
	}
	r.mu.Lock()
	c.State = adaptation.ContainerState_CONTAINER_RUNNING
	r.mu.Unlock()
	if err := r.a.StartContainer(ctx, &adaptation.StateChangeEvent{Pod: sb, Container: c}); err != nil {
		return fmt.Errorf("NRI StartContainer %s: %w", inj.Container, err)
	}
	if err := r.a.PostStartContainer(ctx, &adaptation.StateChangeEvent{Pod: sb, Container: c}); err != nil {
		return fmt.Errorf("NRI PostStartContainer %s: %w", inj.Container, err)
	}
	return nil
}

// stopPod stops and removes the pod's containers and its sandbox; a pod the
// runtime never ran is nothing to stop.
func (r *nriRuntime) stopPod(ctx context.Context, uid types.UID) error {
	block := r.a.BlockPluginSync()
	defer block.Unblock()
	r.mu.Lock()
	sb, ok := r.pods[uid]
	var ctrs []*adaptation.Container
	for _, c := range r.ctrs {
		if c.PodSandboxId == string(uid) {
			ctrs = append(ctrs, c)
		}
	}
	r.mu.Unlock()
	if !ok {
		return nil
	}
	for _, c := range ctrs {
		r.mu.Lock()
		c.State = adaptation.ContainerState_CONTAINER_STOPPED
		r.mu.Unlock()
		resp, err := r.a.StopContainer(ctx, &adaptation.StopContainerRequest{Pod: sb, Container: c})
		if err != nil {
			return fmt.Errorf("NRI StopContainer %s: %w", c.Name, err)
		}
		r.mu.Lock()
		delete(r.ctrs, c.Id)
		touched := r.applyLocked(resp.GetUpdate(), "StopContainer "+c.Id)
		r.mu.Unlock()
		r.notify(touched)
		if err := r.a.RemoveContainer(ctx, &adaptation.StateChangeEvent{Pod: sb, Container: c}); err != nil {
			return fmt.Errorf("NRI RemoveContainer %s: %w", c.Name, err)
		}
	}
	if err := r.a.StopPodSandbox(ctx, &adaptation.StateChangeEvent{Pod: sb}); err != nil {
		return fmt.Errorf("NRI StopPodSandbox: %w", err)
	}
	if err := r.a.RemovePodSandbox(ctx, &adaptation.StateChangeEvent{Pod: sb}); err != nil {
		return fmt.Errorf("NRI RemovePodSandbox: %w", err)
	}
	r.mu.Lock()
	delete(r.pods, uid)
	r.mu.Unlock()
	return nil
}

// cpusets is the current cpuset of each container of a pod, by container name.
func (r *nriRuntime) cpusets(uid types.UID) map[string][2]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][2]string{}
	for _, c := range r.ctrs {
		if c.PodSandboxId == string(uid) {
			cpu := containerCPU(c)
			out[c.Name] = [2]string{cpu.Cpus, cpu.Mems}
		}
	}
	return out
}

// mapPath rewrites a path as a plugin sees it in its mount namespace to this
// machine's path, by the longest matching prefix of m.
func mapPath(m map[string]string, p string) string {
	best := ""
	for from := range m {
		if (p == from || strings.HasPrefix(p, strings.TrimSuffix(from, "/")+"/")) && len(from) > len(best) {
			best = from
		}
	}
	if best == "" {
		return p
	}
	return filepath.Join(m[best], strings.TrimPrefix(p, best))
}
