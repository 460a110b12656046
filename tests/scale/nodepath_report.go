package main

import (
	"fmt"
	"sort"
	"strings"
)

// The clients of the node path in the audit log (client()): the kubelet
// stand-in, topodra's plugins, and topodra's controller beside them.
const (
	kubeletClient    = "kubelet"
	pluginClient     = "topodra-kubelet-plugin"
	controllerClient = "topodra-controller"
)

// nodePathFigures is the node path over the common waves (-node-path): the
// plugins' start, what the kubelet stand-in saw pod by pod, and (derived from
// the audit counts of the stack) the requests it and the plugins cost.
type nodePathFigures struct {
	// Nodes ran a plugin each; StartSeconds is from their start until every
	// slice of the fleet was published, Startup the plugins' requests in it.
	Nodes        int            `json:"nodes"`
	StartSeconds float64        `json:"startSeconds"`
	Startup      map[string]int `json:"startupRequests,omitempty"`
	// WavesSeconds is the window of the common waves that requestsByClient
	// covers: the divisor of the per node-hour figures.
	WavesSeconds float64 `json:"wavesSeconds"`
	// Pods were bound to these nodes; Prepared and Unprepared went through
	// without an error; Claims, Devices and CDIDevices are what the plugins
	// prepared and sent back, Allocated the devices the claims were allocated.
	Pods       int `json:"pods"`
	Prepared   int `json:"prepared"`
	Unprepared int `json:"unprepared"`
	Claims     int `json:"claims"`
	Devices    int `json:"devices"`
	Allocated  int `json:"allocatedDevices"`
	CDIDevices int `json:"cdiDevices"`
	// OtherDriverClaims were allocated by another driver, whose plugin no node
	// here runs: left out of the calls.
	OtherDriverClaims int `json:"otherDriverClaims,omitempty"`
	// PrepareErrors and UnprepareErrors are failed calls (or claim reads) of
	// pods not being deleted; CutShort pods were deleted before their prepare
	// was through (it failed, or stopped short of the plugin, as the kubelet
	// stops for a pod it tears down); Errors are the first messages. Every pod
	// there is prepared, a prepare error, cut short, or had no claim of ours.
	PrepareErrors   int `json:"prepareErrors"`
	UnprepareErrors int `json:"unprepareErrors"`
	CutShort        int `json:"cutShort"`
	// Unsettled is the most prepares and unprepares a wave's end, or the end
	// of its teardown, gave up waiting for (two minutes): more errors.
	Unsettled int      `json:"unsettled,omitempty"`
	Errors    []string `json:"errors,omitempty"`
	// Prepare is the kubelet's PrepareResources (the claim GETs and the
	// NodePrepareResources call), NodePrepare the call alone, Unprepare the
	// NodeUnprepareResources call (the kubelet reads nothing to unprepare).
	Prepare     latency `json:"prepare"`
	NodePrepare latency `json:"nodePrepare"`
	Unprepare   latency `json:"unprepare"`

	// Derived from the stack's audit counts (nodePathPerPod,
	// allPerPodEveryNodePath, topodraRequests), for readers of the JSON; the
	// report computes them again from the counts.
	RequestsPerPod                 map[string]float64 `json:"requestsPerNodePathPod,omitempty"`
	AllRequestsPerPodEveryNodePath float64            `json:"allRequestsPerPodEveryNodePath,omitempty"`
	TopodraRequests                []topodraRequest   `json:"topodraRequests,omitempty"`
}

// derive fills the derived fields of s.NodePath.
func (s *stackResult) deriveNodePath(fleetNodes int) {
	f := s.NodePath
	if f == nil {
		return
	}
	f.RequestsPerPod = s.nodePathPerPod()
	f.AllRequestsPerPodEveryNodePath, _ = s.allPerPodEveryNodePath()
	f.TopodraRequests = topodraRequests(s, fleetNodes)
}

// perPodCount sums a client's per-pod requests (requestKind).
func perPodCount(counts map[string]int) int {
	n := 0
	for k, v := range counts {
		if requestKind(k) == perPodRequest {
			n += v
		}
	}
	return n
}

// nodePathPerPod is the kubelet stand-in's and the plugins' per-pod requests
// over the common waves per pod bound to a node of the node path: what each
// pod's node path costs the API server. Nil without a node path or its pods.
func (s *stackResult) nodePathPerPod() map[string]float64 {
	if s.NodePath == nil || s.NodePath.Pods == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, c := range []string{kubeletClient, pluginClient} {
		out[c] = float64(perPodCount(s.RequestsByClient[c])) / float64(s.NodePath.Pods)
	}
	return out
}

// allPerPodEveryNodePath is every client's requests over the common waves per
// bound pod, with the node path counted for every pod rather than for those
// on its nodes alone: the kubelet's and the plugins' per-pod requests per
// bound pod are replaced by theirs per node-path pod. Their periodic requests
// stay as measured on the node path's nodes (the per node-hour figures say
// what a node adds).
func (s *stackResult) allPerPodEveryNodePath() (float64, bool) {
	if s.NodePath == nil || s.NodePath.Pods == 0 || s.PodsBound == 0 {
		return 0, false
	}
	sh, _ := s.requestShares() // per bound pod
	bound := float64(s.PodsBound)
	v := sh.all
	for c, perNodePathPod := range s.nodePathPerPod() {
		v += perNodePathPod - float64(perPodCount(s.RequestsByClient[c]))/bound
	}
	return v, true
}

// topodraRequest is one kind of request one of topodra's processes sent over
// the common waves: per pod (its per-pod requests) or per node-hour (Lease
// renewals and the other periodic ones).
type topodraRequest struct {
	Process     string  `json:"process"`
	Request     string  `json:"request"` // "verb resource"
	Kind        string  `json:"kind"`    // requestKind
	Count       int     `json:"count"`
	PerPod      float64 `json:"perPod,omitempty"`
	PerNodeHour float64 `json:"perNodeHour,omitempty"`
}

// topodraRequests is what topodra's own processes sent during the common waves.
// The controller's counts run from the waves' start until its paced writes
// settled (controllerUntilSettled), over the bound pods, and its periodic ones
// over the fleet's node-hours in that window (it is one process for the
// fleet); the plugins' over the pods bound to their nodes and over their own
// node-hours.
func topodraRequests(s *stackResult, fleetNodes int) []topodraRequest {
	f := s.NodePath
	if f == nil || f.WavesSeconds <= 0 {
		return nil
	}
	ctrl, ctrlSeconds := s.RequestsByClient[controllerClient], f.WavesSeconds
	if s.ControllerUntilSettled != nil {
		ctrl, ctrlSeconds = s.ControllerUntilSettled, f.WavesSeconds+max(0, s.ControllerSettleSeconds)
	}
	var out []topodraRequest
	for _, p := range []struct {
		name          string
		counts        map[string]int
		pods, nodes   int
		windowSeconds float64
	}{
		{controllerClient, ctrl, s.PodsBound, fleetNodes, ctrlSeconds},
		{pluginClient, s.RequestsByClient[pluginClient], f.Pods, f.Nodes, f.WavesSeconds},
	} {
		nodeHours := float64(p.nodes) * p.windowSeconds / 3600
		for _, k := range sortedKeys(p.counts) {
			r := topodraRequest{Process: p.name, Request: k, Kind: requestKind(k), Count: p.counts[k]}
			switch {
			case r.Kind == perPodRequest && p.pods > 0:
				r.PerPod = float64(r.Count) / float64(p.pods)
			case r.Kind != perPodRequest && nodeHours > 0:
				r.PerNodeHour = float64(r.Count) / nodeHours
			}
			out = append(out, r)
		}
	}
	kindOrder := map[string]int{perPodRequest: 0, leaseRequest: 1, periodicRequest: 2}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Process != out[j].Process {
			return out[i].Process > out[j].Process // the plugins first, then the controller
		}
		return kindOrder[out[i].Kind] < kindOrder[out[j].Kind]
	})
	return out
}

// nodePathSection is the report's section on the node path: every run's prepare
// latency and errors, then run 1's requests per pod by client and what
// topodra's processes sent.
func (r results) nodePathSection(b *strings.Builder) {
	f := r.DRA.NodePath
	if f == nil {
		return
	}
	fmt.Fprintf(b, "## The node path: %d of the %d nodes with a real plugin and a kubelet stand-in\n\n", f.Nodes, r.Nodes)
	b.WriteString("From the start of the DRA stack, each of these nodes ran a real topodra-kubelet-plugin (the simulated DGX H100, " +
		"its own state and CDI directories) publishing its own slices; the harness played their kubelets: plugin registration, " +
		"then for each pod bound there what the kubelet's DRA manager (v1.37) does before the pod's containers start, a GET of each " +
		"of its claims under the kubelet's user agent and NodePrepareResources over the plugin's socket, and once the pod is deleted " +
		"NodeUnprepareResources (the kubelet reads nothing from the API server to unprepare). The common waves only: the plugins " +
		"stop after them. Prepare is the kubelet's whole PrepareResources (claim GETs and the call). " + r.pluginCPUText() + "\n\n")
	b.WriteString("| run | pods there | prepared | unprepared | prepare p50 ms | prepare p99 ms | NodePrepareResources p50 ms | p99 ms | NodeUnprepareResources p50 ms | p99 ms | prepare errors | unprepare errors | cut short by deletion | not through in 2 min |\n" +
		"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, run := range r.runs() {
		g := run.DRA.NodePath
		if g == nil {
			continue
		}
		fmt.Fprintf(b, "| %d | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d | %d | %d | %d |\n", i+1, g.Pods, g.Prepared, g.Unprepared,
			g.Prepare.P50Ms, g.Prepare.P99Ms, g.NodePrepare.P50Ms, g.NodePrepare.P99Ms, g.Unprepare.P50Ms, g.Unprepare.P99Ms,
			g.PrepareErrors, g.UnprepareErrors, g.CutShort, g.Unsettled)
	}
	fmt.Fprintf(b, "\nRun 1: the plugins had every slice of the fleet published %.1f s after they started; they prepared %d claims, "+
		"sending back %d devices (%d allocated) with %d CDI device IDs.", f.StartSeconds, f.Claims, f.Devices, f.Allocated, f.CDIDevices)
	if f.OtherDriverClaims > 0 {
		fmt.Fprintf(b, " %d claims of another driver were left out (no node here runs its plugin).", f.OtherDriverClaims)
	}
	b.WriteString("\n")
	for _, e := range f.Errors {
		fmt.Fprintf(b, "\n- %s", e)
	}
	if len(f.Errors) > 0 {
		b.WriteString("\n")
	}

	s := &r.DRA
	if s.PodsBound > 0 {
		b.WriteString("\n### Requests per pod by client, common waves (run 1, audit log)\n\n" +
			"Every request in the window per bound pod; for the kubelet stand-in and the plugins also their per-pod requests " +
			"(Lease renewals and other periodic requests apart) per pod bound to a node of the node path.\n\n" +
			"| client | requests | per bound pod | per pod on a node-path node |\n|---|---|---|---|\n")
		perNP := s.nodePathPerPod()
		clients := sortedKeys(s.RequestsByClient)
		for _, c := range []string{kubeletClient, pluginClient} {
			if _, ok := s.RequestsByClient[c]; !ok {
				clients = append(clients, c)
			}
		}
		all := 0
		for _, c := range clients {
			n := 0
			for _, v := range s.RequestsByClient[c] {
				n += v
			}
			all += n
			np := "-"
			if v, ok := perNP[c]; ok {
				np = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprintf(b, "| %s | %d | %.2f | %s |\n", c, n, float64(n)/float64(s.PodsBound), np)
		}
		every := "-"
		if v, ok := s.allPerPodEveryNodePath(); ok {
			every = fmt.Sprintf("%.2f with every pod's node path counted", v)
		}
		fmt.Fprintf(b, "| all | %d | %.2f | %s |\n", all, float64(all)/float64(s.PodsBound), every)
	}

	if rows := topodraRequests(s, r.Nodes); len(rows) > 0 {
		fmt.Fprintf(b, "\n### What topodra's processes send, common waves (run 1, audit log)\n\n"+
			"The plugins' requests per pod bound to their nodes and per plugin-hour (a node-hour) over the %.0f s of the waves; "+
			"the controller's from the waves' start until its paced writes settled, per bound pod and per node-hour of the %d-node fleet "+
			"(it is one process for the fleet). Lease renewals and the other periodic requests are per node-hour, the rest per pod.\n\n"+
			"| process | request | kind | count | per pod | per node-hour |\n|---|---|---|---|---|---|\n", f.WavesSeconds, r.Nodes)
		for _, x := range rows {
			perPod, perHour := "-", "-"
			if x.Kind == perPodRequest {
				perPod = fmt.Sprintf("%.3f", x.PerPod)
			} else {
				perHour = fmt.Sprintf("%.1f", x.PerNodeHour)
			}
			fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %s |\n", x.Process, x.Request, x.Kind, x.Count, perPod, perHour)
		}
	}
	if len(f.Startup) > 0 {
		fmt.Fprintf(b, "\nThe %d plugins' start-up requests, until every slice was published: ", f.Nodes)
		var parts []string
		for _, k := range sortedKeys(f.Startup) {
			parts = append(parts, fmt.Sprintf("%s %d", k, f.Startup[k]))
		}
		b.WriteString(strings.Join(parts, ", ") + ".\n")
	}
	b.WriteString("\n")
}

// pluginCPUText says where the node path's plugins' CPU is: runs before the
// harness metered it have none.
func (r results) pluginCPUText() string {
	for _, run := range r.runs() {
		for _, k := range run.DRA.Kinds {
			for _, w := range k.Waves {
				if w.Cost == nil {
					continue
				}
				if _, ok := w.Cost.CPUSeconds[pluginClient]; ok {
					return "The plugins' CPU is metered, their processes summed, as " + pluginClient +
						" in each wave's cost (and the CPU table where both stacks ran), outside the control plane's total."
				}
			}
		}
	}
	return "The plugins' CPU is not metered in this run."
}
