//! Why a claim cannot be allocated, in topology terms.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Cluster, Demand, NodeSummary};

/// A node (and group, for an aligned demand) with free GPUs for a demand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub node: String,
    /// "NUMA 1"; `None` for a demand without alignment.
    pub group: Option<String>,
    /// Free GPUs.
    pub free: u32,
    /// Free CPUs of the CPU driver in the group, for a demand that couples them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_cpus: Option<u64>,
    /// For shares of shared GPUs (`free` then counts the shares the place can
    /// take): the most left of each capacity on one GPU there, by capacity name.
    #[serde(rename = "largestFree", skip_serializing_if = "Option::is_none")]
    pub largest_free: Option<BTreeMap<String, u64>>,
}

impl Candidate {
    pub(super) fn describe(&self) -> String {
        match &self.group {
            Some(g) => format!("{}, {g}", self.node),
            None => self.node.clone(),
        }
    }

    /// "node-a NUMA 1 can hand out 2".
    pub(super) fn describe_free_mig(&self) -> String {
        format!("{} can hand out {}", self.describe(), self.free)
    }

    /// "node-a NUMA 1 has 4 GPUs and 12 CPUs free".
    pub(super) fn describe_free(&self) -> String {
        let place = match &self.group {
            Some(g) => format!("{} {g}", self.node),
            None => self.node.clone(),
        };
        let gpus = format!("{} GPU{}", self.free, plural(self.free as usize));
        match self.free_cpus {
            Some(c) => format!(
                "{place} has {gpus} and {c} CPU{} free",
                plural(usize::try_from(c).unwrap_or(usize::MAX))
            ),
            None => format!("{place} has {gpus} free"),
        }
    }
}

/// The model's answer for one demand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// Where the demand fits now, best first (most free), by node name on a tie.
    pub fits: Vec<Candidate>,
    /// Nodes with at least the demanded number of free GPUs, aligned or not.
    pub nodes_with_enough_free: usize,
    /// The largest free set at the demand's level (or node), when no node fits.
    pub best: Option<Candidate>,
    /// One sentence; the Event message and `kubectl topodra explain` print it.
    pub message: String,
}

pub fn explain(cluster: &Cluster, demand: &Demand) -> Explanation {
    if demand.shares_only() {
        return super::shares::explain_shares(cluster, demand);
    }
    if demand.count == 0 && !demand.mig.is_empty() {
        return super::mig::explain_mig(cluster, demand);
    }
    let level = demand.level;
    let candidate = |s: &NodeSummary| match level {
        Some(l) => s.largest_aligned(l).map(|g| Candidate {
            node: s.node.clone(),
            group: Some(l.group_name(&g.key)),
            free: g.counts.free,
            free_cpus: None,
            largest_free: None,
        }),
        None => (s.gpus.free > 0).then(|| Candidate {
            node: s.node.clone(),
            group: None,
            free: s.gpus.free,
            free_cpus: None,
            largest_free: None,
        }),
    };
    let mut all: Vec<Candidate> = cluster.nodes().filter_map(candidate).collect();
    // Stable: equal free sets stay in node-name order.
    all.sort_by_key(|c| std::cmp::Reverse(c.free));
    let fits: Vec<Candidate> = all
        .iter()
        .filter(|c| c.free >= demand.count)
        .cloned()
        .collect();
    let nodes_with_enough_free = cluster.nodes_fitting(demand.count, None);
    let best = if fits.is_empty() {
        all.first().cloned()
    } else {
        None
    };

    let mut message = format!("needs {}", demand.describe());
    if !fits.is_empty() {
        let named: Vec<String> = fits.iter().take(NAMED).map(Candidate::describe).collect();
        let more = fits.len().saturating_sub(NAMED);
        message.push_str(&fits_now(fits.len(), "node", &named, more));
    } else {
        let free_sets = if demand.count == 1 {
            "a free GPU"
        } else {
            "free GPUs"
        };
        match (level, nodes_with_enough_free) {
            (Some(l), n) if n > 0 => message.push_str(&format!(
                "; {n} node{} {} {} {free_sets}, none on {}",
                plural(n),
                if n == 1 { "has" } else { "have" },
                demand.count,
                l.one()
            )),
            _ => message.push_str(&format!("; no node has {} {free_sets}", demand.count)),
        }
        match (&best, level) {
            (Some(b), Some(_)) => message.push_str(&format!(
                "; largest aligned free set: {} ({})",
                b.free,
                b.describe()
            )),
            (Some(b), None) => message.push_str(&format!("; most free: {} ({})", b.free, b.node)),
            (None, _) => message.push_str("; no GPU is free"),
        }
    }
    push_caveats(&mut message, cluster, demand);
    Explanation {
        fits,
        nodes_with_enough_free,
        best,
        message,
    }
}

/// What every message ends with: the unhealthy GPUs, and what the model left out.
pub(super) fn push_caveats(message: &mut String, cluster: &Cluster, demand: &Demand) {
    let unhealthy = cluster.totals().unhealthy;
    if unhealthy > 0 {
        message.push_str(&format!(
            "; {unhealthy} GPU{} unhealthy or tainted",
            plural(unhealthy as usize)
        ));
    }
    let mut unjudged = demand.unjudged.clone();
    if demand.count > 0 && !demand.mig.is_empty() {
        unjudged.push(format!("{} beside the GPUs", demand.describe_mig()));
    }
    if !demand.shares.is_empty() && !demand.shares_only() {
        let beside = if demand.count > 0 {
            "the GPUs"
        } else {
            "the MIG devices"
        };
        unjudged.push(format!("{} beside {beside}", demand.describe_shares()));
    }
    if !unjudged.is_empty() {
        message.push_str(&format!(" (not checked: {})", unjudged.join(", ")));
    }
}

/// How many places and groups a message names; the rest are counted.
pub(super) const NAMED: usize = 3;

/// What a message says of a demand that fits now on `total` places (`place`,
/// `node` or `NUMA node`): the `named` ones, `more` counted, and why the pod may
/// still wait.
pub(super) fn fits_now(total: usize, place: &str, named: &[String], more: usize) -> String {
    format!(
        "; fits now on {total} {place}{} ({}{}): the scheduler has not retried yet, or something \
         else keeps the pod off them (node selector or affinity, node taints, device \
         selectors, its other claims)",
        plural(total),
        named.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        },
    )
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
