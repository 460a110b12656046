//! Why a pod waits for GPUs: its claims' demands, judged against the capacity model.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use topodra_model::capacity::{
    ClassKind, Cluster, CpuDemand, CpuPools, Demand, Explanation, MigWant, ShareWant, explain_mixed,
};

use crate::classes::OurClasses;

/// The reason of the Event that explains a waiting pod.
pub const EVENT_REASON: &str = "WaitingForGPUs";

/// Whether the scheduler has tried the pod and found no place for it: not bound, and
/// its `PodScheduled` condition is False with reason `Unschedulable`.
pub fn is_unschedulable(pod: &Pod) -> bool {
    let bound = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.node_name.as_deref().is_some_and(|n| !n.is_empty()));
    !bound
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
}

/// The names of the ResourceClaim objects a pod uses: named directly, or generated
/// from a template (known once the pod's status says so).
pub fn claim_names(pod: &Pod) -> Vec<String> {
    let generated: BTreeMap<&str, &str> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| Some((s.name.as_str(), s.resource_claim_name.as_deref()?)))
        .collect();
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            c.resource_claim_name
                .clone()
                .or_else(|| generated.get(c.name.as_str()).map(|n| (*n).to_owned()))
        })
        .collect()
}

/// One thing a pod waits for: a claim, or extended resources that a class of ours
/// serves through DRA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Claim(String),
    ExtendedResource(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Claim(name) => write!(f, "claim {name}"),
            Source::ExtendedResource(r) => write!(f, "{r}"),
        }
    }
}

/// The CPU driver beside ours: its CPUs, its classes, and the attribute names that
/// align on the NUMA node (the standard one and the aliases our plugin publishes).
#[derive(Clone, Copy, Debug)]
pub struct CpuSide<'a> {
    pub pools: &'a CpuPools,
    pub classes: &'a OurClasses,
    pub numa_names: &'a [String],
}

impl CpuSide<'static> {
    /// No CPU driver: only the GPUs of a claim are judged.
    pub fn none() -> Self {
        static NONE: std::sync::LazyLock<(CpuPools, OurClasses)> = std::sync::LazyLock::new(|| {
            (
                CpuPools::new(String::new(), Vec::new()),
                OurClasses::default(),
            )
        });
        CpuSide {
            pools: &NONE.0,
            classes: &NONE.1,
            numa_names: &[],
        }
    }
}

impl CpuSide<'_> {
    /// The names besides the standard one.
    fn aliases(&self) -> Vec<String> {
        self.numa_names
            .iter()
            .filter(|n| *n != topodra_model::slice::attributes::NUMA_NODE)
            .cloned()
            .collect()
    }
}

/// The demands of a pod on our GPUs that are not allocated yet; a claim that couples
/// them with the CPU driver's CPUs on one NUMA node carries those too.
pub fn demands(
    pod: &Pod,
    claim: impl Fn(&str) -> Option<ResourceClaim>,
    classes: &OurClasses,
    driver: &str,
    cpus: &CpuSide<'_>,
) -> Vec<(Source, Demand)> {
    let aliases = cpus.aliases();
    let mut out = Vec::new();
    for name in claim_names(pod) {
        let Some(c) = claim(&name) else { continue };
        let allocated = c.status.as_ref().is_some_and(|s| s.allocation.is_some());
        if allocated {
            continue;
        }
        let Some(spec) = c.spec.as_ref() else {
            continue;
        };
        let ours = |class: &str| classes.kind(class);
        if let Some(mut d) = Demand::of_claim_classified(spec, driver, &aliases, ours) {
            d.cpus = CpuDemand::of_claim(spec, &d, cpus.pools, cpus.numa_names, |class| {
                cpus.classes.contains(class)
            });
            out.push((Source::Claim(name), d));
        }
    }
    let extended_claimed = pod
        .status
        .as_ref()
        .is_some_and(|s| s.extended_resource_claim_status.is_some());
    if !extended_claimed {
        for (resource, count) in extended_requests(pod, classes) {
            let mut demand = Demand {
                count,
                level: None,
                requests: Vec::new(),
                unjudged: Vec::new(),
                cpus: None,
                mig: Vec::new(),
                shares: Vec::new(),
            };
            match classes.extended_kind(&resource) {
                Some(ClassKind::Mig {
                    profile: Some(profile),
                }) => {
                    demand.count = 0;
                    demand.mig.push(MigWant {
                        profile: profile.clone(),
                        count,
                    });
                }
                Some(ClassKind::Mig { profile: None }) => {
                    demand.count = 0;
                    demand
                        .unjudged
                        .push(format!("{resource} asks for MIG devices of any profile"));
                }
                // `nvidia.com/gpu.shared: 2`: two shares of the default size.
                Some(ClassKind::Shared { sharing }) => {
                    demand.count = 0;
                    demand.shares.push(ShareWant {
                        sharing: sharing.clone(),
                        count,
                        capacity: BTreeMap::new(),
                    });
                }
                _ => {}
            }
            out.push((Source::ExtendedResource(resource), demand));
        }
    }
    out
}

/// Extended resources of ours the pod asks for, as the scheduler counts them: the sum
/// over its containers, or the largest init container if that is more.
fn extended_requests(pod: &Pod, classes: &OurClasses) -> BTreeMap<String, u32> {
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeMap::new();
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, u32> {
        let res = c.resources.as_ref();
        let amounts = res
            .and_then(|r| r.limits.as_ref())
            .into_iter()
            .chain(res.and_then(|r| r.requests.as_ref()));
        let mut m = BTreeMap::new();
        for map in amounts {
            for (name, q) in map {
                if let Some(n) = whole(q).filter(|_| classes.serves_extended(name)) {
                    m.insert(name.clone(), n);
                }
            }
        }
        m
    };
    let mut sum: BTreeMap<String, u32> = BTreeMap::new();
    for c in &spec.containers {
        for (k, v) in of(c) {
            let e = sum.entry(k).or_default();
            // Saturating: two containers may each ask for up to u32::MAX.
            *e = e.saturating_add(v);
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in of(c) {
            let e = sum.entry(k).or_default();
            *e = (*e).max(v);
        }
    }
    sum.retain(|_, v| *v > 0);
    sum
}

/// Extended resources are whole numbers.
fn whole(q: &Quantity) -> Option<u32> {
    q.0.trim().parse().ok()
}

/// A pod's demands and the model's answer for each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub parts: Vec<(Source, Demand, Explanation)>,
    /// What the Event says: one part per demand, "claim NAME: ..." when there are
    /// several, the explanation alone when there is one claim.
    pub message: String,
}

/// The verdict for a pod that waits on our GPUs; `None` when it waits for none.
pub fn verdict(
    cluster: &Cluster,
    cpus: &CpuSide<'_>,
    pod: &Pod,
    claim: impl Fn(&str) -> Option<ResourceClaim>,
    classes: &OurClasses,
) -> Option<Verdict> {
    let demands = demands(pod, claim, classes, cluster.driver(), cpus);
    if demands.is_empty() {
        return None;
    }
    let parts: Vec<(Source, Demand, Explanation)> = demands
        .into_iter()
        .map(|(source, demand)| {
            let e = explain_mixed(cluster, cpus.pools, &demand);
            (source, demand, e)
        })
        .collect();
    let message = match parts.as_slice() {
        [(Source::Claim(_), _, e)] => e.message.clone(),
        _ => parts
            .iter()
            .map(|(s, _, e)| format!("{s}: {}", e.message))
            .collect::<Vec<_>>()
            .join(" | "),
    };
    Some(Verdict {
        parts,
        message: limit(message),
    })
}

/// The API server refuses Event messages over 1 KiB (events.k8s.io/v1 `note`).
const MAX_MESSAGE: usize = 1024;

fn limit(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE.saturating_sub(3);
        while !message.is_char_boundary(cut) {
            cut = cut.saturating_sub(1);
        }
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

#[cfg(test)]
mod tests;
