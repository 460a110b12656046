//! Renders a profile as an hwloc 2.x XML topology, the same shape hwloc's
//! Linux + NVML backends would export on that machine, so that code reading
//! topology through hwloc sees exactly what the fake NVML claims.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::profile::{
    BusId, NumaKind, PciNode, Profile, bus_range, parse_cpu_list, parse_root_bus,
};

/// hwloc's `HWLOC_OBJ_OSDEV_GPU`.
const OSDEV_GPU: u32 = 1;
/// hwloc groups created to hold a NUMA node that matches no other object
/// (the sub-NUMA clusters) use the "memory" group kind.
const GROUP_KIND_MEMORY: u32 = 1000;
/// `HWLOC_DISTANCES_KIND_FROM_OS | HWLOC_DISTANCES_KIND_MEANS_LATENCY`: SLIT.
const DISTANCES_KIND_OS_LATENCY: u32 = 5;

/// hwloc bitmap string: 32-bit hex words, most significant first.
fn bitmap(set: &BTreeSet<u32>) -> String {
    let Some(&max) = set.iter().next_back() else {
        return "0x0".to_owned();
    };
    let mut words = vec![0u32; max as usize / 32 + 1];
    for &b in set {
        words[b as usize / 32] |= 1 << (b % 32);
    }
    words
        .iter()
        .rev()
        .map(|w| format!("0x{w:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

struct Writer {
    out: String,
    depth: usize,
    next_gp: u64,
}

impl Writer {
    fn gp(&mut self) -> u64 {
        let g = self.next_gp;
        self.next_gp += 1;
        g
    }

    fn line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn open(&mut self, s: &str) {
        self.line(s);
        self.depth += 1;
    }

    fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        self.line("</object>");
    }

    fn info(&mut self, name: &str, value: &str) {
        self.line(&format!(
            "<info name=\"{}\" value=\"{}\"/>",
            escape(name),
            escape(value)
        ));
    }
}

fn sets(cpus: &BTreeSet<u32>, nodes: &BTreeSet<u32>) -> String {
    let c = bitmap(cpus);
    let n = bitmap(nodes);
    format!("cpuset=\"{c}\" complete_cpuset=\"{c}\" nodeset=\"{n}\" complete_nodeset=\"{n}\"")
}

/// Renders the profile. Expects a validated profile; pieces that do not
/// parse are skipped rather than reported.
pub fn render(profile: &Profile) -> String {
    let mut w = Writer {
        out: String::new(),
        depth: 0,
        next_gp: 1,
    };
    w.line("<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    w.line("<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">");
    w.open("<topology version=\"2.0\">");

    let node_cpus = |os: u32| -> BTreeSet<u32> {
        profile
            .numa_node(os)
            .and_then(|n| parse_cpu_list(&n.cpus).ok())
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    let all_cpus: BTreeSet<u32> = profile
        .numa_nodes
        .iter()
        .flat_map(|n| node_cpus(n.os_index))
        .collect();
    let all_nodes: BTreeSet<u32> = profile.numa_nodes.iter().map(|n| n.os_index).collect();

    let gp = w.gp();
    let cs = bitmap(&all_cpus);
    let ns = bitmap(&all_nodes);
    w.open(&format!(
        "<object type=\"Machine\" os_index=\"0\" cpuset=\"{cs}\" complete_cpuset=\"{cs}\" \
         allowed_cpuset=\"{cs}\" nodeset=\"{ns}\" complete_nodeset=\"{ns}\" \
         allowed_nodeset=\"{ns}\" gp_index=\"{gp}\">"
    ));
    w.info("Backend", "topodra-fake-nvml");
    w.info("TopodraProfile", &profile.name);

    let mut packages: Vec<_> = profile.packages.iter().collect();
    packages.sort_by_key(|p| p.os_index);
    let mut core_index = 0u32;
    for pkg in packages {
        let cpu_nodes = profile.cpu_nodes_of_package(pkg.os_index);
        let gpu_mem_nodes: Vec<_> = profile
            .numa_nodes
            .iter()
            .filter(|n| n.package == pkg.os_index && n.kind == NumaKind::GpuMemory)
            .collect();
        let pkg_cpus: BTreeSet<u32> = cpu_nodes
            .iter()
            .flat_map(|n| node_cpus(n.os_index))
            .collect();
        let pkg_nodes: BTreeSet<u32> = profile
            .numa_nodes
            .iter()
            .filter(|n| n.package == pkg.os_index)
            .map(|n| n.os_index)
            .collect();
        // Memory attached at package level is local to everything below it.
        let inherited: BTreeSet<u32> = gpu_mem_nodes.iter().map(|n| n.os_index).collect();
        let grouped = cpu_nodes.len() > 1;

        let gp = w.gp();
        w.open(&format!(
            "<object type=\"Package\" os_index=\"{}\" {} gp_index=\"{gp}\">",
            pkg.os_index,
            sets(&pkg_cpus, &pkg_nodes)
        ));
        if let Some(model) = &pkg.cpu_model {
            w.info("CPUModel", model);
        }
        let mut mem_nodes: Vec<_> = gpu_mem_nodes.clone();
        if !grouped {
            mem_nodes.extend(cpu_nodes.iter().copied());
        }
        mem_nodes.sort_by_key(|n| n.os_index);
        for n in mem_nodes {
            let (cpus, subtype) = match n.kind {
                NumaKind::Cpu => (node_cpus(n.os_index), ""),
                // hwloc gives a CPU-less node the locality of its closest CPUs.
                NumaKind::GpuMemory => (pkg_cpus.clone(), " subtype=\"GPUMemory\""),
            };
            numa_object(&mut w, n.os_index, &cpus, n.memory_gib, subtype);
        }

        for node in &cpu_nodes {
            let cpus = node_cpus(node.os_index);
            let mut local: BTreeSet<u32> = inherited.clone();
            local.insert(node.os_index);
            if grouped {
                let gp = w.gp();
                w.open(&format!(
                    "<object type=\"Group\" {} gp_index=\"{gp}\" kind=\"{GROUP_KIND_MEMORY}\" \
                     subkind=\"0\" dont_merge=\"0\">",
                    sets(&cpus, &local)
                ));
                numa_object(&mut w, node.os_index, &cpus, node.memory_gib, "");
            }
            let list: Vec<u32> = cpus.iter().copied().collect();
            let tpc = profile.threads_per_core.max(1) as usize;
            let ncores = list.len() / tpc;
            for k in 0..ncores {
                let pus: BTreeSet<u32> = (0..tpc).map(|t| list[k + t * ncores]).collect();
                let gp = w.gp();
                w.open(&format!(
                    "<object type=\"Core\" os_index=\"{core_index}\" {} gp_index=\"{gp}\">",
                    sets(&pus, &local)
                ));
                core_index += 1;
                for &pu in &pus {
                    let gp = w.gp();
                    let one: BTreeSet<u32> = [pu].into();
                    w.line(&format!(
                        "<object type=\"PU\" os_index=\"{pu}\" {} gp_index=\"{gp}\"/>",
                        sets(&one, &local)
                    ));
                }
                w.close();
            }
            if grouped {
                io_for(&mut w, profile, |hb_node, _| hb_node == Some(node.os_index));
                w.close();
            }
        }
        let pkg_id = pkg.os_index;
        io_for(&mut w, profile, |hb_node, hb_pkg| {
            hb_pkg == Some(pkg_id)
                || (!grouped && hb_node.is_some_and(|n| cpu_nodes.iter().any(|c| c.os_index == n)))
        });
        w.close();
    }
    w.close();

    render_distances(&mut w, profile);
    w.depth = 0;
    w.line("</topology>");
    w.out
}

fn numa_object(w: &mut Writer, os: u32, cpus: &BTreeSet<u32>, gib: u64, subtype: &str) {
    let gp = w.gp();
    let me: BTreeSet<u32> = [os].into();
    let bytes = gib.saturating_mul(1 << 30);
    w.line(&format!(
        "<object type=\"NUMANode\" os_index=\"{os}\"{subtype} {} gp_index=\"{gp}\" \
         local_memory=\"{bytes}\"/>",
        sets(cpus, &me)
    ));
}

/// Writes the host bridges selected by `pick(numa_node, package)`.
fn io_for(w: &mut Writer, profile: &Profile, pick: impl Fn(Option<u32>, Option<u32>) -> bool) {
    let mut hbs: Vec<_> = profile
        .pci
        .iter()
        .filter(|hb| pick(hb.numa_node, hb.package))
        .filter_map(|hb| parse_root_bus(&hb.bus).ok().map(|r| (r, hb)))
        .collect();
    hbs.sort_by_key(|(r, _)| *r);
    for ((domain, bus), hb) in hbs {
        let sub = bus_range(&hb.children).map_or(bus, |(_, s)| s);
        let gp = w.gp();
        w.open(&format!(
            "<object type=\"Bridge\" gp_index=\"{gp}\" bridge_type=\"0-1\" depth=\"0\" \
             bridge_pci=\"{domain:04x}:[{bus:02x}-{sub:02x}]\">"
        ));
        pci_children(w, profile, &hb.children, 1);
        w.close();
    }
}

fn sorted_children(children: &[PciNode]) -> Vec<(BusId, &PciNode)> {
    let mut v: Vec<(BusId, &PciNode)> = children
        .iter()
        .filter_map(|c| {
            let s = match c {
                PciNode::Bridge(b) => &b.bus_id,
                PciNode::Gpu(s) => s,
                PciNode::Device(d) => &d.bus_id,
            };
            BusId::parse(s).ok().map(|id| (id, c))
        })
        .collect();
    v.sort_by_key(|(id, _)| *id);
    v
}

fn pci_children(w: &mut Writer, profile: &Profile, children: &[PciNode], depth: u32) {
    for (id, node) in sorted_children(children) {
        match node {
            PciNode::Bridge(b) => {
                let (sec, sub) = bus_range(&b.children).unwrap_or((id.bus, id.bus));
                let gp = w.gp();
                w.open(&format!(
                    "<object type=\"Bridge\" gp_index=\"{gp}\" bridge_type=\"1-1\" \
                     depth=\"{depth}\" bridge_pci=\"{:04x}:[{sec:02x}-{sub:02x}]\" \
                     pci_busid=\"{id}\" pci_type=\"0604 [{:04x}:{:04x}] [0000:0000] 00\" \
                     pci_link_speed=\"0.000000\">",
                    id.domain, b.vendor, b.device_id
                ));
                pci_children(w, profile, &b.children, depth + 1);
                w.close();
            }
            PciNode::Device(d) => {
                let gp = w.gp();
                let pci_type = format!(
                    "{:04x} [{:04x}:{:04x}] [{:04x}:{:04x}] {:02x}",
                    d.class, d.vendor, d.device_id, d.subvendor, d.subdevice, d.revision
                );
                match &d.name {
                    Some(name) => {
                        w.open(&format!(
                            "<object type=\"PCIDev\" gp_index=\"{gp}\" pci_busid=\"{id}\" \
                             pci_type=\"{pci_type}\" pci_link_speed=\"0.000000\">"
                        ));
                        w.info("PCIDevice", name);
                        w.close();
                    }
                    None => w.line(&format!(
                        "<object type=\"PCIDev\" gp_index=\"{gp}\" pci_busid=\"{id}\" \
                         pci_type=\"{pci_type}\" pci_link_speed=\"0.000000\"/>"
                    )),
                }
            }
            PciNode::Gpu(_) => {
                let Some(gpu) = profile.gpu_by_bus_id(id) else {
                    continue;
                };
                if gpu.hwloc_hidden {
                    continue;
                }
                let gp = w.gp();
                w.open(&format!(
                    "<object type=\"PCIDev\" gp_index=\"{gp}\" pci_busid=\"{id}\" \
                     pci_type=\"0302 [10de:{:04x}] [{:04x}:{:04x}] {:02x}\" \
                     pci_link_speed=\"0.000000\">",
                    gpu.pci_device_id >> 16,
                    gpu.pci_subsystem_id & 0xffff,
                    gpu.pci_subsystem_id >> 16,
                    gpu.pci_revision
                ));
                w.info("PCIVendor", "NVIDIA Corporation");
                w.info("PCIDevice", &gpu.name);
                // hwloc's NVML backend names devices by NVML index, so a GPU
                // NVML cannot see has a PCI object but no NVML OS device.
                if !gpu.nvml_hidden {
                    let gp = w.gp();
                    w.open(&format!(
                        "<object type=\"OSDev\" gp_index=\"{gp}\" name=\"nvml{}\" \
                         subtype=\"NVML\" osdev_type=\"{OSDEV_GPU}\">",
                        gpu.index
                    ));
                    w.info("Backend", "NVML");
                    w.info("GPUVendor", "NVIDIA Corporation");
                    w.info("GPUModel", &gpu.name);
                    w.info("NVIDIAUUID", &gpu.uuid);
                    w.close();
                }
                w.close();
            }
        }
    }
}

fn render_distances(w: &mut Writer, profile: &Profile) {
    let n = profile.numa_nodes.len();
    // hwloc rejects (with a warning) a matrix of a single node.
    if n < 2 {
        return;
    }
    w.open(&format!(
        "<distances2 type=\"NUMANode\" nbobjs=\"{n}\" kind=\"{DISTANCES_KIND_OS_LATENCY}\" \
         name=\"NUMALatency\" indexing=\"os\">"
    ));
    let mut idx = String::new();
    for node in &profile.numa_nodes {
        let _ = write!(idx, "{} ", node.os_index);
    }
    // hwloc's `length` is the character count of the element's text.
    w.line(&format!(
        "<indexes length=\"{}\">{idx}</indexes>",
        idx.len()
    ));
    let mut vals = String::new();
    for row in &profile.distances {
        for v in row {
            let _ = write!(vals, "{v} ");
        }
    }
    w.line(&format!(
        "<u64values length=\"{}\">{vals}</u64values>",
        vals.len()
    ));
    w.depth = w.depth.saturating_sub(1);
    w.line("</distances2>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps() {
        assert_eq!(bitmap(&BTreeSet::new()), "0x0");
        assert_eq!(bitmap(&[0, 1].into()), "0x00000003");
        assert_eq!(bitmap(&[0, 32, 63].into()), "0x80000001,0x00000001");
    }
}
