//! The human-readable form of an inventory.

use std::io::Write;

use anyhow::Result;
use std::collections::BTreeSet;

use topodra_model::{AllocatableDevice, Gpu, Inventory, Offer};

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn gib(bytes: u64) -> String {
    format!("{:.0}GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn print_rows(out: &mut impl Write, rows: &[Vec<String>]) -> Result<()> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}

/// The row of one GPU's columns, with the device name, product, memory and UUID that
/// are the allocatable device's own.
fn row(
    gpu: &Gpu,
    name: String,
    product: String,
    memory: Option<u64>,
    uuid: Option<&str>,
) -> Vec<String> {
    vec![
        name,
        opt(gpu.index),
        product,
        opt(memory.map(gib)),
        gpu.pci_bus_id.to_string(),
        opt(gpu.pcie_root),
        opt(gpu.numa_node),
        if gpu.same_socket_numa_nodes.is_empty() {
            "-".to_owned()
        } else {
            gpu.same_socket_numa_nodes
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
        opt(gpu.socket),
        opt(gpu.pcie_switch),
        opt(gpu.nvlink_domain.as_deref()),
        if gpu.local_cpus.is_empty() {
            "-".to_owned()
        } else {
            gpu.local_cpus.to_string()
        },
        opt(uuid),
    ]
}

/// A whole GPU is one row; a GPU in MIG mode one row per MIG device; a GPU offered
/// as nothing one row that says why, so the table never hides a GPU.
fn gpu_rows(gpu: &Gpu) -> Vec<Vec<String>> {
    let product = opt(gpu.product_name.as_deref());
    match gpu.offer() {
        Offer::Whole => vec![row(
            gpu,
            gpu.device_name(),
            product,
            gpu.memory_bytes,
            gpu.uuid.as_deref(),
        )],
        Offer::Mig if !gpu.mig_devices.is_empty() => gpu
            .mig_devices
            .iter()
            .map(|m| {
                let dev = AllocatableDevice {
                    gpu: gpu.clone(),
                    mig: Some(m.clone()),
                };
                row(
                    gpu,
                    dev.name(),
                    format!("MIG {}", opt(m.profile.as_deref())),
                    m.memory_bytes,
                    Some(&m.uuid),
                )
            })
            .collect(),
        offer => {
            let why = if offer == Offer::Mig {
                "not offered: MIG mode, no MIG devices"
            } else {
                "not offered: MIG change pending reset"
            };
            let (memory, uuid) = (gpu.memory_bytes, gpu.uuid.as_deref());
            vec![row(gpu, "-".into(), why.into(), memory, uuid)]
        }
    }
}

/// Prints GPUs, then NUMA nodes, each as an aligned table.
pub(crate) fn render(inv: &Inventory, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "Sources: identity={} topology={}  Driver: {}  CUDA: {}",
        opt(inv.sources.identity.as_deref()),
        opt(inv.sources.topology.as_deref()),
        opt(inv.driver_version.as_deref()),
        opt(inv.cuda_driver_version),
    )?;
    writeln!(out)?;
    let mut rows = vec![
        [
            "DEVICE",
            "INDEX",
            "PRODUCT",
            "MEMORY",
            "PCI BUS ID",
            "PCIE ROOT",
            "NUMA",
            "NUMA LIST",
            "SOCKET",
            "PCIE SWITCH",
            "NVLINK",
            "CPUS",
            "UUID",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for gpu in &inv.gpus {
        rows.extend(gpu_rows(gpu));
    }
    if inv.gpus.is_empty() {
        writeln!(out, "No GPUs: the pool is published empty.")?;
    } else {
        print_rows(out, &rows)?;
    }
    let cliques: BTreeSet<&str> = inv
        .gpus
        .iter()
        .filter_map(|g| g.nvlink_clique.as_deref())
        .collect();
    for clique in cliques {
        let members: Vec<String> = inv
            .gpus
            .iter()
            .filter(|g| g.nvlink_clique.as_deref() == Some(clique))
            .map(Gpu::device_name)
            .collect();
        writeln!(out, "NVLink clique {clique}: {}", members.join(", "))?;
    }
    writeln!(out)?;
    let mut rows = vec![
        ["NUMA NODE", "SOCKET", "KIND", "MEMORY", "CPUS", "DISTANCES"]
            .map(String::from)
            .to_vec(),
    ];
    let distance_rows = inv.distances.as_ref().map(|d| d.rows()).unwrap_or_default();
    for node in &inv.numa_nodes {
        rows.push(vec![
            node.id.to_string(),
            opt(node.socket),
            format!("{:?}", node.kind),
            gib(node.memory_bytes),
            if node.cpus.is_empty() {
                "-".to_owned()
            } else {
                node.cpus.to_string()
            },
            distance_rows.get(&node.id).map_or_else(
                || "-".to_owned(),
                |r| r.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
            ),
        ]);
    }
    print_rows(out, &rows)
}
