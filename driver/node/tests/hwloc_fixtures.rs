//! Discovery against real machines' hwloc exports in `../shared/fixtures/hwloc/`.
//!
//! The expected GPU-to-NUMA mapping is read from the XML independently (with a plain
//! XML parser, not hwloc), so a mistake in how we drive hwloc cannot hide itself.

// clippy.toml allows unwrap in #[test] functions only; this crate's helpers are tests too.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use topodra_model::{IdList, PciAddress};
use topodra_node::discovery::{HwlocSource, TopologySource, assemble};

fn fixtures_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/hwloc");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "skipping: {} does not exist (real-machine hwloc fixtures live outside the repository)",
            dir.display()
        );
        None
    }
}

fn fixture_files() -> Vec<PathBuf> {
    let Some(dir) = fixtures_dir() else {
        return vec![];
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    files.sort();
    files
}

/// An hwloc bitmap string (`0x00000303,0x03030000,,0x03030303`: 32-bit words, most
/// significant first, empty words are zero) as a set of indexes.
fn parse_bitmap(s: &str) -> IdList {
    let words: Vec<&str> = s.split(',').collect();
    let mut set = IdList::new();
    for (i, word) in words.iter().rev().enumerate() {
        let hex = word.trim_start_matches("0x");
        if hex.is_empty() || hex == "f...f" {
            continue;
        }
        let bits = u32::from_str_radix(hex, 16).unwrap();
        for b in 0..32 {
            if bits & (1 << b) != 0 {
                set.insert(i as u32 * 32 + b);
            }
        }
    }
    set
}

/// NVIDIA display-class PCI functions and the nodeset of their first non-I/O ancestor.
fn expected_gpu_numa(xml: &str) -> BTreeMap<PciAddress, IdList> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(xml, options).unwrap();
    let mut out = BTreeMap::new();
    for node in doc
        .descendants()
        .filter(|n| n.attribute("type") == Some("PCIDev"))
    {
        let pci_type = node.attribute("pci_type").unwrap_or_default();
        // "0302 [10de:1db1] [10de:1212] a1": class, then [vendor:device].
        let class = &pci_type[..2];
        let vendor = pci_type.get(6..10).unwrap_or_default();
        if class != "03" || vendor != "10de" {
            continue;
        }
        let addr: PciAddress = node.attribute("pci_busid").unwrap().parse().unwrap();
        let locality = node
            .ancestors()
            .skip(1)
            .find(|a| {
                a.is_element()
                    && !matches!(a.attribute("type"), Some("Bridge" | "PCIDev" | "OSDev"))
            })
            .unwrap();
        out.insert(addr, parse_bitmap(locality.attribute("nodeset").unwrap()));
    }
    out
}

#[test]
fn every_fixture_maps_gpus_to_the_numa_nodes_the_xml_says() {
    for path in fixture_files() {
        let xml = std::fs::read_to_string(&path).unwrap();
        let expected = expected_gpu_numa(&xml);
        let topo = HwlocSource::from_xml(&path).topology().unwrap();
        let got: BTreeMap<PciAddress, IdList> = topo
            .gpus
            .iter()
            .map(|g| (g.pci_bus_id, g.locality_numa_nodes.clone()))
            .collect();
        assert_eq!(got, expected, "{}", path.display());
        assert!(!got.is_empty(), "{} has NVIDIA GPUs", path.display());

        // Without NVML the inventory lists exactly those GPUs, each with its one NUMA node.
        let inv = assemble(None, topo).unwrap();
        for gpu in &inv.gpus {
            let want = &expected[&gpu.pci_bus_id];
            if want.len() == 1 {
                assert_eq!(
                    gpu.numa_node,
                    want.first(),
                    "{} {}",
                    path.display(),
                    gpu.pci_bus_id
                );
                assert_eq!(gpu.same_socket_numa_nodes.first().copied(), want.first());
            }
            assert!(
                gpu.pcie_root.is_some(),
                "{} {} has a root",
                path.display(),
                gpu.pci_bus_id
            );
        }
    }
}

fn fixture(name: &str) -> Option<PathBuf> {
    let path = fixtures_dir()?.join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipping: {} is missing", path.display());
        None
    }
}

#[test]
fn g4dn_metal_has_four_t4_per_socket() {
    let Some(path) = fixture("g4dnmetal.xml") else {
        return;
    };
    let inv = assemble(None, HwlocSource::from_xml(&path).topology().unwrap()).unwrap();
    assert_eq!(inv.gpus.len(), 8);
    let per_socket = |s| inv.gpus.iter().filter(|g| g.socket == Some(s)).count();
    assert_eq!((per_socket(0), per_socket(1)), (4, 4));
    for gpu in &inv.gpus {
        assert_eq!(gpu.numa_node, gpu.socket, "one NUMA node per socket");
        assert!(!gpu.local_cpus.is_empty());
    }
    let d = inv.distances.as_ref().expect("SLIT present");
    assert!(d.get(0, 1).unwrap() > d.get(0, 0).unwrap());
}

#[test]
fn lassen_keeps_sparse_numa_ids() {
    let Some(path) = fixture("coral-lassen.xml") else {
        return;
    };
    let inv = assemble(None, HwlocSource::from_xml(&path).topology().unwrap()).unwrap();
    let nodes: Vec<u32> = inv
        .numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| n.id)
        .collect();
    assert_eq!(nodes, vec![0, 8]);
    let gpu_nodes: Vec<Option<u32>> = inv.gpus.iter().map(|g| g.numa_node).collect();
    assert_eq!(gpu_nodes, vec![Some(0), Some(0), Some(8), Some(8)]);
}

#[test]
fn gpus_behind_bridge_chains_get_their_root_complex() {
    let Some(path) = fixture("power8gpudistances.xml") else {
        return;
    };
    let topo = HwlocSource::from_xml(&path).topology().unwrap();
    assert_eq!(topo.gpus.len(), 4);
    for gpu in &topo.gpus {
        let root = gpu.pcie_root.unwrap();
        assert_eq!(
            root.domain, gpu.pci_bus_id.domain,
            "root shares the GPU's domain"
        );
        assert!(
            !gpu.upstream_bridges.is_empty(),
            "{} sits behind bridges",
            gpu.pci_bus_id
        );
    }
}
