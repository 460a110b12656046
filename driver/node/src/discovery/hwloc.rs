//! NUMA, socket and PCIe topology from hwloc, through `hwlocality` and the system's
//! libhwloc: from the live machine or from an XML export (`lstopo --of xml`).

use std::path::{Path, PathBuf};

use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::{ObjectAttributes, PCIDeviceAttributes};
use hwlocality::object::distance::DistancesKind;
use hwlocality::object::types::{BridgeType, ObjectType};
use hwlocality::topology::builder::{BuildFlags, TypeFilter};

use super::{DiscoveryError, HostTopology, PciGpu, TopologySource};
use topodra_model::IdList;
use topodra_model::inventory::{DistanceMatrix, NumaKind, NumaNode};
use topodra_model::{PciAddress, PcieRoot};

/// PCI vendor id of NVIDIA.
pub(crate) const NVIDIA_VENDOR: u16 = 0x10de;

/// Whether a PCI function is an NVIDIA GPU: display class (0x03xx: VGA 0300, 3D
/// controller 0302). NVSwitches (bridge class 0680) and HDMI audio (0403) are not.
pub(crate) fn is_nvidia_gpu(vendor: u16, class: u16) -> bool {
    vendor == NVIDIA_VENDOR && class >> 8 == 0x03
}

#[derive(Debug, Clone)]
enum Input {
    Live,
    Xml(PathBuf),
}

/// Reads topology with hwloc.
#[derive(Debug, Clone)]
pub struct HwlocSource {
    input: Input,
}

impl HwlocSource {
    pub(crate) fn live() -> Self {
        Self { input: Input::Live }
    }

    pub fn from_xml(path: impl Into<PathBuf>) -> Self {
        Self {
            input: Input::Xml(path.into()),
        }
    }

    fn load(&self) -> Result<Topology, DiscoveryError> {
        // The plugin runs in a pod whose cgroup allows a few CPUs; without
        // INCLUDE_DISALLOWED hwloc would hide the rest of the machine, and with it the
        // locality of most GPUs. Exports taken inside such a pod need the same.
        let builder = Topology::builder()
            .with_flags(BuildFlags::INCLUDE_DISALLOWED)
            .map_err(|e| DiscoveryError::Hwloc(e.into()))?
            .with_io_type_filter(TypeFilter::KeepAll)
            .map_err(|e| DiscoveryError::Hwloc(e.into()))?;
        match &self.input {
            Input::Live => builder.build().map_err(|e| DiscoveryError::Hwloc(e.into())),
            Input::Xml(path) => {
                let xml = read_topology_xml(path)?;
                let err = |reason: String| DiscoveryError::HwlocXml {
                    path: path.clone(),
                    reason,
                };
                builder
                    .from_xml(&xml)
                    .map_err(|e| err(format!("hwloc rejected it: {e}")))?
                    .build()
                    .map_err(|e| err(format!("hwloc rejected it: {e}")))
            }
        }
    }
}

/// Reads an XML topology and checks it is one before handing it to hwloc, whose own
/// message for a non-XML file is a bare "Invalid argument".
fn read_topology_xml(path: &Path) -> Result<String, DiscoveryError> {
    let err = |reason: String| DiscoveryError::HwlocXml {
        path: path.to_owned(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot be read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| err("is not UTF-8 text, so not XML".into()))?;
    let body = text.trim_start_matches('\u{feff}').trim_start();
    if !body.starts_with('<') {
        return Err(err("is not an XML document".into()));
    }
    if !body.contains("<topology") {
        return Err(err(
            "is XML but not an hwloc topology (no <topology> element); export one with `lstopo --of xml`"
                .into(),
        ));
    }
    Ok(text)
}

impl TopologySource for HwlocSource {
    fn topology(&self) -> Result<HostTopology, DiscoveryError> {
        let topology = self.load()?;
        Ok(extract(&topology))
    }
}

fn ids<'a>(set: impl IntoIterator<Item = hwlocality::bitmap::BitmapIndex> + 'a) -> IdList {
    set.into_iter()
        .filter_map(|i| u32::try_from(usize::from(i)).ok())
        .collect()
}

fn os_index(obj: &TopologyObject) -> Option<u32> {
    obj.os_index().and_then(|i| u32::try_from(i).ok())
}

fn package_of(obj: &TopologyObject) -> Option<u32> {
    std::iter::once(obj)
        .chain(obj.ancestors())
        .find(|a| a.object_type() == ObjectType::Package)
        .and_then(os_index)
}

fn pci_address(pci: &PCIDeviceAttributes) -> PciAddress {
    PciAddress::new(
        u32::from(pci.domain()),
        pci.bus_id(),
        pci.bus_device(),
        pci.function(),
    )
}

fn extract(topology: &Topology) -> HostTopology {
    let mut warnings = Vec::new();
    let numa_nodes: Vec<NumaNode> = topology
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|obj| {
            let id = os_index(obj)?;
            let gpu_memory = obj
                .subtype()
                .is_some_and(|s| s.to_string_lossy().eq_ignore_ascii_case("GPUMemory"));
            // hwloc gives a memory object the cpuset of the object it hangs off, so a
            // GPU-memory node "has" its package's CPUs there. The kernel says it owns
            // none (empty cpulist), and so do we.
            let cpus = if gpu_memory {
                IdList::new()
            } else {
                obj.cpuset().map(|c| ids(c.iter_set())).unwrap_or_default()
            };
            let kind = match (cpus.is_empty(), gpu_memory) {
                (_, true) => NumaKind::GpuMemory,
                (true, false) => NumaKind::CpuLess,
                (false, false) => NumaKind::Cpu,
            };
            let memory_bytes = match obj.attributes() {
                Some(ObjectAttributes::NUMANode(n)) => n.local_memory().map_or(0, |m| m.get()),
                _ => 0,
            };
            Some(NumaNode {
                id,
                socket: package_of(obj),
                cpus,
                memory_bytes,
                kind,
            })
        })
        .collect();

    let distances = numa_distances(topology, &mut warnings);

    let gpus = topology
        .objects_with_type(ObjectType::PCIDevice)
        .filter_map(|obj| match obj.attributes() {
            Some(ObjectAttributes::PCIDevice(pci))
                if is_nvidia_gpu(pci.vendor_id(), pci.class_id()) =>
            {
                Some(pci_gpu(obj, pci))
            }
            _ => None,
        })
        .collect();

    HostTopology {
        source: "hwloc".to_owned(),
        numa_nodes,
        distances,
        gpus,
        warnings,
    }
}

fn pci_gpu(obj: &TopologyObject, pci: &PCIDeviceAttributes) -> PciGpu {
    let locality = obj.first_non_io_ancestor();
    let mut upstream_bridges = Vec::new();
    let mut pcie_root = None;
    for ancestor in obj.ancestors() {
        let Some(ObjectAttributes::Bridge(bridge)) = ancestor.attributes() else {
            continue;
        };
        match bridge.upstream_type() {
            BridgeType::PCI => {
                if let Some(hwlocality::object::attributes::UpstreamAttributes::PCI(up)) =
                    bridge.upstream_attributes()
                {
                    upstream_bridges.push(pci_address(up));
                }
            }
            BridgeType::Host => {
                if let Some(hwlocality::object::attributes::DownstreamAttributes::PCI(down)) =
                    bridge.downstream_attributes()
                {
                    pcie_root = Some(PcieRoot {
                        domain: u32::from(down.domain()),
                        bus: down.secondary_bus(),
                    });
                }
                break;
            }
            _ => {}
        }
    }
    PciGpu {
        pci_bus_id: pci_address(pci),
        locality_numa_nodes: locality
            .and_then(|l| l.nodeset())
            .map(|n| ids(n.iter_set()))
            .unwrap_or_default(),
        socket: locality.and_then(package_of),
        local_cpus: locality
            .and_then(|l| l.cpuset())
            .map(|c| ids(c.iter_set()))
            .unwrap_or_default(),
        pcie_root,
        upstream_bridges,
    }
}

/// The NUMA latency matrix the OS reported (ACPI SLIT), if hwloc has one.
fn numa_distances(topology: &Topology, warnings: &mut Vec<String>) -> Option<DistanceMatrix> {
    let matrices = match topology
        .distances_with_type(Some(DistancesKind::MEANS_LATENCY), ObjectType::NUMANode)
    {
        Ok(m) => m,
        Err(e) => {
            warnings.push(format!("hwloc has no NUMA distances: {e}"));
            return None;
        }
    };
    let matrix = matrices.first()?;
    let nodes: Option<Vec<u32>> = matrix.objects().map(|o| o.and_then(os_index)).collect();
    DistanceMatrix::new(nodes?, matrix.distances().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::assemble;

    /// A one-package, one-NUMA-node machine with no PCI devices.
    const NO_GPUS: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6"/>
      </object>
    </object>
  </object>
</topology>
"#;

    fn load(content: &[u8]) -> Result<HostTopology, DiscoveryError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topo.xml");
        std::fs::write(&path, content).unwrap();
        HwlocSource::from_xml(&path).topology()
    }

    #[test]
    fn a_machine_without_gpus_loads_and_names_none() {
        let topo = load(NO_GPUS.as_bytes()).unwrap();
        assert_eq!(topo.numa_nodes.len(), 1);
        assert_eq!(topo.numa_nodes[0].memory_bytes, 1 << 30);
        assert_eq!(topo.numa_nodes[0].cpus.to_string(), "0-1");
        assert!(topo.gpus.is_empty());
        let err = assemble(None, topo).unwrap_err();
        assert!(err.to_string().contains("names no NVIDIA GPUs"), "{err}");
    }

    #[test]
    fn non_xml_is_rejected_before_hwloc() {
        for (content, want) in [
            (&b"GPU0 NUMA 0\n"[..], "is not an XML document"),
            (&b"\xff\xfe\x00binary"[..], "is not UTF-8"),
            (
                &b"<?xml version=\"1.0\"?><html></html>"[..],
                "not an hwloc topology",
            ),
        ] {
            let err = load(content).unwrap_err();
            assert!(matches!(err, DiscoveryError::HwlocXml { .. }));
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[test]
    fn truncated_topology_is_a_clear_error() {
        let err = load(&NO_GPUS.as_bytes()[..NO_GPUS.len() / 2]).unwrap_err();
        assert!(err.to_string().contains("hwloc rejected it"), "{err}");
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = HwlocSource::from_xml("/nonexistent/topo.xml")
            .topology()
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/topo.xml"), "{err}");
        assert!(err.to_string().contains("cannot be read"), "{err}");
    }

    #[test]
    fn only_nvidia_display_functions_are_gpus() {
        assert!(is_nvidia_gpu(0x10de, 0x0302));
        assert!(is_nvidia_gpu(0x10de, 0x0300));
        assert!(!is_nvidia_gpu(0x10de, 0x0680), "NVSwitch");
        assert!(!is_nvidia_gpu(0x10de, 0x0403), "HDMI audio");
        assert!(!is_nvidia_gpu(0x15b3, 0x0302));
    }
}
