//! `kubectl topodra explain`: why a pod waits for GPUs, in the words of the Event the
//! controller records, then where each of its demands could go.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use topodra_controller::classes::OurClasses;
use topodra_controller::pending::{self, EVENT_REASON, Source};
use topodra_driver::capacity::{Cluster, Demand, Explanation};

use crate::table::Table;
use crate::terminal::escape;

/// How many candidate nodes a demand lists before "and N more".
const LISTED: usize = 10;

/// The pod name of `pod/NAME`, `pods/NAME`, `po/NAME` or `NAME`.
pub(crate) fn pod_name(arg: &str) -> Result<&str, String> {
    let name = match arg.split_once('/') {
        None => arg,
        Some((kind, name))
            if ["pod", "pods", "po"].contains(&kind.to_ascii_lowercase().as_str()) =>
        {
            name
        }
        Some((kind, _)) => return Err(format!("only pods can be explained, not {kind:?}")),
    };
    if name.is_empty() {
        return Err(format!("no pod name in {arg:?}"));
    }
    Ok(name)
}

/// What became of one of the pod's claims.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ClaimState {
    /// Not allocated, and asks for GPUs of ours: one of the verdict's demands.
    Waiting,
    Allocated,
    NotOurs,
    NotFound,
    /// From a template, and the claim has not been generated yet.
    NotCreated,
    /// From a template that needed no claim.
    NotNeeded,
}

impl ClaimState {
    fn describe(&self, driver: &str) -> String {
        match self {
            ClaimState::Waiting => "waiting for GPUs".to_owned(),
            ClaimState::Allocated => "allocated".to_owned(),
            ClaimState::NotOurs => format!("asks for no device class of {driver}"),
            ClaimState::NotFound => "not found".to_owned(),
            ClaimState::NotCreated => "not created yet".to_owned(),
            ClaimState::NotNeeded => "not needed".to_owned(),
        }
    }
}

/// Each claim of the pod, by the name it is known by, and what became of it.
fn claim_states(
    pod: &Pod,
    claims: &BTreeMap<String, ResourceClaim>,
    classes: &OurClasses,
    driver: &str,
) -> Vec<(String, ClaimState)> {
    let statuses: BTreeMap<&str, Option<&str>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.resource_claim_name.as_deref()))
        .collect();
    let entries = pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    let mut out = Vec::new();
    for c in entries.into_iter().flatten() {
        let name = match (&c.resource_claim_name, statuses.get(c.name.as_str())) {
            (Some(n), _) => n.clone(),
            (None, Some(Some(n))) => (*n).to_owned(),
            (None, Some(None)) => {
                out.push((c.name.clone(), ClaimState::NotNeeded));
                continue;
            }
            (None, None) => {
                let label = match &c.resource_claim_template_name {
                    Some(t) => format!("{} (from template {t})", c.name),
                    None => c.name.clone(),
                };
                out.push((label, ClaimState::NotCreated));
                continue;
            }
        };
        let state = match claims.get(&name) {
            None => ClaimState::NotFound,
            Some(claim)
                if claim
                    .status
                    .as_ref()
                    .is_some_and(|s| s.allocation.is_some()) =>
            {
                ClaimState::Allocated
            }
            Some(claim) => {
                let ours = claim
                    .spec
                    .as_ref()
                    .and_then(|s| Demand::of_claim(s, driver, |class| classes.contains(class)));
                if ours.is_some() {
                    ClaimState::Waiting
                } else {
                    ClaimState::NotOurs
                }
            }
        };
        out.push((name, state));
    }
    out
}

/// What the scheduler says about the pod, when it has said something.
fn scheduling(pod: &Pod) -> String {
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let with_message = |what: &str| match condition.and_then(|c| c.message.as_deref()) {
        Some(m) if !m.is_empty() => format!("{what}: {m}"),
        _ => what.to_owned(),
    };
    if pending::is_unschedulable(pod) {
        with_message("unschedulable")
    } else if let Some(reason) = condition.and_then(|c| c.reason.as_deref()) {
        with_message(reason)
    } else {
        "not tried by the scheduler yet".to_owned()
    }
}

/// One `Label: value` line; the value comes from API objects, so it is escaped.
fn field(out: &mut String, label: &str, value: &str) {
    out.push_str(&format!("{:<12} {}\n", format!("{label}:"), escape(value)));
}

fn pod_id(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The whole answer for a pod bound to a node, which waits for nothing; `None` for a
/// pod not bound yet.
pub(crate) fn scheduled(pod: &Pod) -> Option<String> {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    node.filter(|n| !n.is_empty()).map(|node| {
        format!(
            "Pod {} is scheduled on node {}: it waits for no GPU.\n",
            escape(&pod_id(pod)),
            escape(node)
        )
    })
}

/// The whole answer for one pod; `claims` are the ResourceClaims of the pod's
/// namespace by name.
pub(crate) fn explain_pod(
    cluster: &Cluster,
    cpus: &pending::CpuSide<'_>,
    pod: &Pod,
    claims: &BTreeMap<String, ResourceClaim>,
    classes: &OurClasses,
) -> String {
    let driver = cluster.driver();
    let id = pod_id(pod);
    if let Some(text) = scheduled(pod) {
        return text;
    }
    let states = claim_states(pod, claims, classes, driver);
    let verdict = pending::verdict(cluster, cpus, pod, |n| claims.get(n).cloned(), classes);
    let mut out = String::new();
    let others: Vec<&(String, ClaimState)> = states
        .iter()
        .filter(|(_, s)| *s != ClaimState::Waiting)
        .collect();
    let Some(verdict) = verdict else {
        let unknown = states
            .iter()
            .any(|(_, s)| matches!(s, ClaimState::NotCreated | ClaimState::NotFound));
        let yet = if unknown {
            " that can be judged yet"
        } else {
            ""
        };
        out.push_str(&format!(
            "Pod {} waits for no GPU of {}{yet}.\n",
            escape(&id),
            escape(driver)
        ));
        field(&mut out, "Scheduling", &scheduling(pod));
        if others.is_empty() {
            out.push_str("It has no resource claims, and asks for no extended resource of our device classes.\n");
        } else {
            out.push_str(&other_claims("Claims", &others, driver));
        }
        return out;
    };
    field(&mut out, "Pod", &id);
    field(&mut out, "Scheduling", &scheduling(pod));
    field(&mut out, "Reason", EVENT_REASON);
    field(&mut out, "Message", &verdict.message);
    for (source, demand, explanation) in &verdict.parts {
        out.push('\n');
        let title = match source {
            Source::Claim(name) => format!("Claim {name}"),
            Source::ExtendedResource(r) => format!("Extended resource {r}"),
        };
        out.push_str(&format!("{}: {}\n", escape(&title), demand.describe()));
        out.push_str(&candidates(demand, explanation));
    }
    if !others.is_empty() {
        out.push('\n');
        out.push_str(&other_claims("Other claims", &others, driver));
    }
    out
}

fn other_claims(title: &str, states: &[&(String, ClaimState)], driver: &str) -> String {
    let mut t = Table::new(["CLAIM", "STATE"]);
    for (name, state) in states {
        t.row([name.clone(), state.describe(driver)]);
    }
    let mut out = format!("{title}:\n");
    for line in t.render().lines() {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

/// Where one demand fits now, or the nearest thing to it.
fn candidates(demand: &Demand, e: &Explanation) -> String {
    let mut out = String::new();
    let cpus = demand.cpus.is_some();
    if e.fits.is_empty() {
        out.push_str("  Fits now on no node.\n");
        match (&e.best, demand.level) {
            (Some(b), _) if cpus => out.push_str(&format!(
                "  Nearest: {}, {}: {} free GPUs, {} free CPUs\n",
                escape(&b.node),
                escape(b.group.as_deref().unwrap_or_default()),
                b.free,
                b.free_cpus.unwrap_or(0)
            )),
            (Some(b), Some(_)) => out.push_str(&format!(
                "  Largest aligned free set: {} ({}, {})\n",
                b.free,
                escape(&b.node),
                escape(b.group.as_deref().unwrap_or_default())
            )),
            (Some(b), None) => {
                out.push_str(&format!("  Most free: {} ({})\n", b.free, escape(&b.node)))
            }
            (None, _) => out.push_str("  No GPU is free.\n"),
        }
        if demand.level.is_some() {
            let gpus = if demand.count == 1 { "GPU" } else { "GPUs" };
            out.push_str(&format!(
                "  Nodes with {} free {gpus}, aligned or not: {}\n",
                demand.count, e.nodes_with_enough_free
            ));
        }
    } else {
        let n = e.fits.len();
        out.push_str(&format!(
            "  Fits now on {n} node{}:\n",
            if n == 1 { "" } else { "s" }
        ));
        let mut t = match demand.level {
            _ if cpus => Table::new(["NODE", "GROUP", "FREE", "FREE CPUS"]),
            Some(_) => Table::new(["NODE", "GROUP", "FREE"]),
            None => Table::new(["NODE", "FREE"]),
        };
        for c in e.fits.iter().take(LISTED) {
            let mut row = vec![c.node.clone()];
            row.extend(c.group.clone());
            row.push(c.free.to_string());
            row.extend(c.free_cpus.filter(|_| cpus).map(|n| n.to_string()));
            t.row(row);
        }
        for line in t.render().lines() {
            out.push_str(&format!("    {line}\n"));
        }
        if n > LISTED {
            out.push_str(&format!("    ... and {} more\n", n - LISTED));
        }
    }
    if !demand.unjudged.is_empty() {
        out.push_str(&format!(
            "  Not checked: {}\n",
            escape(&demand.unjudged.join(", "))
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fixtures::{DRIVER, pending_claim, two_dgx};

    fn classes() -> OurClasses {
        OurClasses::from_classes([], DRIVER, &[DRIVER.to_owned()])
    }

    fn pod(name: &str, claims: serde_json::Value, statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main"}], "resourceClaims": claims},
            "status": {
                "conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 cannot allocate all claims."
                }],
                "resourceClaimStatuses": statuses,
            },
        }))
        .unwrap()
    }

    fn nic_claim(name: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {
                "deviceClassName": "rdma.example.com"}}]}},
        }))
        .unwrap()
    }

    fn by_name(claims: &[ResourceClaim]) -> BTreeMap<String, ResourceClaim> {
        claims
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), c.clone()))
            .collect()
    }

    #[test]
    fn pod_arguments() {
        assert_eq!(pod_name("pod/a"), Ok("a"));
        assert_eq!(pod_name("pods/a"), Ok("a"));
        assert_eq!(pod_name("a"), Ok("a"));
        assert!(pod_name("deploy/a").is_err());
        assert!(pod_name("pod/").is_err());
    }

    #[test]
    fn a_claim_that_fits_nowhere_gets_the_events_message() {
        let p = pod(
            "train-0",
            json!([{"name": "gpus", "resourceClaimTemplateName": "four-gpus-one-numa-node"},
                   {"name": "nic", "resourceClaimTemplateName": "rdma-nic"}]),
            json!([{"name": "gpus", "resourceClaimName": "train-0-gpus-x7k2p"},
                   {"name": "nic", "resourceClaimName": "train-0-nic-5rq8d"}]),
        );
        let claims = by_name(&[
            pending_claim("train-0-gpus-x7k2p", 4),
            nic_claim("train-0-nic-5rq8d"),
        ]);
        let cluster = two_dgx();
        let text = explain_pod(&cluster, &pending::CpuSide::none(), &p, &claims, &classes());
        let v = pending::verdict(
            &cluster,
            &pending::CpuSide::none(),
            &p,
            |n| claims.get(n).cloned(),
            &classes(),
        )
        .unwrap();
        assert!(
            text.contains(&format!("Message:     {}\n", v.message)),
            "{text}"
        );
        assert_eq!(
            text,
            "\
Pod:         default/train-0
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Reason:      WaitingForGPUs
Message:     needs 4 GPUs on one NUMA node; 1 node has 4 free GPUs, none on one NUMA node; \
largest aligned free set: 3 (dgx-h100-b, NUMA 1); 1 GPU unhealthy or tainted

Claim train-0-gpus-x7k2p: 4 GPUs on one NUMA node
  Fits now on no node.
  Largest aligned free set: 3 (dgx-h100-b, NUMA 1)
  Nodes with 4 free GPUs, aligned or not: 1

Other claims:
  CLAIM               STATE
  train-0-nic-5rq8d   asks for no device class of gpu.topodra.dev
"
        );
    }

    #[test]
    fn a_claim_that_fits_lists_its_candidates() {
        let p = pod(
            "train-1",
            json!([{"name": "gpus", "resourceClaimTemplateName": "two-gpus-one-numa-node"}]),
            json!([{"name": "gpus", "resourceClaimName": "train-1-gpus-b6w4n"}]),
        );
        let claims = by_name(&[pending_claim("train-1-gpus-b6w4n", 2)]);
        assert_eq!(
            explain_pod(
                &two_dgx(),
                &pending::CpuSide::none(),
                &p,
                &claims,
                &classes()
            ),
            "\
Pod:         default/train-1
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Reason:      WaitingForGPUs
Message:     needs 2 GPUs on one NUMA node; fits now on 2 nodes (dgx-h100-b, NUMA 1; \
dgx-h100-a, NUMA 1): the scheduler has not retried yet, or something else keeps the pod off \
them (node selector or affinity, node taints, device selectors, its other claims); 1 GPU \
unhealthy or tainted

Claim train-1-gpus-b6w4n: 2 GPUs on one NUMA node
  Fits now on 2 nodes:
    NODE         GROUP    FREE
    dgx-h100-b   NUMA 1   3
    dgx-h100-a   NUMA 1   2
"
        );
    }

    #[test]
    fn pods_that_wait_for_no_gpu_say_so() {
        let mut p = pod(
            "eval-3",
            json!([{"name": "gpus", "resourceClaimTemplateName": "four-gpus-one-numa-node"},
                   {"name": "shared", "resourceClaimName": "infer-b"},
                   {"name": "gone", "resourceClaimName": "deleted"}]),
            json!([]),
        );
        let claims = by_name(&[crate::fixtures::allocated_claim(
            "infer-b",
            "dgx-h100-b",
            &["gpu-0"],
        )]);
        assert_eq!(
            explain_pod(
                &two_dgx(),
                &pending::CpuSide::none(),
                &p,
                &claims,
                &classes()
            ),
            "\
Pod default/eval-3 waits for no GPU of gpu.topodra.dev that can be judged yet.
Scheduling:  unschedulable: 0/2 nodes are available: 2 cannot allocate all claims.
Claims:
  CLAIM                                          STATE
  gpus (from template four-gpus-one-numa-node)   not created yet
  infer-b                                        allocated
  deleted                                        not found
"
        );
        p.spec.as_mut().unwrap().node_name = Some("dgx-h100-b".to_owned());
        assert_eq!(
            explain_pod(
                &two_dgx(),
                &pending::CpuSide::none(),
                &p,
                &claims,
                &classes()
            ),
            "Pod default/eval-3 is scheduled on node dgx-h100-b: it waits for no GPU.\n"
        );
    }

    #[test]
    fn values_from_objects_cannot_forge_lines() {
        let mut p = pod(
            "p",
            json!([{"name": "gpus", "resourceClaimName": "c"},
                   {"name": "x", "resourceClaimName": "nic\nforged   allocated"}]),
            json!([]),
        );
        let status = p.status.as_mut().unwrap();
        status.conditions.as_mut().unwrap()[0].message =
            Some("busy\nReason:      Forged\u{1b}[31m".to_owned());
        let claims = by_name(&[pending_claim("c", 4), nic_claim("nic\nforged   allocated")]);
        let text = explain_pod(
            &two_dgx(),
            &pending::CpuSide::none(),
            &p,
            &claims,
            &classes(),
        );
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            text.contains("Scheduling:  unschedulable: busy\\nReason:      Forged\\u{1b}[31m\n"),
            "{text}"
        );
        assert!(
            text.contains("  nic\\nforged   allocated   asks for"),
            "{text}"
        );
        assert_eq!(text.lines().filter(|l| l.starts_with("Reason:")).count(), 1);

        p.spec.as_mut().unwrap().node_name = Some("n\r\u{1b}[1A".to_owned());
        assert_eq!(
            scheduled(&p).unwrap(),
            "Pod default/p is scheduled on node n\\r\\u{1b}[1A: it waits for no GPU.\n"
        );
    }
}

#[cfg(test)]
mod mixed_tests {
    use serde_json::json;
    use topodra_driver::capacity::CpuPools;

    use super::*;
    use crate::fixtures::{DRIVER, two_dgx};

    const ALIAS: &str = "dra.net/numaNode";

    /// The CPU driver's grouped slice on `node`: 112 CPUs on each NUMA node.
    fn cpu_slice(node: &str) -> k8s_openapi::api::resource::v1::ResourceSlice {
        let devices: Vec<_> = (0..2)
            .map(|i| {
                json!({"name": format!("cpudevnuma{i:03}"), "attributes": {ALIAS: {"int": i}},
                       "capacity": {"dra.cpu/cpu": {"value": "112"}}, "allowMultipleAllocations": true})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-dra.cpu")},
            "spec": {"driver": "dra.cpu", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_of_gpus_and_cpus_is_explained_in_both() {
        let names = vec![NUMA_NODE_NAME.to_owned(), ALIAS.to_owned()];
        let mut pools = CpuPools::new("dra.cpu", names.clone());
        for n in ["dgx-h100-a", "dgx-h100-b"] {
            pools.apply_slice(&cpu_slice(n));
        }
        let cpu_classes = OurClasses::from_classes([], "dra.cpu", &["dra.cpu".to_owned()]);
        let cpus = pending::CpuSide {
            pools: &pools,
            classes: &cpu_classes,
            numa_names: &names,
        };
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "train-2-devices", "namespace": "default"},
            "spec": {"devices": {
                "requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}},
                    {"name": "cpus", "exactly": {"deviceClassName": "dra.cpu",
                        "capacity": {"requests": {"dra.cpu/cpu": "32"}}}}],
                "constraints": [{"matchAttribute": ALIAS}]}},
        }))
        .unwrap();
        let claims = BTreeMap::from([("train-2-devices".to_owned(), claim)]);
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "train-2", "namespace": "default"},
            "spec": {"containers": [{"name": "main"}],
                     "resourceClaims": [{"name": "devices", "resourceClaimName": "train-2-devices"}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        }))
        .unwrap();
        let ours = OurClasses::from_classes([], DRIVER, &[DRIVER.to_owned()]);
        let text = explain_pod(&two_dgx(), &cpus, &p, &claims, &ours);
        for want in [
            "Message:     needs 4 GPUs and 32 CPUs on one NUMA node; no NUMA node has 4 free GPUs \
             and 32 free CPUs; dgx-h100-b NUMA 1 has 3 GPUs and 112 CPUs free; dgx-h100-a NUMA 1 \
             has 2 GPUs and 112 CPUs free",
            "Claim train-2-devices: 4 GPUs and 32 CPUs on one NUMA node",
            "  Nearest: dgx-h100-b, NUMA 1: 3 free GPUs, 112 free CPUs",
        ] {
            assert!(text.contains(want), "{want}\n---\n{text}");
        }
    }

    const NUMA_NODE_NAME: &str = topodra_driver::slice::attributes::NUMA_NODE;
}
