//! Why a claim for shares of shared GPUs cannot be allocated: "needs 1 time-sliced
//! share (50Gi memory); no time-sliced GPU has 50Gi memory free: the most on one is
//! 25Gi (node-a, NUMA 1); of the 16 time-sliced GPUs, 6 hold 12 shares and 2 are
//! allocated whole".
//!
//! A share never spans two GPUs, so the memory free on a node says little: what
//! decides is the most left on one GPU, and what keeps the other GPUs from taking
//! shares (allocated whole, carved, tainted). That is what the message names.

use std::collections::BTreeMap;

use super::consumable::amount_text;
use super::demand::{ShareWant, mode_words};
use super::explain::{Candidate, Explanation, NAMED, fits_now, plural, push_caveats};
use super::{Cluster, Demand, Level, NodeSummary, SharedGroup};

/// The explanation for a demand of shares only ([`Demand::shares_only`]). A
/// constraint on the NUMA node is judged per NUMA node; one on any other level is not
/// judged (the model keeps shared figures by NUMA node only) and says so.
pub(super) fn explain_shares(cluster: &Cluster, demand: &Demand) -> Explanation {
    let numa = demand.level == Some(Level::NumaNode);
    let mut all: Vec<(Candidate, bool)> = Vec::new();
    if let Some(first) = demand.shares.first() {
        for s in cluster.nodes() {
            for (group, groups) in places(s, numa) {
                if !groups.iter().any(|g| g.serves(first)) {
                    continue;
                }
                let covers = demand.shares.iter().all(|w| takes(&groups, w) >= w.count);
                let candidate = Candidate {
                    node: s.node.clone(),
                    group: group.map(|k| Level::NumaNode.group_name(k)),
                    free: takes(&groups, first),
                    free_cpus: None,
                    largest_free: Some(largest_free(&groups, first)),
                };
                all.push((candidate, covers));
            }
        }
    }
    // Stable: equal places stay in node and NUMA node order.
    let lead = demand.shares.first().map(lead_capacity).unwrap_or_default();
    all.sort_by_key(|(c, _)| {
        let room = c.largest_free.as_ref().and_then(|m| m.get(&lead)).copied();
        (std::cmp::Reverse(c.free), std::cmp::Reverse(room))
    });
    let fits: Vec<Candidate> = all
        .iter()
        .filter(|(_, covers)| *covers)
        .map(|(c, _)| c.clone())
        .collect();
    let nodes_with_enough_free = cluster
        .nodes()
        .filter(|s| {
            let groups: Vec<&SharedGroup> = s.shared.iter().collect();
            demand.shares.iter().all(|w| takes(&groups, w) >= w.count)
        })
        .count();
    let mut message = format!("needs {}", demand.describe());
    if !fits.is_empty() {
        let named: Vec<String> = fits
            .iter()
            .take(NAMED)
            .map(|c| format!("{}: room for {}", c.describe(), c.free))
            .collect();
        let more = fits.len().saturating_sub(NAMED);
        let place = if numa { "NUMA node" } else { "node" };
        message.push_str(&fits_now(fits.len(), place, &named, more));
    } else {
        if numa && nodes_with_enough_free > 0 {
            message.push_str(&format!(
                "; {nodes_with_enough_free} node{} can take {}, none on one NUMA node",
                plural(nodes_with_enough_free),
                if demand
                    .shares
                    .iter()
                    .map(|w| w.count)
                    .fold(0, u32::saturating_add)
                    == 1
                {
                    "it"
                } else {
                    "them"
                }
            ));
        }
        for w in &demand.shares {
            message.push_str(&format!("; {}", short_of(cluster, w, numa)));
        }
    }
    if let Some(l) = demand.level.filter(|l| *l != Level::NumaNode) {
        message.push_str(&format!(
            " (not checked: shares on {}; judged per node)",
            l.one()
        ));
    }
    if demand.cpus.is_some() {
        message.push_str(" (not checked: the CPUs beside the shares)");
    }
    push_caveats(&mut message, cluster, demand);
    Explanation {
        best: if fits.is_empty() {
            all.first().map(|(c, _)| c.clone())
        } else {
            None
        },
        fits,
        nodes_with_enough_free,
        message,
    }
}

/// The places of one node: the node itself, or each of its NUMA nodes (groups
/// without one are left out of those), with their shared groups.
fn places(s: &NodeSummary, numa: bool) -> Vec<(Option<&str>, Vec<&SharedGroup>)> {
    if !numa {
        return vec![(None, s.shared.iter().collect())];
    }
    let mut out: Vec<(Option<&str>, Vec<&SharedGroup>)> = Vec::new();
    for g in &s.shared {
        let Some(key) = g.numa_node.as_deref() else {
            continue;
        };
        match out.iter_mut().find(|(k, _)| *k == Some(key)) {
            Some((_, groups)) => groups.push(g),
            None => out.push((Some(key), vec![g])),
        }
    }
    out
}

/// Shares of `want` that the groups can take together.
fn takes(groups: &[&SharedGroup], want: &ShareWant) -> u32 {
    groups
        .iter()
        .map(|g| g.takes(want))
        .fold(0, u32::saturating_add)
}

/// The most left of each capacity on one GPU of the groups that serve `want`.
fn largest_free(groups: &[&SharedGroup], want: &ShareWant) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for g in groups.iter().filter(|g| g.serves(want)) {
        for (name, f) in &g.capacity {
            let e = out.entry(name.clone()).or_default();
            *e = (*e).max(f.largest_free);
        }
    }
    out
}

/// The capacity a message leads with: memory, unless the share names only others.
pub(crate) fn lead_capacity(want: &ShareWant) -> String {
    match want.capacity.keys().next() {
        Some(first) if !want.capacity.contains_key("memory") => first.clone(),
        _ => "memory".to_owned(),
    }
}

/// Why no place can take the shares of `want`: the most one GPU has left, and what
/// the GPUs of its mode are doing.
fn short_of(cluster: &Cluster, want: &ShareWant, numa: bool) -> String {
    let mode = mode_words(want.sharing.as_deref());
    let groups: Vec<(&NodeSummary, &SharedGroup)> = cluster
        .nodes()
        .flat_map(|s| s.shared.iter().map(move |g| (s, g)))
        .filter(|(_, g)| g.serves(want))
        .collect();
    if groups.is_empty() {
        return format!("no node offers {mode} GPUs");
    }
    let short = if groups.iter().any(|(_, g)| g.takes(want) > 0) {
        // Each share fits on some GPU; not this many in one place.
        let most = cluster
            .nodes()
            .flat_map(|s| {
                places(s, numa).into_iter().map(move |(k, gs)| {
                    let place = match k {
                        Some(k) => format!("{}, {}", s.node, Level::NumaNode.group_name(k)),
                        None => s.node.clone(),
                    };
                    (takes(&gs, want), place)
                })
            })
            .fold(None, |best: Option<(u32, String)>, (n, place)| match best {
                Some(b) if b.0 >= n => Some(b),
                _ => Some((n, place)),
            });
        let mut text = format!(
            "no {} has room for {} such shares",
            if numa { "NUMA node" } else { "node" },
            want.count
        );
        if let Some((n, place)) = most {
            text.push_str(&format!("; most: {n} ({place})"));
        }
        text
    } else {
        let mut text = if want.capacity.is_empty() {
            format!("no {mode} GPU has room for a share of the default size")
        } else {
            format!("no {mode} GPU has {} free", want.sizes().join(" and "))
        };
        let capacity = short_capacity(&groups, want);
        if let Some((room, place)) = most_left(&groups, &capacity) {
            text.push_str(&format!(
                ": the most {capacity} free on one is {} ({place})",
                amount_text(&capacity, room)
            ));
        }
        text
    };
    format!("{short}; {}", what_they_do(&groups, &mode))
}

/// The most left of `capacity` on one usable GPU of `groups`, and where that GPU is;
/// `None` when no GPU of them can take a share now.
fn most_left(groups: &[(&NodeSummary, &SharedGroup)], capacity: &str) -> Option<(u64, String)> {
    let (s, g, room) = groups
        .iter()
        .filter(|(_, g)| !g.rooms.is_empty())
        .map(|(s, g)| (*s, *g, g.largest_free(capacity)))
        .fold(
            None,
            |best: Option<(&NodeSummary, &SharedGroup, u64)>, c| match best {
                Some(b) if b.2 >= c.2 => Some(b),
                _ => Some(c),
            },
        )?;
    let place = match &g.numa_node {
        Some(k) => format!("{}, {}", s.node, Level::NumaNode.group_name(k)),
        None => s.node.clone(),
    };
    Some((room, place))
}

/// The capacity that keeps a share of `want` off every GPU: the first (memory
/// first) that no usable GPU has enough of by itself; memory when each is there
/// somewhere but never together.
fn short_capacity(groups: &[(&NodeSummary, &SharedGroup)], want: &ShareWant) -> String {
    let mut names: Vec<&String> = groups.iter().flat_map(|(_, g)| g.capacity.keys()).collect();
    names.sort_by_key(|n| (n.as_str() != "memory", n.as_str()));
    names.dedup();
    let alone = |name: &str| ShareWant {
        sharing: want.sharing.clone(),
        count: 1,
        capacity: want
            .capacity
            .iter()
            .filter(|(n, _)| n.as_str() == name)
            .map(|(n, v)| (n.clone(), *v))
            .collect(),
    };
    names
        .into_iter()
        .find(|name| {
            // Only this capacity asked for, the others at zero: does any GPU have it?
            let only = alone(name);
            !groups
                .iter()
                .flat_map(|(_, g)| g.rooms.iter())
                .any(|r| r.fits_one(&only, name))
        })
        .cloned()
        .unwrap_or_else(|| "memory".to_owned())
}

/// "of the 16 time-sliced GPUs, 6 hold 12 shares and 2 are allocated whole".
fn what_they_do(groups: &[(&NodeSummary, &SharedGroup)], mode: &str) -> String {
    let sum = |f: fn(&SharedGroup) -> u32| {
        groups
            .iter()
            .map(|(_, g)| f(g))
            .fold(0, u32::saturating_add)
    };
    let gpus = sum(|g| g.gpus);
    let are = |n: u32| if n == 1 { "is" } else { "are" };
    let mut parts = Vec::new();
    let in_use = sum(|g| g.in_use);
    if in_use > 0 {
        let shares = sum(|g| g.shares);
        parts.push(format!(
            "{in_use} hold{} {shares} share{}",
            if in_use == 1 { "s" } else { "" },
            plural(shares as usize)
        ));
    }
    for (n, what) in [
        (sum(|g| g.whole_allocated), "allocated whole"),
        (sum(|g| g.blocked), "carved or shared another way"),
        (sum(|g| g.unhealthy), "tainted"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {} {what}", are(n)));
        }
    }
    let did = match parts.as_slice() {
        [] => "none is in use".to_owned(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    };
    format!("of the {gpus} {mode} GPU{}, {did}", plural(gpus as usize))
}
