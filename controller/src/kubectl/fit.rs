//! `kubectl topodra fit`: where a claim for some GPUs, aligned at a level or anywhere
//! on a node, would fit now.

use serde::Serialize;
use topodra_model::capacity::{Cluster, Demand, Explanation, Level, MigWant, explain};

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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Fit {
    pub(crate) count: u32,
    pub(crate) align: Option<Level>,
    /// MIG devices of this profile instead of whole GPUs; `free` then counts the
    /// devices of the profile a place can still hand out together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) profile: Option<String>,
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
        fits,
        nodes: cluster.nodes().count(),
        explanation: explain(cluster, &mig_demand(profile, count, align)),
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
                    })
                    .collect(),
                None => (s.gpus.free >= count)
                    .then(|| Place {
                        node: s.node.clone(),
                        group: None,
                        free: s.gpus.free,
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
        fits,
        nodes: cluster.nodes().count(),
        explanation: explain(cluster, &demand(count, align)),
    }
}

pub(crate) fn text(f: &Fit) -> String {
    let what = match &f.profile {
        Some(p) => mig_demand(p, f.count, f.align).describe(),
        None => demand(f.count, f.align).describe(),
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
    let mut t = match f.align {
        Some(l) => Table::new(["NODE", header(l), "FREE"]),
        None => Table::new(["NODE", "FREE"]),
    };
    for p in &f.fits {
        let mut row = vec![p.node.clone()];
        row.extend(p.group.clone());
        row.push(p.free.to_string());
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
    fn the_json_document_has_places_and_the_explanation() {
        golden(
            "fit.json",
            &json(&fit(&two_dgx(), 2, Some(Level::NumaNode))),
        );
    }
}
