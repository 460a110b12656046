//! `kubectl topodra nodes`: every node's GPUs by state and NUMA node, and the largest
//! free sets that one `matchAttribute` constraint could still take.

use std::collections::BTreeMap;

use serde::Serialize;
use topodra_model::capacity::{
    Cluster, Counts, Level, NodeSummary, SET_SIZES, SharedGroup, amount_text,
};

use crate::kubectl::table::Table;

/// How a level is named in column headers.
pub(crate) fn header(level: Level) -> &'static str {
    match level {
        Level::NumaNode => "NUMA",
        Level::Socket => "SOCKET",
        Level::PcieRoot => "PCIE ROOT",
        Level::PcieSwitch => "PCIE SWITCH",
        Level::NvlinkDomain => "NVLINK",
    }
}

/// The set sizes stranding is reported for: those of [`SET_SIZES`] beyond 1.
fn stranding_sizes() -> impl Iterator<Item = u32> {
    SET_SIZES.into_iter().filter(|k| *k > 1)
}

/// The table: a row per node, a row per NUMA node of it, and a `TOTAL` row. `align`
/// is the level of the `LARGEST` column (and of stranding, when `wide`); `wide` adds
/// the largest sets at the other levels, stranding and MIG devices.
pub(crate) fn table(cluster: &Cluster, align: Level, wide: bool) -> String {
    let others: Vec<Level> = Level::ALL.into_iter().filter(|l| *l != align).collect();
    // Only with dynamic MIG: whole GPUs neither allocated nor free, because
    // partitions of them are.
    let carved = cluster.totals().carved() > 0;
    // Only where some node offers GPUs for sharing: whole GPUs neither allocated
    // nor free, because shares of them are.
    let shared = cluster.nodes().any(|s| !s.shared.is_empty());
    let mut head: Vec<String> = ["NODE", "NUMA", "TOTAL", "ALLOCATED", "UNHEALTHY"]
        .map(String::from)
        .to_vec();
    if carved {
        head.push("CARVED".to_owned());
    }
    if shared {
        head.push("SHARED".to_owned());
    }
    head.push("FREE".to_owned());
    head.push(format!("LARGEST {}", header(align)));
    if wide {
        head.extend(others.iter().map(|l| format!("LARGEST {}", header(*l))));
        let sizes: Vec<String> = stranding_sizes().map(|k| k.to_string()).collect();
        head.push(format!("STRANDED {}", sizes.join("/")));
        head.push("MIG FREE/TOTAL".to_owned());
    }
    let mut t = Table::new(head);
    let counts = |c: &Counts| -> Vec<String> {
        let mut v = vec![c.total, c.allocated, c.unhealthy];
        if carved {
            v.push(c.carved());
        }
        if shared {
            v.push(c.shared);
        }
        v.push(c.free);
        v.into_iter().map(|n| n.to_string()).collect()
    };
    for s in cluster.nodes() {
        let mut row = vec![s.node.clone(), "all".to_owned()];
        row.extend(counts(&s.gpus));
        row.push(largest(s, align));
        if wide {
            row.extend(others.iter().map(|l| largest(s, *l)));
            row.push(slashed(stranding_sizes().map(|k| s.stranded(k, align))));
            row.push(mig(&s.mig_devices));
        }
        t.row(row);
        for g in s.groups(Level::NumaNode) {
            let mut row = vec![s.node.clone(), g.key.clone()];
            row.extend(counts(&g.counts));
            row.push("-".to_owned());
            if wide {
                row.extend(others.iter().map(|_| "-".to_owned()));
                row.extend(["-".to_owned(), "-".to_owned()]);
            }
            t.row(row);
        }
    }
    let mut row = vec!["TOTAL".to_owned(), "all".to_owned()];
    row.extend(counts(&cluster.totals()));
    row.push(cluster_largest(cluster, align));
    if wide {
        row.extend(others.iter().map(|l| cluster_largest(cluster, *l)));
        row.push(slashed(cluster.stranded(align).into_values()));
        row.push(mig(&mig_totals(cluster)));
    }
    t.row(row);
    let mut out = t.render();
    if wide {
        out.push_str(&profiles(cluster));
        out.push_str(&sharing(cluster));
    }
    out
}

/// `-o wide`'s table of shared GPUs: per sharing mode and NUMA node, the GPUs that
/// offer it, those that can take another share now, the shares allocated, and what
/// is left of each capacity in all and on the one GPU with the most (a share never
/// spans two GPUs). Empty without shared devices.
fn sharing(cluster: &Cluster) -> String {
    let mut rows: Vec<(&str, &SharedGroup)> = cluster
        .nodes()
        .flat_map(|s| s.shared.iter().map(move |g| (s.node.as_str(), g)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by(|a, b| (a.1.sharing.as_str(), a.0).cmp(&(b.1.sharing.as_str(), b.0)));
    // Memory first, then any other capacity the devices publish (compute).
    let mut capacities: Vec<&str> = rows
        .iter()
        .flat_map(|(_, g)| g.capacity.keys().map(String::as_str))
        .collect();
    capacities.sort_by_key(|c| (*c != "memory", *c));
    capacities.dedup();
    let mut head: Vec<String> = ["SHARING", "NODE", "NUMA", "GPUS", "USABLE", "SHARES"]
        .map(String::from)
        .to_vec();
    for c in &capacities {
        let c = c.to_uppercase();
        head.push(format!("{c} FREE"));
        head.push(format!("LARGEST {c}"));
    }
    let mut t = Table::new(head);
    for (node, g) in rows {
        let mut row = vec![
            g.sharing.clone(),
            node.to_owned(),
            g.numa_node.clone().unwrap_or_else(|| "-".to_owned()),
            g.gpus.to_string(),
            g.usable.to_string(),
            g.shares.to_string(),
        ];
        for c in &capacities {
            match g.capacity.get(*c) {
                Some(f) => {
                    row.push(amount_text(c, f.free));
                    row.push(amount_text(c, f.largest_free));
                }
                None => row.extend(["-".to_owned(), "-".to_owned()]),
            }
        }
        t.row(row);
    }
    format!("\n{}", t.render())
}

/// `-o wide`'s second table: per MIG profile and NUMA node, the devices of the
/// profile that can still be had together, those allocated, and the GPUs that offer
/// it with how many are carved into other partitions. Empty without MIG devices.
fn profiles(cluster: &Cluster) -> String {
    let mut rows: Vec<(&str, &str, &topodra_model::capacity::ProfileGroup)> = cluster
        .nodes()
        .flat_map(|s| {
            s.profiles
                .iter()
                .map(move |g| (g.profile.as_str(), s.node.as_str(), g))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let mut t = Table::new([
        "MIG PROFILE",
        "NODE",
        "NUMA",
        "AVAILABLE",
        "ALLOCATED",
        "GPUS",
        "CARVED",
    ]);
    for (profile, node, g) in rows {
        t.row(vec![
            profile.to_owned(),
            node.to_owned(),
            g.numa_node.clone().unwrap_or_else(|| "-".to_owned()),
            g.available.to_string(),
            g.allocated.to_string(),
            g.gpus.to_string(),
            g.carved.to_string(),
        ]);
    }
    format!("\n{}", t.render())
}

/// The free GPUs of the node's largest group at `level`; `-` when no GPU of the node
/// carries the level's attribute, so no constraint on it can be met there at all.
fn largest(s: &NodeSummary, level: Level) -> String {
    if s.groups(level).is_empty() {
        "-".to_owned()
    } else {
        s.largest_free(Some(level)).to_string()
    }
}

fn cluster_largest(cluster: &Cluster, level: Level) -> String {
    cluster
        .nodes()
        .filter(|s| !s.groups(level).is_empty())
        .map(|s| s.largest_free(Some(level)))
        .max()
        .map_or_else(|| "-".to_owned(), |n| n.to_string())
}

fn slashed(values: impl Iterator<Item = u32>) -> String {
    values.map(|v| v.to_string()).collect::<Vec<_>>().join("/")
}

fn mig(c: &Counts) -> String {
    if c.total == 0 {
        "-".to_owned()
    } else {
        format!("{}/{}", c.free, c.total)
    }
}

fn mig_totals(cluster: &Cluster) -> Counts {
    cluster.nodes().fold(Counts::default(), |mut sum, s| {
        let m = &s.mig_devices;
        sum.total = sum.total.saturating_add(m.total);
        sum.allocated = sum.allocated.saturating_add(m.allocated);
        sum.unhealthy = sum.unhealthy.saturating_add(m.unhealthy);
        sum.free = sum.free.saturating_add(m.free);
        sum
    })
}

/// The largest free set of one level on a node.
#[derive(Debug, Serialize)]
struct Largest<'a> {
    key: &'a str,
    free: u32,
}

/// Free GPUs stranded at each level, by set size.
type Stranded = BTreeMap<Level, BTreeMap<u32, u32>>;

#[derive(Debug, Serialize)]
struct NodeDoc<'a> {
    #[serde(flatten)]
    summary: &'a NodeSummary,
    /// At every level; `null` when no group of the level has a free GPU.
    largest: BTreeMap<Level, Option<Largest<'a>>>,
    stranded: Stranded,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct TotalDoc {
    nodes: usize,
    gpus: Counts,
    mig_devices: Counts,
    stranded: Stranded,
}

#[derive(Debug, Serialize)]
struct NodesDoc<'a> {
    driver: &'a str,
    nodes: Vec<NodeDoc<'a>>,
    total: TotalDoc,
}

/// The JSON document: every node's summary (counts, groups at every level), its
/// largest free set and stranding at every level, and the cluster's totals. It does
/// not depend on `--align`.
pub(crate) fn json(cluster: &Cluster) -> String {
    let stranded = |f: &dyn Fn(u32, Level) -> u32| -> Stranded {
        Level::ALL
            .into_iter()
            .map(|l| (l, stranding_sizes().map(|k| (k, f(k, l))).collect()))
            .collect()
    };
    let nodes = cluster
        .nodes()
        .map(|s| NodeDoc {
            summary: s,
            largest: Level::ALL
                .into_iter()
                .map(|l| {
                    let g = s.largest_aligned(l).map(|g| Largest {
                        key: &g.key,
                        free: g.counts.free,
                    });
                    (l, g)
                })
                .collect(),
            stranded: stranded(&|k, l| s.stranded(k, l)),
        })
        .collect();
    let doc = NodesDoc {
        driver: cluster.driver(),
        nodes,
        total: TotalDoc {
            nodes: cluster.nodes().count(),
            gpus: cluster.totals(),
            mig_devices: mig_totals(cluster),
            stranded: Level::ALL
                .into_iter()
                .map(|l| (l, cluster.stranded(l)))
                .collect(),
        },
    };
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubectl::fixtures::{DRIVER, add_node, dgx_h100, dgx_h100_mig, golden, two_dgx};

    #[test]
    fn the_table_shows_nodes_numa_nodes_and_the_total() {
        assert_eq!(
            table(&two_dgx(), Level::NumaNode, false),
            "\
NODE         NUMA   TOTAL   ALLOCATED   UNHEALTHY   FREE   LARGEST NUMA
dgx-h100-a   all    8       4           1           3      2
dgx-h100-a   0      4       3           0           1      -
dgx-h100-a   1      4       1           1           2      -
dgx-h100-b   all    8       3           0           5      3
dgx-h100-b   0      4       2           0           2      -
dgx-h100-b   1      4       1           0           3      -
TOTAL        all    16      7           1           8      3
"
        );
    }

    #[test]
    fn wide_adds_the_other_levels_stranding_and_mig() {
        let mut c = two_dgx();
        add_node(&mut c, "dgx-h100-c", &dgx_h100_mig(), &[]);
        assert_eq!(
            table(&c, Level::NumaNode, true),
            "\
NODE         NUMA   TOTAL   ALLOCATED   UNHEALTHY   FREE   LARGEST NUMA   LARGEST SOCKET   LARGEST PCIE ROOT   LARGEST PCIE SWITCH   LARGEST NVLINK   STRANDED 2/4/8   MIG FREE/TOTAL
dgx-h100-a   all    8       4           1           3      2              2                1                   -                     3                1/3/3            -
dgx-h100-a   0      4       3           0           1      -              -                -                   -                     -                -                -
dgx-h100-a   1      4       1           1           2      -              -                -                   -                     -                -                -
dgx-h100-b   all    8       3           0           5      3              3                1                   -                     5                0/5/5            -
dgx-h100-b   0      4       2           0           2      -              -                -                   -                     -                -                -
dgx-h100-b   1      4       1           0           3      -              -                -                   -                     -                -                -
dgx-h100-c   all    7       0           0           7      4              4                1                   -                     7                0/3/7            7/7
dgx-h100-c   0      4       0           0           4      -              -                -                   -                     -                -                -
dgx-h100-c   1      3       0           0           3      -              -                -                   -                     -                -                -
TOTAL        all    23      7           1           15     4              4                1                   -                     7                1/11/15          7/7

MIG PROFILE   NODE         NUMA   AVAILABLE   ALLOCATED   GPUS   CARVED
1g.10gb       dgx-h100-c   1      7           0           1      0
"
        );
    }

    /// With dynamic MIG: a CARVED column for whole GPUs that partitions hold, and
    /// each profile by NUMA node.
    #[test]
    fn carved_gpus_have_a_column_and_profiles_a_table() {
        let c = crate::kubectl::fixtures::carved_dgx();
        assert_eq!(
            table(&c, Level::NumaNode, false),
            "\
NODE         NUMA   TOTAL   ALLOCATED   UNHEALTHY   CARVED   FREE   LARGEST NUMA
dgx-h100-m   all    8       1           0           3        4      3
dgx-h100-m   0      4       1           0           0        3      -
dgx-h100-m   1      4       0           0           3        1      -
TOTAL        all    8       1           0           3        4      3
"
        );
        let t = table(&c, Level::NumaNode, true);
        assert!(
            t.contains("7g.80gb       dgx-h100-m   1      1           0           4      3\n"),
            "{t}"
        );
    }

    /// With time-slicing: a SHARED column for whole GPUs that shares hold, and each
    /// sharing mode by NUMA node with its memory.
    #[test]
    fn shared_gpus_have_a_column_and_their_memory_a_table() {
        let c = crate::kubectl::fixtures::time_sliced_dgx();
        assert_eq!(
            table(&c, Level::NumaNode, false),
            "\
NODE         NUMA   TOTAL   ALLOCATED   UNHEALTHY   SHARED   FREE   LARGEST NUMA
dgx-h100-t   all    8       2           0           3        3      2
dgx-h100-t   0      4       2           0           0        2      -
dgx-h100-t   1      4       0           0           3        1      -
TOTAL        all    8       2           0           3        3      2
"
        );
        let t = table(&c, Level::NumaNode, true);
        let section = t.split("\n\n").nth(1).unwrap_or_default();
        assert_eq!(
            section,
            "\
SHARING       NODE         NUMA   GPUS   USABLE   SHARES   MEMORY FREE   LARGEST MEMORY
TimeSlicing   dgx-h100-t   0      4      2        0        163118Mi      81559Mi
TimeSlicing   dgx-h100-t   1      4      4        4        182876Mi      81559Mi
"
        );
        // Nothing of it where no node shares.
        assert!(!table(&two_dgx(), Level::NumaNode, true).contains("SHARED"));
    }

    #[test]
    fn align_chooses_the_level_of_the_largest_column() {
        let t = table(&two_dgx(), Level::PcieRoot, false);
        assert_eq!(
            t.lines().next().unwrap(),
            "NODE         NUMA   TOTAL   ALLOCATED   UNHEALTHY   FREE   LARGEST PCIE ROOT"
        );
        assert!(t.lines().nth(1).unwrap().ends_with("   1"), "{t}");
    }

    #[test]
    fn an_empty_cluster_has_only_the_total() {
        let c = Cluster::new(DRIVER);
        assert_eq!(
            table(&c, Level::NumaNode, false),
            "\
NODE    NUMA   TOTAL   ALLOCATED   UNHEALTHY   FREE   LARGEST NUMA
TOTAL   all    0       0           0           0      -
"
        );
    }

    #[test]
    fn a_node_name_from_a_slice_cannot_forge_a_row() {
        let mut c = Cluster::new(DRIVER);
        let hostile = "x\nTOTAL        all    99\u{1b}[8m";
        let opts = topodra_model::slice::SliceOptions::new("node-a");
        for mut s in topodra_model::slice::build_slices(&dgx_h100(), &opts).unwrap() {
            s.spec.node_name = Some(hostile.to_owned());
            c.apply_slice(&s);
        }
        let t = table(&c, Level::NumaNode, true);
        assert_eq!(t.lines().count(), 5, "{t}");
        assert_eq!(t.lines().filter(|l| l.starts_with("TOTAL")).count(), 1);
        assert!(!t.contains('\u{1b}'), "{t}");
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .starts_with("x\\nTOTAL        all    99\\u{1b}[8m   all")
        );
        // JSON escapes it by itself.
        assert!(json(&c).contains(r#""node": "x\nTOTAL        all    99\u001b[8m""#));
    }

    #[test]
    fn the_json_document_is_stable() {
        golden("nodes.json", &json(&two_dgx()));
    }
}
