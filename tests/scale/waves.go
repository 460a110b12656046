package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// waveResult is one wave: P pods created as fast as the client allows (or at a
// steady rate), each timed from its create call to the moment the watch shows it
// bound to a node.
type waveResult struct {
	Pods        int     `json:"pods"`
	Bound       int     `json:"bound"`
	Seconds     float64 `json:"seconds"`    // first create to last bind
	PodsPerSec  float64 `json:"podsPerSec"` // bound / seconds
	P50Ms       float64 `json:"p50Ms"`      // creation to bound
	P99Ms       float64 `json:"p99Ms"`
	Misaligned  int     `json:"misaligned"`  // bound where the node had no single NUMA zone with room (legacy: the kubelet would refuse it)
	TimedOutPod int     `json:"unscheduled"` // not bound when the wave gave up
	// Cost is what every process spent from before the first create to after
	// the last bind, Teardown what deleting the wave's pods and claims cost, and
	// BoundBy names what held the wave back (see boundBy).
	Cost     *cost  `json:"cost,omitempty"`
	Teardown *cost  `json:"teardown,omitempty"`
	BoundBy  string `json:"boundBy,omitempty"`
}

// podFactory makes pod i of a wave.
type podFactory func(i int) *corev1.Pod

const waveLabel = "topodra.dev/wave"

// runWave creates pods in ns and waits until each is bound, or until nothing has
// been bound for `stall`. rate > 0 creates them at that many pods a second,
// steadily, instead of as fast as the client allows.
func runWave(ctx context.Context, cs kubernetes.Interface, ns, wave string, pods int, newPod podFactory, stall time.Duration, rate float64) (waveResult, []*corev1.Pod, error) {
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: waveLabel + "=" + wave})
	if err != nil {
		return waveResult{}, nil, err
	}
	defer func() { w.Stop() }()

	var mu sync.Mutex
	created := map[string]time.Time{}
	bound := map[string]time.Time{}
	var boundPods []*corev1.Pod // in the order they were seen bound
	start := time.Now()
	createErr := make(chan error, 1)
	go func() {
		createErr <- parallel(pods, 16, func(i int) error {
			if rate > 0 {
				// parallel hands out i in order: each worker waits for its slot.
				time.Sleep(time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))))
			}
			p := newPod(i)
			p.Labels = map[string]string{waveLabel: wave}
			t := time.Now()
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				return err
			}
			mu.Lock()
			created[p.Name] = t
			mu.Unlock()
			return nil
		})
	}()

	lastProgress := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for len(bound) < pods {
		select {
		case err := <-createErr:
			if err != nil {
				return waveResult{}, nil, fmt.Errorf("creating pods: %w", err)
			}
			createErr = nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The server ended the watch: catch up from a list (binds seen
				// now are timed now) and watch on from there.
				l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: waveLabel + "=" + wave})
				if err != nil {
					return waveResult{}, nil, err
				}
				for i := range l.Items {
					p := &l.Items[i]
					if _, seen := bound[p.Name]; p.Spec.NodeName != "" && !seen {
						bound[p.Name] = time.Now()
						boundPods = append(boundPods, p)
						lastProgress = time.Now()
					}
				}
				if w, err = cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: waveLabel + "=" + wave, ResourceVersion: l.ResourceVersion}); err != nil {
					return waveResult{}, nil, err
				}
				continue
			}
			if ev.Type == watch.Error {
				return waveResult{}, nil, fmt.Errorf("pod watch: %v", ev.Object)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || p.Spec.NodeName == "" {
				continue
			}
			if _, seen := bound[p.Name]; !seen {
				bound[p.Name] = time.Now()
				boundPods = append(boundPods, p)
				lastProgress = time.Now()
			}
		case <-tick.C:
			if time.Since(lastProgress) > stall {
				goto done
			}
		case <-ctx.Done():
			return waveResult{}, nil, ctx.Err()
		}
	}
done:
	mu.Lock()
	defer mu.Unlock()
	times := make([]podTimes, 0, len(created))
	for name, c := range created {
		times = append(times, podTimes{created: c, bound: bound[name]})
	}
	r := waveResult{Pods: pods, Bound: len(bound), TimedOutPod: pods - len(bound)}
	r.timed(start, time.Now(), times)
	return r, boundPods, nil
}

// podTimes is when one pod of a wave was created and bound (zero: never).
type podTimes struct{ created, bound time.Time }

// timed fills a wave's duration, rate and latency percentiles. A pod never
// bound enters the percentiles with the time from its create to when the wave
// gave up, a lower bound of its latency: leaving it out would credit the stack
// that did not place it (a wave that bound nothing would show 0 ms). A wave
// that gave up is timed to when it did, so its rate counts the silence it
// ended on; a complete one to its last bind.
func (r *waveResult) timed(start, gaveUp time.Time, pods []podTimes) {
	var lat []float64
	var last time.Time
	for _, p := range pods {
		if p.created.IsZero() {
			continue
		}
		end := p.bound
		if end.IsZero() {
			end = gaveUp
		} else if end.After(last) {
			last = end
		}
		lat = append(lat, float64(end.Sub(p.created).Microseconds())/1000)
	}
	sort.Float64s(lat)
	end := last
	if r.TimedOutPod > 0 {
		end = gaveUp
	}
	if r.Bound > 0 || r.TimedOutPod > 0 {
		r.Seconds = end.Sub(start).Seconds()
	}
	if r.Seconds > 0 {
		r.PodsPerSec = float64(r.Bound) / r.Seconds
	}
	r.P50Ms = percentile(lat, 0.50)
	r.P99Ms = percentile(lat, 0.99)
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

// clearWave deletes a wave's pods at once and waits for them and their generated
// claims to be gone, so the next wave starts on an empty fleet.
func clearWave(ctx context.Context, cs kubernetes.Interface, ns, wave string) error {
	sel := metav1.ListOptions{LabelSelector: waveLabel + "=" + wave}
	// A busy API server can spend its request timeout (60 s) on a collection of
	// thousands of pods, as a 2,000-node run's first teardown did (504, then the
	// connection's stream reset): what it deleted stays deleted, so ask again for
	// the rest, as the namespace controller does.
	for attempt := 1; ; attempt++ {
		err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, sel)
		if err == nil {
			break
		}
		if attempt == 5 || ctx.Err() != nil {
			return err
		}
		progress("wave %s: deleting its pods, attempt %d: %v; again", wave, attempt, err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.LabelSelector, Limit: 1})
		if err != nil {
			return err
		}
		claims, err := cs.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return err
		}
		if len(pods.Items) == 0 && len(claims.Items) == 0 {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("wave %s: pods or claims still there after 5 minutes", wave)
}

// claimTemplate asks for k GPUs, aligned on attribute when it is not empty.
func claimTemplate(ns, name string, k int, attribute string) *resourcev1.ResourceClaimTemplate {
	return classTemplate(ns, name, driverName, k, attribute)
}

// classTemplate asks for k devices of the DeviceClass `class`.
func classTemplate(ns, name, class string, k int, attribute string) *resourcev1.ResourceClaimTemplate {
	t := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: int64(k),
			}}},
		}}},
	}
	if attribute != "" {
		t.Spec.Spec.Devices.Constraints = []resourcev1.DeviceConstraint{{
			Requests: []string{"gpus"}, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(attribute)),
		}}
	}
	return t
}

func ensureTemplate(ctx context.Context, cs kubernetes.Interface, t *resourcev1.ResourceClaimTemplate) error {
	_, err := cs.ResourceV1().ResourceClaimTemplates(t.Namespace).Create(ctx, t, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// draPod uses a claim from the template.
func draPod(ns, wave, template string) podFactory {
	return func(i int) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%04d", wave, i)},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(template)}},
				Containers: []corev1.Container{{Name: "main", Image: "busybox",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			},
		}
	}
}

// legacyPod asks the topology-aware scheduler for k nvidia.com/gpu.
func legacyPod(ns, wave, scheduler string, k int) podFactory {
	q := *resource.NewQuantity(int64(k), resource.DecimalSI)
	return func(i int) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%04d", wave, i)},
			Spec: corev1.PodSpec{
				SchedulerName: scheduler,
				Containers: []corev1.Container{{Name: "main", Image: "busybox",
					Resources: corev1.ResourceRequirements{
						Limits:   corev1.ResourceList{"nvidia.com/gpu": q},
						Requests: corev1.ResourceList{"nvidia.com/gpu": q},
					}}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			},
		}
	}
}

// median of the waves' figure.
func median(rs []waveResult, f func(waveResult) float64) float64 {
	v := make([]float64, 0, len(rs))
	for _, r := range rs {
		v = append(v, f(r))
	}
	return medianOf(v)
}

func medianOf(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
