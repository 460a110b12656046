//! `kubectl topodra fit`: where a claim for some GPUs (MIG devices of a profile,
//! shares of a shared GPU), aligned at a level or anywhere on a node, would fit now.

use std::collections::BTreeMap;

use serde::Serialize;
use topodra_model::capacity::{
    Cluster, Demand, Explanation, Level, MigWant, ShareWant, SharedGroup, amount_text, explain,
};

use crate::kubectl::nodes::header;
use crate::kubectl::table::Table;
use crate::kubectl::terminal::escape;

/// One place with enough free GPUs: a node, and for an aligned demand one group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Place {
    pub(crate) node: String,
    /// The group's attribute value (`"1"` for NUMA node 1); `None` when not aligned.
    pub(crate) group: Option<String>,
    pub(crate) free: u32,
    /// For shares: the most left of each capacity on one GPU of the place.
    #[serde(rename = "largestFree", skip_serializing_if = "Option::is_none")]
    pub(crate) largest_free: Option<BTreeMap<String, u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Fit {
    pub(crate) count: u32,
    pub(crate) align: Option<Level>,
    /// MIG devices of this profile instead of whole GPUs; `free` then counts the
    /// devices of the profile a place can still hand out together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) profile: Option<String>,
    /// Shares of shared GPUs of this mode and size instead of whole GPUs; `free`
    /// then counts the shares a place can take, several to a GPU where they fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) share: Option<ShareWant>,
    /// Every place that fits, most free first, then by node and group.
    pub(crate) fits: Vec<Place>,
    pub(crate) nodes: usize,
    /// The model's answer, as the Events word it.
    pub(crate) explanation: Explanation,
}

pub(crate) fn demand(count: u32, align: Option<Level>) -> Demand {
    Demand {
        count,
        level: align,
        requests: Vec::new(),
        unjudged: Vec::new(),
        cpus: None,
        mig: Vec::new(),
        shares: Vec::new(),
    }
}

/// The demand of `count` MIG devices of `profile`.
fn mig_demand(profile: &str, count: u32, align: Option<Level>) -> Demand {
    let mut d = demand(0, align);
    d.mig.push(MigWant {
        profile: profile.to_owned(),
        count,
    });
    d
}

/// Where `count` MIG devices of `profile` fit now, on one NUMA node (`align`) or
/// anywhere on a node. MIG figures are kept by NUMA node only: other levels are
/// refused.
pub(crate) fn fit_mig(
    cluster: &Cluster,
    profile: &str,
    count: u32,
    align: Option<Level>,
) -> Result<Fit, String> {
    if align.is_some_and(|l| l != Level::NumaNode) {
        return Err("--profile aligns on numaNode only".to_owned());
    }
    let mut fits: Vec<Place> = cluster
        .nodes()
        .flat_map(|s| -> Vec<Place> {
            if align.is_some() {
                s.profile(profile)
                    .filter(|g| g.available >= count)
                    .filter_map(|g| {
                        Some(Place {
                            node: s.node.clone(),
                            group: Some(g.numa_node.clone()?),
                            free: g.available,
                            largest_free: None,
                        })
                    })
                    .collect()
            } else {
                let free = s
                    .profile(profile)
                    .map(|g| g.available)
                    .fold(0, u32::saturating_add);
                (free >= count && free > 0)
                    .then(|| Place {
                        node: s.node.clone(),
                        group: None,
                        free,
                        largest_free: None,
                    })
                    .into_iter()
                    .collect()
            }
        })
        .collect();
    fits.sort_by_key(|p| std::cmp::Reverse(p.free));
    Ok(Fit {
        count,
        align,
        profile: Some(profile.to_owned()),
        share: None,
        fits,
        nodes: cluster.nodes().count(),
        explanation: explain(cluster, &mig_demand(profile, count, align)),
    })
}

/// The demand of the shares of `want`.
fn share_demand(want: &ShareWant, align: Option<Level>) -> Demand {
    let mut d = demand(0, align);
    d.shares.push(want.clone());
    d
}

/// Where the shares of `want` fit now, on one NUMA node (`align`) or anywhere on a
/// node. Shared figures are kept by NUMA node only: other levels are refused.
pub(crate) fn fit_share(
    cluster: &Cluster,
    want: &ShareWant,
    align: Option<Level>,
) -> Result<Fit, String> {
    if align.is_some_and(|l| l != Level::NumaNode) {
        return Err("a share aligns on numaNode only".to_owned());
    }
    let mut fits = Vec::new();
    for s in cluster.nodes() {
        // The node's groups of the mode, by NUMA node when aligned.
        let mut places: BTreeMap<Option<&str>, Vec<&SharedGroup>> = BTreeMap::new();
        for g in s.shared.iter().filter(|g| g.serves(want)) {
            let key = if align.is_some() {
                match g.numa_node.as_deref() {
                    Some(k) => Some(k),
                    None => continue,
                }
            } else {
                None
            };
            places.entry(key).or_default().push(g);
        }
        let mut of_node: Vec<Place> = places
            .into_iter()
            .filter_map(|(key, groups)| {
                let free = groups
                    .iter()
                    .map(|g| g.takes(want))
                    .fold(0, u32::saturating_add);
                let mut largest: BTreeMap<String, u64> = BTreeMap::new();
                for (name, f) in groups.iter().flat_map(|g| &g.capacity) {
                    let e = largest.entry(name.clone()).or_default();
                    *e = (*e).max(f.largest_free);
                }
                (free >= want.count && free > 0).then(|| Place {
                    node: s.node.clone(),
                    group: key.map(str::to_owned),
                    free,
                    largest_free: Some(largest),
                })
            })
            .collect();
        // NUMA nodes in numeric order, as the groups are everywhere else.
        of_node.sort_by_key(|p| p.group.as_deref().and_then(|g| g.parse::<u64>().ok()));
        fits.extend(of_node);
    }
    fits.sort_by_key(|p| std::cmp::Reverse(p.free));
    Ok(Fit {
        count: want.count,
        align,
        profile: None,
        share: Some(want.clone()),
        fits,
        nodes: cluster.nodes().count(),
        explanation: explain(cluster, &share_demand(want, align)),
    })
}

pub(crate) fn fit(cluster: &Cluster, count: u32, align: Option<Level>) -> Fit {
    let mut fits: Vec<Place> = cluster
        .nodes()
        .flat_map(|s| -> Vec<Place> {
            match align {
                Some(l) => s
                    .groups(l)
                    .iter()
                    .filter(|g| g.counts.free >= count)
                    .map(|g| Place {
                        node: s.node.clone(),
                        group: Some(g.key.clone()),
                        free: g.counts.free,
                        largest_free: None,
                    })
                    .collect(),
                None => (s.gpus.free >= count)
                    .then(|| Place {
                        node: s.node.clone(),
                        group: None,
                        free: s.gpus.free,
                        largest_free: None,
                    })
                    .into_iter()
                    .collect(),
            }
        })
        .collect();
    // Stable: equal places stay in node and group order.
    fits.sort_by_key(|p| std::cmp::Reverse(p.free));
    Fit {
        count,
        align,
        profile: None,
        share: None,
        fits,
        nodes: cluster.nodes().count(),
        explanation: explain(cluster, &demand(count, align)),
    }
}

pub(crate) fn text(f: &Fit) -> String {
    let what = match (&f.profile, &f.share) {
        (_, Some(w)) => share_demand(w, f.align).describe(),
        (Some(p), None) => mig_demand(p, f.count, f.align).describe(),
        (None, None) => demand(f.count, f.align).describe(),
    };
    if f.fits.is_empty() {
        return format!("Fits nowhere now: {}\n", escape(&f.explanation.message));
    }
    let mut nodes: Vec<&str> = f.fits.iter().map(|p| p.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let verb = if f.count == 1 { "fits" } else { "fit" };
    let mut out = format!(
        "{what} {verb} now on {} of {} node{}:\n",
        nodes.len(),
        f.nodes,
        if f.nodes == 1 { "" } else { "s" }
    );
    // For shares: how many fit, and the most left of each capacity on one GPU
    // (memory first).
    let mut capacities: Vec<&str> = f
        .fits
        .iter()
        .flat_map(|p| p.largest_free.iter().flat_map(|m| m.keys()))
        .map(String::as_str)
        .collect();
    capacities.sort_by_key(|c| (*c != "memory", *c));
    capacities.dedup();
    let mut head = vec!["NODE".to_owned()];
    head.extend(f.align.map(|l| header(l).to_owned()));
    head.push(if f.share.is_some() { "SHARES" } else { "FREE" }.to_owned());
    head.extend(
        capacities
            .iter()
            .map(|c| format!("LARGEST {}", c.to_uppercase())),
    );
    let mut t = Table::new(head);
    for p in &f.fits {
        let mut row = vec![p.node.clone()];
        row.extend(p.group.clone());
        row.push(p.free.to_string());
        for c in &capacities {
            let v = p.largest_free.as_ref().and_then(|m| m.get(*c));
            row.push(v.map_or_else(|| "-".to_owned(), |v| amount_text(c, *v)));
        }
        t.row(row);
    }
    out.push_str(&t.render());
    out
}

pub(crate) fn json(f: &Fit) -> String {
    let mut text = serde_json::to_string_pretty(f).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubectl::fixtures::{golden, two_dgx};

    #[test]
    fn aligned_sets_are_listed_by_group() {
        let f = fit(&two_dgx(), 2, Some(Level::NumaNode));
        assert_eq!(
            text(&f),
            "\
2 GPUs on one NUMA node fit now on 2 of 2 nodes:
NODE         NUMA   FREE
dgx-h100-b   1      3
dgx-h100-a   1      2
dgx-h100-b   0      2
"
        );
    }

    #[test]
    fn without_alignment_nodes_are_listed() {
        let f = fit(&two_dgx(), 4, None);
        assert_eq!(
            text(&f),
            "\
4 GPUs fit now on 1 of 2 nodes:
NODE         FREE
dgx-h100-b   5
"
        );
    }

    #[test]
    fn nowhere_gives_the_models_reason() {
        let f = fit(&two_dgx(), 8, Some(Level::NumaNode));
        assert_eq!(
            text(&f),
            "Fits nowhere now: needs 8 GPUs on one NUMA node; no node has 8 free GPUs; \
             largest aligned free set: 3 (dgx-h100-b, NUMA 1); 1 GPU unhealthy or tainted\n"
        );
        let f = fit(&two_dgx(), 4, Some(Level::PcieRoot));
        assert_eq!(
            text(&f),
            "Fits nowhere now: needs 4 GPUs on one PCIe root; 1 node has 4 free GPUs, none on \
             one PCIe root; largest aligned free set: 1 (dgx-h100-a, PCIe root pci0000:5a); \
             1 GPU unhealthy or tainted\n"
        );
    }

    #[test]
    fn a_profile_fits_where_its_placements_are_free() {
        let c = crate::kubectl::fixtures::carved_dgx();
        let f = fit_mig(&c, "3g.40gb", 2, Some(Level::NumaNode)).unwrap();
        assert_eq!(
            text(&f),
            "\
2 MIG devices 3g.40gb on one NUMA node fit now on 1 of 1 node:
NODE         NUMA   FREE
dgx-h100-m   0      6
dgx-h100-m   1      5
"
        );
        let f = fit_mig(&c, "7g.80gb", 5, None).unwrap();
        assert_eq!(
            text(&f),
            "Fits nowhere now: needs 5 MIG devices 7g.80gb; no node can hand them out now; \
             most: 4 (dgx-h100-m); of the 8 GPUs that offer 7g.80gb, 3 are carved into other \
             partitions and 1 allocated whole (dgx-h100-m NUMA 1: 3 of 4 carved; dgx-h100-m \
             NUMA 0: 1 of 4 allocated whole)\n"
        );
        assert!(fit_mig(&c, "1g.10gb", 1, Some(Level::PcieRoot)).is_err());
    }

    #[test]
    fn a_share_fits_where_one_gpu_has_the_memory() {
        let c = crate::kubectl::fixtures::time_sliced_dgx();
        let want = |memory: Option<u64>, count: u32| ShareWant {
            sharing: Some("TimeSlicing".to_owned()),
            count,
            capacity: memory
                .map(|m| BTreeMap::from([("memory".to_owned(), m << 30)]))
                .unwrap_or_default(),
        };
        let f = fit_share(&c, &want(Some(50), 1), Some(Level::NumaNode)).unwrap();
        assert_eq!(
            text(&f),
            "\
1 time-sliced share (50Gi memory) on one NUMA node fits now on 1 of 1 node:
NODE         NUMA   SHARES   LARGEST MEMORY
dgx-h100-t   0      2        81559Mi
dgx-h100-t   1      1        81559Mi
"
        );
        let f = fit_share(&c, &want(Some(90), 1), None).unwrap();
        assert_eq!(
            text(&f),
            "Fits nowhere now: needs 1 time-sliced share (90Gi memory); no time-sliced GPU \
             has 90Gi memory free: the most memory free on one is 81559Mi (dgx-h100-t, NUMA \
             0); of the 8 time-sliced GPUs, 3 hold 4 shares and 2 are allocated whole\n"
        );
        // The default share is 19Gi: four on each idle GPU, one beside ci-a's 60Gi,
        // two beside the 40Gi of gpu-6 and of gpu-7.
        let f = fit_share(&c, &want(None, 2), None).unwrap();
        assert_eq!(
            text(&f),
            "\
2 time-sliced shares (of the default size) fit now on 1 of 1 node:
NODE         SHARES   LARGEST MEMORY
dgx-h100-t   17       81559Mi
"
        );
        assert!(fit_share(&c, &want(Some(1), 1), Some(Level::Socket)).is_err());
        // The JSON document says what was asked.
        let doc: serde_json::Value = serde_json::from_str(&json(&f)).unwrap();
        assert_eq!(doc["share"]["sharing"], "TimeSlicing");
        assert_eq!(doc["fits"][0]["largestFree"]["memory"], 81559u64 << 20);
    }

    #[test]
    fn the_json_document_has_places_and_the_explanation() {
        golden(
            "fit.json",
            &json(&fit(&two_dgx(), 2, Some(Level::NumaNode))),
        );
    }
}
