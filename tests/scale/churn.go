package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// churnMix is the churn workload's pod sizes and their shares: mixed sizes are
// what fragments NUMA zones, so that a node with k free GPUs may have no zone
// with k.
var churnMix = []struct {
	k     int
	share float64
}{{1, 0.5}, {2, 0.3}, {4, 0.2}}

// churnBusy is the share of the fleet's GPUs the churn keeps busy once it has
// settled (Little's law: busy GPUs = arrival rate × lifetime × GPUs per pod).
const churnBusy = 0.75

// churnPlan is the same sequence of pods for both stacks: pod i asks for
// sizes[i] GPUs and runs life[i] once bound.
type churnPlan struct {
	sizes []int
	life  []time.Duration
}

func planChurn(c config) churnPlan {
	rng := rand.New(rand.NewPCG(7, uint64(c.nodes)))
	n := int(c.churn.Seconds() * c.churnRate)
	mean := 0.0
	for _, m := range churnMix {
		mean += float64(m.k) * m.share
	}
	life := churnBusy * float64(c.nodes*gpusPerNode) / (c.churnRate * mean)
	p := churnPlan{}
	for i := 0; i < n; i++ {
		x, k := rng.Float64(), churnMix[len(churnMix)-1].k
		for _, m := range churnMix {
			if x < m.share {
				k = m.k
				break
			}
			x -= m.share
		}
		p.sizes = append(p.sizes, k)
		// Lifetimes spread over half to one and a half times the mean, so that
		// pods do not leave in step.
		p.life = append(p.life, time.Duration(life*(0.5+rng.Float64())*float64(time.Second)))
	}
	return p
}

// churnPod is pod `name` of k GPUs for one stack.
type churnPod func(name string, k int) *corev1.Pod

// isRefused is a pod the node's kubelet refused at admission: the Topology
// Manager's single-numa-node policy found no NUMA zone for it.
func isRefused(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed && p.Status.Reason == topologyAffinityError
}

// runChurn creates the plan's pods at `rate` a second; each bound pod runs its
// lifetime and is deleted. A pod its node refuses (Failed with
// TopologyAffinityError) is deleted and created again under a new name, as its
// ReplicaSet would, and counted in Misaligned. A pod's latency runs from its
// first create to the bind of the incarnation that stays. The run ends when
// every pod has been bound once, or nothing was bound for `stall`; then every
// pod left is deleted.
func runChurn(ctx context.Context, cs kubernetes.Interface, ns, wave string, plan churnPlan, rate float64, stall time.Duration, newPod churnPod) (waveResult, error) {
	sel := metav1.ListOptions{LabelSelector: waveLabel + "=" + wave}
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, sel)
	if err != nil {
		return waveResult{}, err
	}
	defer func() { w.Stop() }()

	var mu sync.Mutex
	n := len(plan.sizes)
	created := make([]time.Time, n)  // first create of pod i
	boundAt := make([]time.Time, n)  // bind of its current incarnation
	incarnation := make([]string, n) // the name of its current incarnation
	byName := map[string]int{}       // incarnation -> i
	refused := 0
	errs := make(chan error, 1)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	create := func(i int, name string) {
		p := newPod(name, plan.sizes[i])
		p.Labels = map[string]string{waveLabel: wave}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
			report(fmt.Errorf("creating %s: %w", name, err))
		}
	}
	del := func(name string) {
		err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			report(fmt.Errorf("deleting %s: %w", name, err))
		}
	}
	start := time.Now()
	go func() {
		for i := 0; i < n && ctx.Err() == nil; i++ {
			time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
			name := fmt.Sprintf("%s-%04d", wave, i)
			mu.Lock()
			created[i], incarnation[i], byName[name] = time.Now(), name, i
			mu.Unlock()
			go create(i, name)
		}
	}()

	lastProgress := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	boundOnce := func() int {
		k := 0
		for i := range boundAt {
			if !boundAt[i].IsZero() {
				k++
			}
		}
		return k
	}
	for {
		mu.Lock()
		done := boundOnce() == n
		mu.Unlock()
		if done {
			break
		}
		select {
		case err := <-errs:
			return waveResult{}, err
		case ev, ok := <-w.ResultChan():
			if !ok {
				if w, err = cs.CoreV1().Pods(ns).Watch(ctx, sel); err != nil {
					return waveResult{}, err
				}
				continue
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted || p.Spec.NodeName == "" {
				continue
			}
			mu.Lock()
			i, known := byName[p.Name]
			switch {
			case !known || incarnation[i] != p.Name:
			case isRefused(p):
				refused++
				boundAt[i] = time.Time{}
				next := fmt.Sprintf("%s-r%d", p.Name, refused)
				incarnation[i], byName[next] = next, i
				go del(p.Name)
				go create(i, next)
			case boundAt[i].IsZero():
				boundAt[i] = time.Now()
				lastProgress = time.Now()
				name, life := p.Name, plan.life[i]
				time.AfterFunc(life, func() { del(name) })
			}
			mu.Unlock()
		case <-tick.C:
			if time.Since(lastProgress) > stall {
				goto done
			}
		case <-ctx.Done():
			return waveResult{}, ctx.Err()
		}
	}
done:
	mu.Lock()
	defer mu.Unlock()
	times := make([]podTimes, n)
	bound := 0
	for i := range boundAt {
		// A refused pod's latency runs from its first create to the bind that
		// stays.
		times[i] = podTimes{created: created[i], bound: boundAt[i]}
		if !boundAt[i].IsZero() {
			bound++
		}
	}
	r := waveResult{Pods: n, Bound: bound, TimedOutPod: n - bound, Misaligned: refused}
	r.timed(start, time.Now(), times)
	return r, nil
}

// churnKind runs the churn workload once on a stack: one "wave", between two
// readings of the meter, whose teardown deletes what is left.
func churnKind(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns, stack string, stall time.Duration, newPod churnPod) (kindResult, error) {
	const wave = "churn"
	kr := kindResult{Kind: "mixed-churn", Rate: c.churnRate}
	r, err := m.wave(ctx, func() (waveResult, error) {
		return runChurn(ctx, cs, ns, wave, planChurn(c), c.churnRate, stall, newPod)
	}, func() error { return clearWave(ctx, cs, ns, wave) })
	if err != nil {
		return kr, fmt.Errorf("churn: %w", err)
	}
	waveProgress(stack, kr.Kind, 0, 0, r)
	kr.Waves = append(kr.Waves, r)
	return summarize(kr), nil
}

// draChurn is the churn workload on the DRA stack: aligned claims from templates.
func draChurn(ctx context.Context, cs kubernetes.Interface, c config, m *meter, ns string) (kindResult, error) {
	for _, mix := range churnMix {
		if err := ensureTemplate(ctx, cs, claimTemplate(ns, fmt.Sprintf("gpu-%d-aligned", mix.k), mix.k, alignOn(mix.k))); err != nil {
			return kindResult{}, err
		}
	}
	return churnKind(ctx, cs, c, m, ns, "dra", c.stall, func(name string, k int) *corev1.Pod {
		p := draPod(ns, "", fmt.Sprintf("gpu-%d-aligned", k))(0)
		p.Name = name
		return p
	})
}
