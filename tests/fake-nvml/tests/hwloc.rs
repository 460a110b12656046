//! The rendered XML, read back through the real hwloc (via hwlocality),
//! places every GPU where its profile says and carries the SLIT.

use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::types::ObjectType;
use hwlocality::topology::builder::TypeFilter;
use topodra_fake_nvml::hwloc_xml::render;
use topodra_fake_nvml::profile::{NumaKind, parse_cpu_list};
use topodra_fake_nvml::{BusId, Profile, builtin_names};

fn load(p: &Profile) -> Topology {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("topo.xml");
    std::fs::write(&path, render(p)).expect("write");
    Topology::builder()
        .from_xml_file(&path)
        .expect("xml input")
        .with_io_type_filter(TypeFilter::KeepAll)
        .expect("io filter")
        .build()
        .expect("hwloc loads the rendered XML")
}

fn numa_os_indices(t: &Topology) -> Vec<usize> {
    let mut v: Vec<usize> = t
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(TopologyObject::os_index)
        .collect();
    v.sort_unstable();
    v
}

fn info<'a>(obj: &'a TopologyObject, name: &str) -> Option<&'a str> {
    obj.infos()
        .iter()
        .find(|i| i.name().to_str() == Ok(name))
        .and_then(|i| i.value().to_str().ok())
}

fn check(name: &str) {
    let p = Profile::builtin(name).expect("builtin");
    let t = load(&p);

    let mut want: Vec<usize> = p.numa_nodes.iter().map(|n| n.os_index as usize).collect();
    want.sort_unstable();
    assert_eq!(numa_os_indices(&t), want, "{name}: NUMA nodes");

    let cpus: usize = p
        .numa_nodes
        .iter()
        .map(|n| parse_cpu_list(&n.cpus).expect("cpus").len())
        .sum();
    assert_eq!(
        t.objects_with_type(ObjectType::PU).count(),
        cpus,
        "{name}: PUs"
    );

    for n in t.objects_with_type(ObjectType::NUMANode) {
        let os = n.os_index().expect("numa os index");
        let node = p.numa_node(os as u32).expect("profile node");
        let subtype = n.subtype().and_then(|s| s.to_str().ok());
        assert_eq!(
            subtype == Some("GPUMemory"),
            node.kind == NumaKind::GpuMemory,
            "{name}: NUMA {os} subtype"
        );
    }

    for g in &p.gpus {
        let found = t
            .pci_device_by_bus_id_string(&g.bus_id)
            .expect("bus id syntax");
        if g.hwloc_hidden {
            assert!(found.is_none(), "{name}: {} should be absent", g.bus_id);
            continue;
        }
        let pci = found.unwrap_or_else(|| panic!("{name}: no PCI device {}", g.bus_id));
        let loc = p
            .pci_location(BusId::parse(&g.bus_id).expect("bus id"))
            .expect("location");
        let anc = pci.first_non_io_ancestor().expect("non-I/O ancestor");
        assert!(
            matches!(anc.object_type(), ObjectType::Package | ObjectType::Group),
            "{name}: {} hangs under {:?}",
            g.bus_id,
            anc.object_type()
        );
        let nodeset = anc.nodeset().expect("nodeset");
        for n in &loc.numa_nodes {
            assert!(
                nodeset.is_set(*n as usize),
                "{name}: GPU {} locality {nodeset} lacks NUMA {n}",
                g.bus_id
            );
        }
        let pkg = anc
            .ancestors()
            .chain(std::iter::once(anc))
            .find(|o| o.object_type() == ObjectType::Package)
            .and_then(TopologyObject::os_index);
        assert_eq!(
            pkg,
            Some(loc.package as usize),
            "{name}: {} package",
            g.bus_id
        );

        let nvml = pci
            .io_children()
            .find(|c| c.subtype().and_then(|s| s.to_str().ok()) == Some("NVML"));
        if g.nvml_hidden {
            assert!(nvml.is_none(), "{name}: {} has an NVML osdev", g.bus_id);
        } else {
            let nvml = nvml.unwrap_or_else(|| panic!("{name}: {} has no NVML osdev", g.bus_id));
            assert_eq!(
                nvml.name().and_then(|s| s.to_str().ok()),
                Some(format!("nvml{}", g.index).as_str())
            );
            assert_eq!(info(nvml, "NVIDIAUUID"), Some(g.uuid.as_str()));
        }
    }

    let dists = t.distances(None).expect("distances");
    if p.numa_nodes.len() < 2 {
        return;
    }
    let d = dists
        .iter()
        .find(|d| {
            d.objects()
                .all(|o| o.is_some_and(|o| o.object_type() == ObjectType::NUMANode))
        })
        .unwrap_or_else(|| panic!("{name}: no NUMA distance matrix"));
    for ((a, b), v) in d.object_distances() {
        let (Some(a), Some(b)) = (a, b) else {
            panic!("{name}: distance matrix with missing objects");
        };
        let pos = |o: &TopologyObject| {
            p.numa_nodes
                .iter()
                .position(|n| Some(n.os_index as usize) == o.os_index())
                .expect("node in profile")
        };
        assert_eq!(p.distances[pos(a)][pos(b)], v, "{name}: distance");
    }
}

#[test]
fn dgx_h100() {
    check("dgx-h100");
}

#[test]
fn dgx_a100() {
    check("dgx-a100");
}

#[test]
fn l40s_pcie() {
    check("l40s-pcie");
}

#[test]
fn snc4_xeon() {
    check("snc4-xeon");
}

#[test]
fn gb200() {
    check("gb200");
}

#[test]
fn dgx_a100_mig() {
    check("dgx-a100-mig");
}

#[test]
fn hgx_h100_placeholder() {
    check("hgx-h100-placeholder");
}

#[test]
fn lost_gpu() {
    check("lost-gpu");
}

#[test]
fn small_profiles() {
    for name in ["empty", "init-failure", "mismatch"] {
        check(name);
    }
}

#[test]
fn every_builtin_is_covered() {
    assert_eq!(builtin_names().len(), 12);
}

/// On the NPS4 box, each GPU hangs under the Group of its documented node.
#[test]
fn dgx_a100_gpu_numa_affinity() {
    let p = Profile::builtin("dgx-a100").expect("builtin");
    let t = load(&p);
    let expect = [3, 3, 1, 1, 7, 7, 5, 5];
    for (g, want) in p.gpus.iter().zip(expect) {
        let pci = t
            .pci_device_by_bus_id_string(&g.bus_id)
            .expect("syntax")
            .expect("present");
        let anc = pci.first_non_io_ancestor().expect("ancestor");
        assert_eq!(anc.object_type(), ObjectType::Group);
        let nodes: Vec<usize> = anc
            .nodeset()
            .expect("nodeset")
            .iter_set()
            .map(usize::from)
            .collect();
        assert_eq!(nodes, vec![want], "GPU {}", g.bus_id);
    }
}
