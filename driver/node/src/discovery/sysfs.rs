//! NUMA and PCIe topology from sysfs, for nodes where hwloc cannot load.
//!
//! Gives less than hwloc (no locality objects, just what the kernel exports) but
//! needs nothing but the kernel. The root is configurable so tests run against a
//! directory tree laid out like `/sys`.

use std::fs;
use std::path::{Path, PathBuf};

use super::hwloc::is_nvidia_gpu;
use super::{DiscoveryError, HostTopology, PciGpu, TopologySource};
use topodra_model::IdList;
use topodra_model::inventory::{DistanceMatrix, NumaKind, NumaNode};
use topodra_model::{PciAddress, PcieRoot};

/// Reads topology from a sysfs tree.
#[derive(Debug, Clone)]
pub(crate) struct SysfsSource {
    root: PathBuf,
}

impl SysfsSource {
    pub(crate) fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn err(&self, path: &Path, reason: impl std::fmt::Display) -> DiscoveryError {
        DiscoveryError::Sysfs {
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }

    fn read(&self, path: &Path) -> Result<String, DiscoveryError> {
        fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .map_err(|e| self.err(path, e))
    }

    fn numa_nodes(&self) -> Result<(Vec<NumaNode>, Option<DistanceMatrix>), DiscoveryError> {
        let dir = self.root.join("devices/system/node");
        let entries = fs::read_dir(&dir).map_err(|e| self.err(&dir, e))?;
        let mut ids: Vec<u32> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
            .collect();
        ids.sort_unstable();
        let mut nodes = Vec::new();
        let mut values = Vec::new();
        for id in &ids {
            let node_dir = dir.join(format!("node{id}"));
            let cpulist = node_dir.join("cpulist");
            let cpus: IdList = self
                .read(&cpulist)?
                .parse()
                .map_err(|e| self.err(&cpulist, e))?;
            let socket = cpus.first().and_then(|cpu| {
                let p = self.root.join(format!(
                    "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
                ));
                self.read(&p).ok()?.parse().ok()
            });
            let memory_bytes = self
                .read(&node_dir.join("meminfo"))
                .ok()
                .and_then(|m| mem_total_bytes(&m))
                .unwrap_or(0);
            let distance = node_dir.join("distance");
            let row: Vec<u64> = self
                .read(&distance)?
                .split_whitespace()
                .map(|d| {
                    d.parse()
                        .map_err(|_| self.err(&distance, "not a list of numbers"))
                })
                .collect::<Result<_, _>>()?;
            values.extend(row);
            nodes.push(NumaNode {
                id: *id,
                socket,
                kind: if cpus.is_empty() {
                    NumaKind::CpuLess
                } else {
                    NumaKind::Cpu
                },
                cpus,
                memory_bytes,
            });
        }
        let distances = DistanceMatrix::new(ids, values);
        Ok((nodes, distances))
    }

    fn gpus(&self, numa_nodes: &[NumaNode]) -> Result<Vec<PciGpu>, DiscoveryError> {
        let dir = self.root.join("bus/pci/devices");
        let entries = fs::read_dir(&dir).map_err(|e| self.err(&dir, e))?;
        let mut gpus = Vec::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let Some(addr) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<PciAddress>().ok())
            else {
                continue;
            };
            let dev = entry.path();
            let hex = |file: &str| {
                self.read(&dev.join(file))
                    .ok()
                    .and_then(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            };
            let (Some(vendor), Some(class)) = (hex("vendor"), hex("class")) else {
                continue;
            };
            // sysfs class is 24 bits: class, subclass, prog-if.
            if !is_nvidia_gpu(vendor as u16, (class >> 8) as u16) {
                continue;
            }
            let numa: Option<u32> = self
                .read(&dev.join("numa_node"))
                .ok()
                .and_then(|v| v.parse::<i64>().ok())
                .and_then(|v| u32::try_from(v).ok());
            let local_cpus: IdList = self
                .read(&dev.join("local_cpulist"))
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_default();
            let locality = match numa {
                Some(n) => IdList::from_iter([n]),
                None => nodes_within(numa_nodes, &local_cpus),
            };
            // The package of the locality, when its nodes share one (hwloc's
            // `package_of` on the same locality).
            let socket = {
                let mut sockets = locality.iter().map(|id| {
                    numa_nodes
                        .iter()
                        .find(|x| x.id == id)
                        .and_then(|n| n.socket)
                });
                match sockets.next() {
                    Some(first) if sockets.all(|s| s == first) => first,
                    _ => None,
                }
            };
            let real = fs::canonicalize(&dev).map_err(|e| self.err(&dev, e))?;
            let (pcie_root, upstream_bridges) = pci_path(&real, addr);
            gpus.push(PciGpu {
                pci_bus_id: addr,
                locality_numa_nodes: locality,
                socket,
                local_cpus,
                pcie_root,
                upstream_bridges,
            });
        }
        gpus.sort_by_key(|g| g.pci_bus_id);
        Ok(gpus)
    }
}

/// The NUMA nodes of a device whose firmware gave no proximity (`numa_node` reads
/// -1: no ACPI `_PXM`, as in many VMs): those whose CPUs all lie within the
/// device's `local_cpulist`, which the kernel then sets to every online CPU. This
/// is the locality hwloc gives the same device (the smallest object covering its
/// local CPUs): on a one-node machine, that node, as `nvidia-smi topo -m` shows
/// for a GPU of a single-node VM; on a larger one, every node, which assembly
/// treats as ambiguous.
fn nodes_within(numa_nodes: &[NumaNode], local_cpus: &IdList) -> IdList {
    numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty() && n.cpus.iter().all(|c| local_cpus.contains(c)))
        .map(|n| n.id)
        .collect()
}

impl TopologySource for SysfsSource {
    fn topology(&self) -> Result<HostTopology, DiscoveryError> {
        let (numa_nodes, distances) = self.numa_nodes()?;
        let gpus = self.gpus(&numa_nodes)?;
        Ok(HostTopology {
            source: "sysfs".to_owned(),
            numa_nodes,
            distances,
            gpus,
            warnings: Vec::new(),
        })
    }
}

/// Splits a resolved device path (`.../pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0`)
/// into its root complex and the bridges above the device, nearest first.
fn pci_path(real: &Path, device: PciAddress) -> (Option<PcieRoot>, Vec<PciAddress>) {
    let mut root = None;
    let mut bridges = Vec::new();
    for comp in real.components() {
        let Some(name) = comp.as_os_str().to_str() else {
            continue;
        };
        if let Ok(r) = name.parse::<PcieRoot>() {
            root = Some(r);
            bridges.clear();
        } else if let Ok(a) = name.parse::<PciAddress>()
            && root.is_some()
            && a != device
        {
            bridges.push(a);
        }
    }
    bridges.reverse();
    (root, bridges)
}

/// `Node 0 MemTotal:       1056540548 kB` → bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.contains("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().rev().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(path: &Path, content: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    /// A two-node machine: a GPU behind a switch on node 1, an NVSwitch and a NIC that
    /// must not be taken for GPUs, and a GPU whose firmware reports no NUMA node.
    fn fake_sysfs(root: &Path) {
        for (node, cpus, dist) in [(0, "0-3", "10 21"), (1, "4-7", "21 10")] {
            let d = root.join(format!("devices/system/node/node{node}"));
            write(&d.join("cpulist"), cpus);
            write(&d.join("distance"), dist);
            write(
                &d.join("meminfo"),
                &format!("Node {node} MemTotal:       1048576 kB\n"),
            );
        }
        for cpu in 0..8 {
            write(
                &root.join(format!(
                    "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
                )),
                &(cpu / 4).to_string(),
            );
        }
        let devices = [
            (
                "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:83:00.0",
                "0x10de",
                "0x030200",
                "1",
                "4-7",
            ),
            (
                "pci0000:80/0000:80:02.0/0000:90:00.0",
                "0x10de",
                "0x068000",
                "1",
                "4-7",
            ),
            (
                "pci0000:00/0000:00:03.0/0000:05:00.0",
                "0x15b3",
                "0x020000",
                "0",
                "0-3",
            ),
            (
                "pci0000:00/0000:00:01.0/0000:01:00.0",
                "0x10de",
                "0x030000",
                "-1",
                "",
            ),
        ];
        for (path, vendor, class, numa, cpus) in devices {
            write_device(root, path, vendor, class, numa, cpus);
        }
    }

    fn write_device(root: &Path, path: &str, vendor: &str, class: &str, numa: &str, cpus: &str) {
        let dev = root.join("devices").join(path);
        write(&dev.join("vendor"), vendor);
        write(&dev.join("class"), class);
        write(&dev.join("numa_node"), numa);
        write(&dev.join("local_cpulist"), cpus);
        let name = path.rsplit('/').next().unwrap();
        let link = root.join("bus/pci/devices").join(name);
        fs::create_dir_all(link.parent().unwrap()).unwrap();
        symlink(format!("../../../devices/{path}"), link).unwrap();
    }

    /// The single-node VM of the real-GPU probe (an H200 passed through to a
    /// 16-CPU guest, tests/fake-nvml/real/h200-vm): the firmware gives no
    /// proximity, so `numa_node` reads -1 and `local_cpulist` every CPU.
    #[test]
    fn unknown_proximity_on_one_node_is_that_node() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let node = root.join("devices/system/node/node0");
        write(&node.join("cpulist"), "0-15");
        write(&node.join("distance"), "10");
        for cpu in 0..16 {
            write(
                &root.join(format!(
                    "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
                )),
                "0",
            );
        }
        write_device(
            root,
            "pci0000:00/0000:00:06.0",
            "0x10de",
            "0x030200",
            "-1",
            "0-15",
        );
        let topo = SysfsSource::new(root).topology().unwrap();
        let gpu = &topo.gpus[0];
        assert_eq!(gpu.locality_numa_nodes.to_string(), "0");
        assert_eq!(gpu.socket, Some(0));
        assert!(gpu.upstream_bridges.is_empty());
    }

    /// On two nodes the same unknown proximity covers both: no single node, and no
    /// socket when the nodes sit on different packages.
    #[test]
    fn unknown_proximity_on_two_nodes_is_both() {
        let dir = tempfile::tempdir().unwrap();
        fake_sysfs(dir.path());
        write_device(
            dir.path(),
            "pci0000:40/0000:40:01.0/0000:41:00.0",
            "0x10de",
            "0x030200",
            "-1",
            "0-7",
        );
        let topo = SysfsSource::new(dir.path()).topology().unwrap();
        let gpu = topo
            .gpus
            .iter()
            .find(|g| g.pci_bus_id.to_string() == "0000:41:00.0")
            .unwrap();
        assert_eq!(gpu.locality_numa_nodes.to_string(), "0-1");
        assert_eq!(gpu.socket, None);
    }

    #[test]
    fn reads_numa_nodes_distances_and_gpus() {
        let dir = tempfile::tempdir().unwrap();
        fake_sysfs(dir.path());
        let topo = SysfsSource::new(dir.path()).topology().unwrap();
        assert_eq!(topo.numa_nodes.len(), 2);
        assert_eq!(topo.numa_nodes[1].socket, Some(1));
        assert_eq!(topo.numa_nodes[1].memory_bytes, 1 << 30);
        assert_eq!(topo.distances.as_ref().unwrap().get(0, 1), Some(21));
        assert_eq!(topo.gpus.len(), 2, "NVSwitch and NIC are not GPUs");

        let behind_switch = &topo.gpus[1];
        assert_eq!(behind_switch.pci_bus_id.to_string(), "0000:83:00.0");
        assert_eq!(behind_switch.pcie_root.unwrap().to_string(), "pci0000:80");
        assert_eq!(behind_switch.locality_numa_nodes.to_string(), "1");
        assert_eq!(behind_switch.socket, Some(1));
        let chain: Vec<String> = behind_switch
            .upstream_bridges
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(chain, ["0000:82:08.0", "0000:81:00.0", "0000:80:01.0"]);

        let no_numa = &topo.gpus[0];
        assert!(no_numa.locality_numa_nodes.is_empty());
        assert_eq!(no_numa.pcie_root.unwrap().to_string(), "pci0000:00");
    }

    #[test]
    fn missing_sysfs_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = SysfsSource::new(dir.path()).topology().unwrap_err();
        assert!(err.to_string().contains("devices/system/node"), "{err}");
    }
}
