//! Claims that couple our GPUs with CPUs of the CPU driver on one NUMA node, and why
//! such a claim cannot be allocated: "needs 4 GPUs and 32 CPUs on one NUMA node;
//! node-a NUMA 1 has 4 GPUs and 12 CPUs free".

use k8s_openapi::api::resource::v1::ResourceClaimSpec;

use super::cpus::{CpuCounts, CpuPools, whole};
use super::explain::{Candidate, Explanation, plural, push_caveats};
use super::{Cluster, Demand, Level};

/// What a claim asks of the CPU driver, coupled to its GPUs by one NUMA constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuDemand {
    /// CPUs: the `<driver>/cpu` capacity requested (grouped devices), or the device
    /// count of requests without one (one device per CPU).
    pub count: u64,
    /// A request without a capacity request: on grouped devices it takes the whole
    /// device (KEP-5075: no requestPolicy, so the full capacity), all the CPUs of
    /// one NUMA node.
    pub whole: bool,
    pub requests: Vec<String>,
}

impl CpuDemand {
    /// Whether CPUs `c` of one NUMA node can take this demand.
    fn fits(&self, c: &CpuCounts) -> bool {
        if self.whole && c.grouped {
            c.total > 0 && c.allocated == 0
        } else {
            c.free() >= self.count
        }
    }

    /// "32 free CPUs", "all its CPUs free", for "no NUMA node has ...".
    fn wanted_free(&self) -> String {
        if self.whole {
            return "all its CPUs free".to_owned();
        }
        format!("{} free CPU{}", self.count, plural_u64(self.count))
    }
}

fn plural_u64(n: u64) -> &'static str {
    plural(usize::try_from(n).unwrap_or(usize::MAX))
}

impl CpuDemand {
    /// The CPU part of a claim whose GPU part is `gpus`, when one of its constraints
    /// puts a GPU request and a CPU request on one NUMA node: `matchAttribute` on one
    /// of `numa_names` (the standard name and its aliases) over requests that
    /// include both, or over all requests. `is_cpu_class` says which device classes
    /// are the CPU driver's.
    pub fn of_claim(
        spec: &ResourceClaimSpec,
        gpus: &Demand,
        pools: &CpuPools,
        numa_names: &[String],
        is_cpu_class: impl Fn(&str) -> bool,
    ) -> Option<Self> {
        let devices = spec.devices.as_ref()?;
        let mut demand = CpuDemand {
            count: 0,
            whole: false,
            requests: Vec::new(),
        };
        for req in devices.requests.as_deref().unwrap_or_default() {
            // firstAvailable alternatives and `All` are not judged: the GPU side
            // already says what it leaves out, and the CPU figure stays a floor.
            let Some(e) = req
                .exactly
                .as_ref()
                .filter(|e| is_cpu_class(&e.device_class_name))
            else {
                continue;
            };
            if e.allocation_mode.as_deref() == Some("All") {
                continue;
            }
            let requested = e
                .capacity
                .as_ref()
                .and_then(|c| c.requests.as_ref())
                .and_then(|r| r.get(pools.capacity_name()))
                .and_then(whole);
            let devices = u64::try_from(e.count.unwrap_or(1)).unwrap_or(0);
            demand.whole |= requested.is_none();
            demand.count = demand
                .count
                .saturating_add(requested.map_or(devices, |per| per.saturating_mul(devices)));
            demand.requests.push(req.name.clone());
        }
        if demand.requests.is_empty() {
            return None;
        }
        let coupled = devices
            .constraints
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|c| {
                c.match_attribute
                    .as_ref()
                    .is_some_and(|a| numa_names.contains(a))
            })
            .any(|c| match c.requests.as_deref() {
                None | Some([]) => true,
                Some(names) => {
                    gpus.requests.iter().any(|r| names.contains(r))
                        && demand.requests.iter().any(|r| names.contains(r))
                }
            });
        coupled.then_some(demand)
    }
}

/// Nodes and NUMA nodes where a coupled demand could go, nearest first.
fn candidates(
    cluster: &Cluster,
    pools: &CpuPools,
    gpus: u32,
    cpus: &CpuDemand,
) -> Vec<(Candidate, bool)> {
    let mut all = Vec::new();
    for s in cluster.nodes() {
        let cpu_numa = pools.numa(&s.node);
        let mut numa_ids: Vec<u32> = cpu_numa.keys().copied().collect();
        for g in s.groups(Level::NumaNode) {
            if let Ok(id) = g.key.parse::<u32>()
                && !numa_ids.contains(&id)
            {
                numa_ids.push(id);
            }
        }
        numa_ids.sort_unstable();
        for id in numa_ids {
            let free_gpus = s
                .groups(Level::NumaNode)
                .iter()
                .find(|g| g.key == id.to_string())
                .map_or(0, |g| g.counts.free);
            let counts = cpu_numa.get(&id).copied().unwrap_or_default();
            all.push((
                Candidate {
                    node: s.node.clone(),
                    group: Some(Level::NumaNode.group_name(&id.to_string())),
                    free: free_gpus,
                    free_cpus: Some(counts.free()),
                    largest_free: None,
                },
                cpus.fits(&counts),
            ));
        }
    }
    // Those that fit, then those short of one kind, then of both; more free first.
    let short = |(c, cpus_fit): &(Candidate, bool)| {
        u8::from(c.free < gpus).saturating_add(u8::from(!cpus_fit))
    };
    all.sort_by_key(|e| {
        (
            short(e),
            std::cmp::Reverse(e.0.free),
            std::cmp::Reverse(e.0.free_cpus),
        )
    });
    all
}

/// How many near misses a message names.
const NEAREST: usize = 2;

/// The model's answer for a demand with CPUs coupled to its GPUs on one NUMA node.
pub fn explain_mixed(cluster: &Cluster, pools: &CpuPools, demand: &Demand) -> Explanation {
    // CPUs beside MIG devices only are not judged: the CPU figures are per NUMA
    // node of whole GPUs.
    let Some(cpus) = demand.cpus.as_ref().filter(|_| demand.count > 0) else {
        return super::explain(cluster, demand);
    };
    let all = candidates(cluster, pools, demand.count, cpus);
    let (fits, rest): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(c, cpus_fit)| c.free >= demand.count && *cpus_fit);
    let fits: Vec<Candidate> = fits.into_iter().map(|(c, _)| c).collect();
    let rest: Vec<Candidate> = rest.into_iter().map(|(c, _)| c).collect();
    let nodes_with_enough_free = cluster.nodes_fitting(demand.count, None);
    let mut message = format!("needs {}", demand.describe());
    if !fits.is_empty() {
        let named: Vec<String> = fits.iter().take(3).map(Candidate::describe_free).collect();
        message.push_str(&format!(
            "; fits now on {} NUMA node{} ({}): the scheduler has not retried yet, or \
             something else keeps the pod off them",
            fits.len(),
            plural(fits.len()),
            named.join("; "),
        ));
    } else {
        message.push_str(&format!(
            "; no NUMA node has {} free GPU{} and {}",
            demand.count,
            plural(demand.count as usize),
            cpus.wanted_free(),
        ));
        let near: Vec<String> = rest
            .iter()
            .take(NEAREST)
            .map(Candidate::describe_free)
            .collect();
        if near.is_empty() {
            message.push_str("; no node has GPUs of ours");
        } else {
            message.push_str(&format!("; {}", near.join("; ")));
        }
        if rest.iter().all(|c| c.free_cpus == Some(0))
            && cluster.nodes().all(|s| pools.numa(&s.node).is_empty())
        {
            message.push_str(&format!(
                "; no node publishes CPUs of driver {}",
                pools.driver()
            ));
        }
    }
    push_caveats(&mut message, cluster, demand);
    let best = if fits.is_empty() {
        rest.first().cloned()
    } else {
        None
    };
    Explanation {
        fits,
        nodes_with_enough_free,
        best,
        message,
    }
}
