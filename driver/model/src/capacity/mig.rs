//! Why a claim for MIG devices cannot be allocated: "needs 1 MIG device 7g.80gb; no
//! node can hand them out now; of the 8 GPUs that offer 7g.80gb, 7 are carved into
//! other partitions and 1 allocated whole (node-a NUMA 1: 4 of 4 carved; ...)".
//!
//! With dynamic MIG a profile is free on a GPU only while the placements it needs are;
//! a cluster can have idle memory slices on every GPU and still no room for a 7g.80gb,
//! which needs an uncarved GPU. That is what the message names: fragmentation, not a
//! lack of GPUs.

use super::explain::{Candidate, Explanation, NAMED, fits_now, plural, push_caveats};
use super::{Cluster, Demand, Level, NodeSummary, ProfileGroup};

/// The explanation for a demand of MIG devices only ([`Demand::mig`], no whole GPUs).
/// A constraint on the NUMA node is judged per NUMA node; one on any other level is
/// not judged (the model keeps MIG figures by NUMA node only) and says so.
pub(super) fn explain_mig(cluster: &Cluster, demand: &Demand) -> Explanation {
    let numa = demand.level == Some(Level::NumaNode);
    let mut all: Vec<Candidate> = cluster
        .nodes()
        .flat_map(|s| candidates(s, demand, numa))
        .collect();
    all.sort_by_key(|c| std::cmp::Reverse(c.free));
    let fits: Vec<Candidate> = all
        .iter()
        .filter(|c| covers(cluster, c, demand, numa))
        .cloned()
        .collect();
    let nodes_with_enough_free = cluster
        .nodes()
        .filter(|s| {
            demand
                .mig
                .iter()
                .all(|w| available(s.profile(&w.profile)) >= w.count)
        })
        .count();
    let mut message = format!("needs {}", demand.describe_mig());
    if !fits.is_empty() {
        let named: Vec<String> = fits
            .iter()
            .take(NAMED)
            .map(Candidate::describe_free_mig)
            .collect();
        // The places past the named ones are not counted here, as before.
        let place = if numa { "NUMA node" } else { "node" };
        message.push_str(&fits_now(fits.len(), place, &named, 0));
    } else {
        if numa && nodes_with_enough_free > 0 {
            message.push_str(&format!(
                "; {nodes_with_enough_free} node{} can hand them out, none on one NUMA node",
                plural(nodes_with_enough_free)
            ));
        } else {
            message.push_str("; no node can hand them out now");
        }
        if let (Some(b), [_]) = (all.first(), demand.mig.as_slice()) {
            message.push_str(&format!("; most: {} ({})", b.free, b.describe()));
        }
        for w in &demand.mig {
            message.push_str(&format!("; {}", why_not(cluster, &w.profile)));
        }
    }
    if let Some(l) = demand.level.filter(|l| *l != Level::NumaNode) {
        message.push_str(&format!(
            " (not checked: MIG devices on {}; judged per node)",
            l.one()
        ));
    }
    if demand.cpus.is_some() {
        message.push_str(" (not checked: the CPUs beside the MIG devices)");
    }
    push_caveats(&mut message, cluster, demand);
    Explanation {
        best: if fits.is_empty() {
            all.first().cloned()
        } else {
            None
        },
        fits,
        nodes_with_enough_free,
        message,
    }
}

/// Devices of the profile that the groups can still hand out.
fn available<'a>(groups: impl Iterator<Item = &'a ProfileGroup>) -> u32 {
    groups.map(|g| g.available).fold(0, u32::saturating_add)
}

/// The places of one node for the demand: the node, or each of its NUMA nodes; `free`
/// is what they can hand out of the demand's first profile.
fn candidates(s: &NodeSummary, demand: &Demand, numa: bool) -> Vec<Candidate> {
    let Some(first) = demand.mig.first() else {
        return Vec::new();
    };
    if !numa {
        let free = available(s.profile(&first.profile));
        return (free > 0)
            .then(|| Candidate {
                node: s.node.clone(),
                group: None,
                free,
                free_cpus: None,
                largest_free: None,
            })
            .into_iter()
            .collect();
    }
    s.profile(&first.profile)
        .filter(|g| g.available > 0)
        .filter_map(|g| {
            Some(Candidate {
                node: s.node.clone(),
                group: Some(Level::NumaNode.group_name(g.numa_node.as_deref()?)),
                free: g.available,
                free_cpus: None,
                largest_free: None,
            })
        })
        .collect()
}

/// Whether the place can hand out every profile of the demand.
fn covers(cluster: &Cluster, c: &Candidate, demand: &Demand, numa: bool) -> bool {
    let Some(s) = cluster.node(&c.node) else {
        return false;
    };
    demand.mig.iter().all(|w| {
        let groups = s.profile(&w.profile).filter(|g| {
            !numa
                || g.numa_node
                    .as_deref()
                    .is_some_and(|k| c.group.as_deref() == Some(&Level::NumaNode.group_name(k)))
        });
        available(groups) >= w.count
    })
}

/// Why no more devices of `profile` can be had: what the GPUs that offer it are
/// doing, the most carved places first.
fn why_not(cluster: &Cluster, profile: &str) -> String {
    let mut groups: Vec<(String, &ProfileGroup)> = cluster
        .nodes()
        .flat_map(|s| {
            s.profile(profile).map(move |g| {
                let place = match &g.numa_node {
                    Some(k) => format!("{} {}", s.node, Level::NumaNode.group_name(k)),
                    None => s.node.clone(),
                };
                (place, g)
            })
        })
        .filter(|(_, g)| g.gpus > 0)
        .collect();
    if groups.is_empty() {
        return format!("no node offers {profile}");
    }
    let sum = |f: fn(&ProfileGroup) -> u32| {
        groups
            .iter()
            .map(|(_, g)| f(g))
            .fold(0, u32::saturating_add)
    };
    let (gpus, carved, whole) = (
        sum(|g| g.gpus),
        sum(|g| g.carved),
        sum(|g| g.whole_allocated),
    );
    groups.retain(|(_, g)| g.carved > 0 || g.whole_allocated > 0);
    groups.sort_by_key(|(_, g)| std::cmp::Reverse((g.carved, g.whole_allocated)));
    let mut lead = format!(
        "of the {gpus} GPU{} that offer {profile}, {carved} {} carved into other partitions",
        plural(gpus as usize),
        if carved == 1 { "is" } else { "are" },
    );
    if whole > 0 {
        lead.push_str(&format!(" and {whole} allocated whole"));
    }
    if groups.is_empty() {
        return lead;
    }
    let named: Vec<String> = groups
        .iter()
        .take(NAMED)
        .map(|(place, g)| {
            let mut what = Vec::new();
            if g.carved > 0 {
                what.push(format!("{} of {} carved", g.carved, g.gpus));
            }
            if g.whole_allocated > 0 {
                what.push(format!(
                    "{} of {} allocated whole",
                    g.whole_allocated, g.gpus
                ));
            }
            format!("{place}: {}", what.join(", "))
        })
        .collect();
    let more = groups.len().saturating_sub(NAMED);
    format!(
        "{lead} ({}{})",
        named.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    )
}
